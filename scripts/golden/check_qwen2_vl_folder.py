"""Loads a Qwen2-VL family folder written by mmpost with transformers and checks it.

from_pretrained(FOLDER) must load with no missing, unexpected or mismatched weights; the folder's
preprocessor_config.json must load as Qwen2VLImageProcessorPil; and the model's logits on the
fixture inputs (IO: a tests/golden/fixtures/qwen2*_vl_tiny/io.safetensors) must equal the
fixture's logits within 1e-5 (the weights are the fixture's, so a save that changed any tensor,
name or config field fails). Prints one JSON line; exit 0 on success, 1 on a mismatch.

Run: .venv/bin/python scripts/golden/check_qwen2_vl_folder.py FOLDER IO
"""
import json
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoConfig, Qwen2_5_VLForConditionalGeneration, Qwen2VLForConditionalGeneration
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil


def main(folder, io_file):
    cfg = AutoConfig.from_pretrained(folder)
    cls = Qwen2_5_VLForConditionalGeneration if cfg.model_type == "qwen2_5_vl" else Qwen2VLForConditionalGeneration
    model, info = cls.from_pretrained(folder, output_loading_info=True)
    model.eval()
    problems = {k: v for k, v in info.items() if v}
    proc = Qwen2VLImageProcessorPil.from_pretrained(folder)
    io = load_file(io_file)
    with torch.no_grad():
        logits = model(input_ids=io["input_ids"], attention_mask=io["attention_mask"],
                       pixel_values=io["pixel_values"], image_grid_thw=io["image_grid_thw"],
                       mm_token_type_ids=(io["input_ids"] == cfg.image_token_id).int()).logits.float()
    mask = io["attention_mask"].bool().unsqueeze(-1).expand_as(logits)
    diff = (logits - io["logits"]).abs().masked_select(mask).max().item()
    ok = not problems and diff < 1e-5
    print(json.dumps({"ok": ok, "model_type": cfg.model_type, "max_logit_diff": diff,
                      "loading_problems": {k: list(map(str, v)) for k, v in problems.items()},
                      "processor_patch_size": proc.patch_size}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
