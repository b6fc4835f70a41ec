#!/usr/bin/env python3
"""Writes tests/golden/fixtures/safetensors/python_reference.safetensors with Python's own
safetensors writer (safetensors 0.8.0, torch 2.13.0) for tests/unit/test_io_safetensors.cpp, which
hard-codes the values below. Regenerate (from anywhere):
  .venv/bin/pip install --no-deps safetensors
  .venv/bin/python scripts/golden/make_safetensors_fixture.py
The order of the "__metadata__" keys in the header varies between runs (a Rust HashMap), so the
bytes may differ from the committed file while the content is the same.
"""
import pathlib

import torch
from safetensors.torch import save_file

out = pathlib.Path(__file__).resolve().parents[2] / "tests/golden/fixtures/safetensors"
out.mkdir(parents=True, exist_ok=True)
tensors = {
    "f32": torch.arange(6, dtype=torch.float32).reshape(2, 3) * 0.5 - 1.0,  # -1 .. 1.5
    "bf16": torch.tensor([1.5, -2.0, 0.0078125, 3.0e38], dtype=torch.bfloat16),
    "f16": torch.tensor([[0.25, -65504.0], [6.1035e-05, 1.0]], dtype=torch.float16),
    "f64": torch.tensor(3.141592653589793, dtype=torch.float64),  # 0-d scalar
    "i64": torch.tensor([-(2**40), 0, 2**62], dtype=torch.int64),
    "i32": torch.tensor([-7, 2147483647], dtype=torch.int32),
    "i16": torch.tensor([-32768, 12345], dtype=torch.int16),
    "i8": torch.tensor([-128, 127, 3], dtype=torch.int8),
    "u8": torch.tensor([0, 255, 7], dtype=torch.uint8),
    "bool": torch.tensor([True, False, True], dtype=torch.bool),
    "empty": torch.zeros(0, 3, dtype=torch.float32),
}
path = out / "python_reference.safetensors"
save_file(tensors, str(path), metadata={"format": "pt", "source": "mmpost-fixture"})
for name, t in tensors.items():
    print(name, t.dtype, list(t.shape), t.flatten().tolist())
print(path, path.stat().st_size, "bytes")
