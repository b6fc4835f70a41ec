"""Golden fixtures for mmpost's Qwen2-VL family (tests/golden/test_qwen2_vl_golden.cpp).

Builds tiny random Qwen2VLForConditionalGeneration and Qwen2_5_VLForConditionalGeneration models
(seed 0; initializer_range 0.2 so greedy generation does not collapse to one token; norms and
biases randomised so the test sees their use) and writes, under
tests/golden/fixtures/:
  qwen2_vl_tiny/     save_pretrained output (config.json + model.safetensors, hub layout) + io
  qwen2_5_vl_tiny/   the same for Qwen2.5-VL: RMSNorm + SwiGLU vision blocks, window_size 56
                     (2x2 merged units per window, so the 8x6-patch image spans 4 windows, two of
                     them partial) and fullatt_block_indexes [1] of depth 3
  qwen2_vl_tiny_flat/  the qwen2_vl_tiny weights with the hub's flat config.json (text keys at the
                     top level, rope_scaling {"type": "mrope"}, vision in_chans /
                     spatial_patch_size); asserts transformers loads it to the same logits
Each io.safetensors holds, for a batch of 2 right-padded rows (row 0: text, image 0, text,
image 1, text as two user/assistant turns; row 1: image 2 then text):
  pixel_values [sum patches, 3*2*14*14] and image_grid_thw [3, 3] from Qwen2VLImageProcessorPil
  on three real photos (scikit-image chelsea, astronaut, coffee) shrunk to 56x84, 84x56, 112x84;
  input_ids, attention_mask [2, T]; position_ids [3, 2, T] and rope_deltas [2, 1] from
  model.model.get_rope_index; logits [2, T, V] float32 from model(...);
  gen_input_ids / gen_attention_mask: the same prompts left-padded, and gen_tokens [2, 8]: the
  greedy continuation from model.generate(max_new_tokens=8, do_sample=False) with eos disabled.
Deterministic: rerunning rewrites identical bytes.

Run: .venv/bin/python scripts/golden/make_qwen2_vl_fixture.py   (transformers 5.24, Pillow,
scikit-image)
"""
import json
import os
import shutil

import numpy as np
import torch
import transformers
from PIL import Image
from safetensors.torch import load_file, save_file
from skimage import data as skdata
from transformers import (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2VLConfig,
                          Qwen2VLForConditionalGeneration)
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "golden", "fixtures")
VOCAB = 160
IMAGE, VIDEO, VSTART, VEND = 151, 152, 153, 154
TEXT = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0,
            initializer_range=0.2,
            rope_parameters=dict(rope_type="default", rope_theta=1000000.0, mrope_section=[2, 3, 3]))
VISION2 = dict(depth=2, embed_dim=32, hidden_size=64, num_heads=4, mlp_ratio=2, patch_size=14,
               spatial_merge_size=2, temporal_patch_size=2, initializer_range=0.2)
VISION25 = dict(depth=3, hidden_size=32, out_hidden_size=64, intermediate_size=48, num_heads=4, patch_size=14,
                spatial_merge_size=2, temporal_patch_size=2, window_size=56, fullatt_block_indexes=[1],
                initializer_range=0.2)
SIZES = [(56, 84), (84, 56), (112, 84)]  # (width, height)


def build(kind):
    torch.manual_seed(0)
    ids = dict(image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=VSTART, vision_end_token_id=VEND)
    if kind == "qwen2_vl":
        model = Qwen2VLForConditionalGeneration(Qwen2VLConfig(text_config=dict(TEXT), vision_config=dict(VISION2), **ids))
    else:
        model = Qwen2_5_VLForConditionalGeneration(
            Qwen2_5_VLConfig(text_config=dict(TEXT), vision_config=dict(VISION25), **ids))
    model.eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name or "ln_q" in name:
                p.add_(0.1 * torch.randn(p.shape))
    return model


def photos():
    out = []
    for img, (w, h) in zip([skdata.chelsea(), skdata.astronaut(), skdata.coffee()], SIZES):
        out.append(Image.fromarray(img).convert("RGB").resize((w, h), Image.BICUBIC))
    return out


def make_inputs(grid):
    merged = [int(t * h * w // 4) for t, h, w in grid.tolist()]
    img = lambda i: [VSTART] + [IMAGE] * merged[i] + [VEND]
    a = [1, 5, 9, 11] + img(0) + [17, 22, 31, 2, 40, 41] + img(1) + [44, 45, 46, 2]  # two turns
    b = [1, 7] + img(2) + [12, 13, 14, 15, 16]
    T = max(len(a), len(b))
    input_ids = torch.zeros(2, T, dtype=torch.long)
    attention_mask = torch.zeros(2, T, dtype=torch.long)
    for i, row in enumerate([a, b]):
        input_ids[i, : len(row)] = torch.tensor(row)
        attention_mask[i, : len(row)] = 1
    left_ids = torch.zeros(2, T, dtype=torch.long)
    left_mask = torch.zeros(2, T, dtype=torch.long)
    for i, row in enumerate([a, b]):
        left_ids[i, T - len(row):] = torch.tensor(row)
        left_mask[i, T - len(row):] = 1
    return input_ids, attention_mask, left_ids, left_mask


def run(kind, proc, images):
    model = build(kind)
    out_dir = os.path.join(ROOT, kind + "_tiny")
    shutil.rmtree(out_dir, ignore_errors=True)
    model.save_pretrained(out_dir)
    for extra in ["generation_config.json"]:
        if os.path.exists(os.path.join(out_dir, extra)):
            os.remove(os.path.join(out_dir, extra))
    feats = proc(images=images, return_tensors="pt")
    pixel_values, grid = feats["pixel_values"], feats["image_grid_thw"]
    input_ids, attention_mask, left_ids, left_mask = make_inputs(grid)
    mm = (input_ids == IMAGE).int()
    with torch.no_grad():
        position_ids, deltas = model.model.get_rope_index(input_ids, mm_token_type_ids=mm, image_grid_thw=grid,
                                                          attention_mask=attention_mask)
        logits = model(input_ids=input_ids, attention_mask=attention_mask, pixel_values=pixel_values,
                       image_grid_thw=grid, mm_token_type_ids=mm).logits.float()
        gen = model.generate(input_ids=left_ids, attention_mask=left_mask, pixel_values=pixel_values,
                             image_grid_thw=grid, mm_token_type_ids=(left_ids == IMAGE).int(), max_new_tokens=8,
                             do_sample=False, eos_token_id=None, pad_token_id=0)
    gen_tokens = gen[:, left_ids.shape[1]:].contiguous()
    assert gen_tokens.shape == (2, 8), gen_tokens.shape
    save_file({"pixel_values": pixel_values.contiguous(), "image_grid_thw": grid.contiguous(),
               "input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids.contiguous(),
               "rope_deltas": deltas.contiguous(), "logits": logits.contiguous(), "gen_input_ids": left_ids,
               "gen_attention_mask": left_mask, "gen_tokens": gen_tokens},
              os.path.join(out_dir, "io.safetensors"))
    return model, out_dir, (input_ids, attention_mask, pixel_values, grid, mm, logits)


def flat_copy(src_dir, inputs):
    """The hub's flat Qwen2-VL config.json layout with the same weights; checks HF reads it alike."""
    dst = os.path.join(ROOT, "qwen2_vl_tiny_flat")
    shutil.rmtree(dst, ignore_errors=True)
    os.makedirs(dst)
    cfg = json.load(open(os.path.join(src_dir, "config.json")))
    text = cfg.pop("text_config")
    for k in ["model_type", "layer_types", "use_cache", "initializer_range", "attention_dropout"]:
        text.pop(k, None)
    rope = text.pop("rope_parameters")
    flat = {"architectures": cfg["architectures"], "model_type": "qwen2_vl", **text,
            "rope_theta": rope["rope_theta"], "rope_scaling": {"type": "mrope", "mrope_section": rope["mrope_section"]},
            "image_token_id": IMAGE, "video_token_id": VIDEO, "vision_start_token_id": VSTART,
            "vision_end_token_id": VEND, "vision_token_id": 155, "tie_word_embeddings": False,
            "torch_dtype": "float32"}
    v = cfg["vision_config"]
    flat["vision_config"] = {"depth": v["depth"], "embed_dim": v["embed_dim"], "mlp_ratio": v["mlp_ratio"],
                             "num_heads": v["num_heads"], "in_chans": 3, "hidden_size": v["hidden_size"],
                             "patch_size": 14, "spatial_merge_size": 2, "spatial_patch_size": 14,
                             "temporal_patch_size": 2}
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(flat, f, indent=2, sort_keys=True)
        f.write("\n")
    shutil.copy(os.path.join(src_dir, "model.safetensors"), dst)
    model = Qwen2VLForConditionalGeneration.from_pretrained(dst).eval()
    input_ids, attention_mask, pixel_values, grid, mm, logits = inputs
    with torch.no_grad():
        again = model(input_ids=input_ids, attention_mask=attention_mask, pixel_values=pixel_values,
                      image_grid_thw=grid, mm_token_type_ids=mm).logits.float()
    assert torch.equal(again, logits), (again - logits).abs().max()


def main():
    proc = Qwen2VLImageProcessorPil(min_pixels=28 * 28, max_pixels=28 * 28 * 64)
    images = photos()
    _, q2_dir, q2_inputs = run("qwen2_vl", proc, images)
    run("qwen2_5_vl", proc, images)
    flat_copy(q2_dir, q2_inputs)
    print(json.dumps({"transformers": transformers.__version__, "torch": torch.__version__}))


if __name__ == "__main__":
    main()
