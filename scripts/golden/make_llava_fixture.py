"""Golden fixtures for mmpost's LLaVA model (tests/golden/test_llava_golden.cpp).

Builds tiny random LlavaForConditionalGeneration models (CLIP vision tower + Llama, seed 0) and
writes, under tests/golden/fixtures/:
  llava_tiny/       save_pretrained output (config.json + model.safetensors), untied lm_head
  llava_tiny_tied/  save_pretrained output with tie_word_embeddings=true (no lm_head tensor)
  llava_tiny_hub/   the llava_tiny weights renamed to the hub layout (vision_tower.vision_model.*)
                    and written with safetensors.torch.save_file; asserts transformers loads it
                    to the same model (it has no io.safetensors of its own: same weights)
llava_tiny and llava_tiny_tied hold io.safetensors: input_ids [2, T] (right-padded; sample 0 has
1 image, sample 1 has 2),
attention_mask, pixel_values [3, 3, 32, 32], labels (-100 on prompt/image/pad), logits [2, T, V]
and loss (HF's shifted mean cross-entropy). Deterministic: rerunning rewrites identical bytes.

Run: .venv/bin/python scripts/golden/make_llava_fixture.py   (needs transformers; tested on 5.24.0)
"""
import json
import os
import re
import shutil

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import LlavaConfig, LlavaForConditionalGeneration

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "golden", "fixtures")
IMAGE_TOKEN = 127
N_PATCHES = 16  # (32 / 8)^2, "default" strategy drops the class token

VISION = dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, image_size=32, patch_size=8, projection_dim=16)
TEXT = dict(model_type="llama", vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, rope_theta=10000.0)


def build(tie):
    torch.manual_seed(0)
    cfg = LlavaConfig(vision_config=dict(VISION), text_config=dict(TEXT), image_token_index=IMAGE_TOKEN,
                      vision_feature_layer=-2, vision_feature_select_strategy="default",
                      tie_word_embeddings=tie)
    model = LlavaForConditionalGeneration(cfg).eval()
    with torch.no_grad():  # HF zero-inits norms/biases; randomize them so the test sees their use
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(0.1 * torch.randn(p.shape))
    return model


def make_inputs():
    g = torch.Generator().manual_seed(1)
    img = [IMAGE_TOKEN] * N_PATCHES
    a = [1, 5, 9] + img + [17, 22, 31, 40, 2]                # 1 image, 24 tokens
    b = [1, 7] + img + [11, 12] + img + [50, 60, 70, 80, 2]   # 2 images, 41 tokens
    T = max(len(a), len(b))
    input_ids = torch.zeros(2, T, dtype=torch.long)
    attention_mask = torch.zeros(2, T, dtype=torch.long)
    for i, row in enumerate([a, b]):
        input_ids[i, : len(row)] = torch.tensor(row)
        attention_mask[i, : len(row)] = 1
    labels = input_ids.clone()
    labels[attention_mask == 0] = -100
    labels[input_ids == IMAGE_TOKEN] = -100
    labels[:, :3] = -100  # prompt
    pixel_values = torch.randn(3, 3, 32, 32, generator=g)
    return dict(input_ids=input_ids, attention_mask=attention_mask, pixel_values=pixel_values, labels=labels)


def write_io(model, folder, inputs):
    with torch.no_grad():
        out = model(**inputs)
    tensors = dict(inputs)
    tensors["logits"] = out.logits.float().contiguous()
    tensors["loss"] = out.loss.float().reshape(())
    save_file(tensors, os.path.join(folder, "io.safetensors"), metadata={"format": "pt"})
    return out.logits


def main():
    inputs = make_inputs()
    for name, tie in [("llava_tiny", False), ("llava_tiny_tied", True)]:
        folder = os.path.join(ROOT, name)
        shutil.rmtree(folder, ignore_errors=True)
        model = build(tie)
        if tie:
            assert model.lm_head.weight.data_ptr() == model.model.language_model.embed_tokens.weight.data_ptr()
        model.save_pretrained(folder)
        write_io(model, folder, inputs)
        print(name, "keys:", sorted(load_file(os.path.join(folder, "model.safetensors")))[:3], "...")

    # Hub layout (as published llava-hf checkpoints): vision_tower.vision_model.*
    src = os.path.join(ROOT, "llava_tiny")
    folder = os.path.join(ROOT, "llava_tiny_hub")
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    shutil.copy(os.path.join(src, "config.json"), folder)
    sd = load_file(os.path.join(src, "model.safetensors"))
    hub = {re.sub(r"^vision_tower\.(?!vision_model\.)", "vision_tower.vision_model.", k): v for k, v in sd.items()}
    assert any(k.startswith("vision_tower.vision_model.") for k in hub)
    save_file(hub, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    reloaded = LlavaForConditionalGeneration.from_pretrained(folder).eval()
    with torch.no_grad():
        logits = reloaded(**inputs).logits
    ref = load_file(os.path.join(src, "io.safetensors"))["logits"]
    assert torch.equal(logits, ref), "transformers did not load the hub layout to the same model"

    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(ROOT) for f in fs
                if "llava_tiny" in d)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}; llava fixtures {total} bytes")


if __name__ == "__main__":
    main()
