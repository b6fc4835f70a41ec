"""Golden fixture: a whole Qwen2-VL training sample as transformers builds it (issue 14).

A two-image, two-turn conversation on real photos of different sizes goes through
Qwen2VLProcessor (the Qwen2 byte-level BPE fixture tokenizer plus the vision tokens, the
Qwen2-VL chat template, Qwen2VLImageProcessorPil with the real 14-px patches), and its M-RoPE
positions through Qwen2VLModel.get_rope_index. The C++ side
(tests/golden/test_qwen2_vl_processor.cpp) builds the same record with mmpost's data pipeline and
requires input_ids, pixel_values, image_grid_thw and position ids identical.

Writes tests/golden/fixtures/qwen2_vl_pipeline/: tokenizer.json, tokenizer_config.json,
preprocessor_config.json, record.json (the mmpost record) and expected.safetensors
(input_ids, pixel_values, image_grid_thw, position_ids [3, 1, T], rope_deltas).
Run: .venv/bin/python scripts/golden/make_qwen2_vl_pipeline_fixture.py
"""
import json
import os

import torch
from PIL import Image
from safetensors.torch import save_file
from transformers import (PreTrainedTokenizerFast, Qwen2VLConfig, Qwen2VLImageProcessorPil,
                          Qwen2VLModel, Qwen2VLProcessor)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FIX = os.path.join(ROOT, "tests", "golden", "fixtures")
OUT = os.path.join(FIX, "qwen2_vl_pipeline")
PHOTOS = os.path.join(FIX, "qwen2_vl_processor")
VISION = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]  # ids 600..603


def write_tokenizer():
    with open(os.path.join(FIX, "bpe", "qwen2", "tokenizer.json")) as f:
        tj = json.load(f)
    for i, t in enumerate(VISION):
        tj["added_tokens"].append({"id": 600 + i, "content": t, "single_word": False,
                                   "lstrip": False, "rstrip": False, "normalized": False,
                                   "special": True})
    with open(os.path.join(OUT, "tokenizer.json"), "w") as f:
        json.dump(tj, f)
    with open(os.path.join(OUT, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                   "tokenizer_class": "Qwen2Tokenizer"}, f)


def main():
    os.makedirs(OUT, exist_ok=True)
    write_tokenizer()
    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(OUT, "tokenizer.json"),
                                  eos_token="<|im_end|>", pad_token="<|endoftext|>")
    ip = Qwen2VLImageProcessorPil(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 12, patch_size=14,
                                  merge_size=2, temporal_patch_size=2)
    ip.save_pretrained(OUT)
    with open(os.path.join(FIX, "chat_templates", "qwen2_vl.jinja")) as f:
        template = f.read()
    # No video processor here (it needs torchvision, which the venv does not carry): skip the
    # processor's class check for that attribute; images take the processor's own code path.
    Qwen2VLProcessor.check_argument_for_proper_class = lambda self, name, arg: None
    proc = Qwen2VLProcessor(image_processor=ip, tokenizer=tok, chat_template=template)
    images = ["rocket.png", "astronaut.png"]
    hf_messages = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "a rocket"}]},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "And this?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "an astronaut"}]},
    ]
    text = proc.apply_chat_template(hf_messages, tokenize=False)
    pil = [Image.open(os.path.join(PHOTOS, p)).convert("RGB") for p in images]
    enc = proc(text=[text], images=pil, return_tensors="pt")
    cfg = Qwen2VLConfig(
        text_config=dict(vocab_size=608, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1,
                         rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                                          "mrope_section": [2, 3, 3]}),
        vision_config=dict(depth=1, embed_dim=32, hidden_size=32, num_heads=2, patch_size=14,
                           spatial_merge_size=2, temporal_patch_size=2),
        image_token_id=602, video_token_id=603, vision_start_token_id=600,
        vision_end_token_id=601)
    model = Qwen2VLModel(cfg)
    ids = enc["input_ids"]
    mm = (ids == 602).int()
    pos, deltas = model.get_rope_index(ids, mm, image_grid_thw=enc["image_grid_thw"],
                                       attention_mask=enc["attention_mask"])
    record = {"id": "pipeline", "images": images,
              "messages": [{"role": "user", "content": "<image>What is this?"},
                           {"role": "assistant", "content": "a rocket"},
                           {"role": "user", "content": "<image>And this?"},
                           {"role": "assistant", "content": "an astronaut"}]}
    with open(os.path.join(OUT, "record.json"), "w") as f:
        json.dump(record, f, indent=1)
    save_file({"input_ids": ids.contiguous(), "pixel_values": enc["pixel_values"].contiguous(),
               "image_grid_thw": enc["image_grid_thw"].contiguous(),
               "position_ids": pos.contiguous(), "rope_deltas": deltas.contiguous()},
              os.path.join(OUT, "expected.safetensors"))
    print(json.dumps({"text": text, "n_tokens": ids.shape[1],
                      "image_grid_thw": enc["image_grid_thw"].tolist()}))


if __name__ == "__main__":
    main()
