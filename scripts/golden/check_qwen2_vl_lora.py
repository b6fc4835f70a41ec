"""PEFT loads a LoRA adapter that mmpost trained on a Qwen2-VL family model (issue 14).

BASE is the hub folder the run started from, FOLDER the run's output (base weights + PEFT's
adapter_config.json / adapter_model.safetensors), IO a safetensors file with input_ids,
attention_mask, pixel_values, image_grid_thw and mmpost's `logits` for them (the folder loaded
by mmpost, which merges the adapter). PeftModel.from_pretrained(transformers model of BASE,
FOLDER) must load every adapter tensor and give mmpost's logits within 1e-4 on the real tokens,
and differ from BASE's own logits (the adapter did something). Prints one JSON line; exit 0 on
success, 1 on a mismatch.

Run: .venv/bin/python scripts/golden/check_qwen2_vl_lora.py BASE FOLDER IO
"""
import json
import sys

import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoConfig, Qwen2_5_VLForConditionalGeneration, Qwen2VLForConditionalGeneration


def logits_of(model, io, image_token_id):
    with torch.no_grad():
        return model(input_ids=io["input_ids"], attention_mask=io["attention_mask"],
                     pixel_values=io["pixel_values"], image_grid_thw=io["image_grid_thw"],
                     mm_token_type_ids=(io["input_ids"] == image_token_id).int()).logits.float()


def main(base_dir, folder, io_file):
    cfg = AutoConfig.from_pretrained(base_dir)
    cls = Qwen2_5_VLForConditionalGeneration if cfg.model_type == "qwen2_5_vl" else Qwen2VLForConditionalGeneration
    io = load_file(io_file)
    base = cls.from_pretrained(base_dir).eval()
    base_logits = logits_of(base, io, cfg.image_token_id)
    peft_model = PeftModel.from_pretrained(cls.from_pretrained(base_dir), folder).eval()
    adapter = load_file(f"{folder}/adapter_model.safetensors")
    # Every adapter tensor of the file is in the model (PEFT only warns about unused keys).
    state = peft_model.state_dict()
    unused = [k for k in adapter if k.replace(".lora_A.weight", ".lora_A.default.weight")
              .replace(".lora_B.weight", ".lora_B.default.weight") not in state]
    peft_logits = logits_of(peft_model, io, cfg.image_token_id)
    mask = io["attention_mask"].bool().unsqueeze(-1).expand_as(peft_logits)
    diff = (peft_logits - io["logits"]).abs().masked_select(mask).max().item()
    effect = (peft_logits - base_logits).abs().masked_select(mask).max().item()
    n_vision = sum(".visual." in k for k in adapter)
    ok = not unused and diff <= 1e-4 and effect > 1e-4 and n_vision > 0
    print(json.dumps({"ok": ok, "model_type": cfg.model_type, "adapter_tensors": len(adapter),
                      "vision_adapter_tensors": n_vision, "unused_adapter_tensors": unused,
                      "peft_vs_mmpost_max_logit_diff": diff, "adapter_effect": effect}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3]))
