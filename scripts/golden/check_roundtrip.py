"""Hugging Face round trip for mmpost checkpoints (issue: HF checkpoint compatibility).

1. Builds a tiny random transformers LlavaForConditionalGeneration (seed 0) whose tokenizer is the
   processor fixture's (tests/golden/fixtures/processor: <image> = 400, <pad> = 401) and saves it
   with save_pretrained: the folder a user arrives with.
2. Runs `mmpost sft --set model.path=<that folder>` for a few steps on two real photos.
3. Loads mmpost's output with transformers `from_pretrained` and requires no missing, unexpected
   or mismatched weights, that the weights moved, and that transformers' logits equal mmpost's own
   (`mmpost inspect forward`) within 1e-4 on the fixture's input_ids/pixel_values.
With --lora: the sft run trains LoRA adapters (q_proj, v_proj, fc1, down_proj; the projector in
modules_to_save) instead, and PEFT's PeftModel.from_pretrained(transformers model of the output
folder, the output folder) must give mmpost's logits (mmpost merges the folder's adapter on
load) within 1e-4; the frozen base tensors must be unchanged, the adapters trained; a second run
with lora.merge_on_save writes a plain merged folder with the same logits.
Prints one JSON line; exit 0 on success, 1 on a mismatch.

Run: .venv/bin/python scripts/golden/check_roundtrip.py --mmpost build/mmpost --workdir /tmp/rt
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import LlavaConfig, LlavaForConditionalGeneration

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FIXTURE = os.path.join(ROOT, "tests", "golden", "fixtures", "processor")
IMAGE_TOKEN, PAD = 400, 401


def build_hf_folder(path):
    torch.manual_seed(0)
    cfg = LlavaConfig(
        vision_config=dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=64,
                           num_hidden_layers=2, num_attention_heads=4, image_size=32, patch_size=8,
                           projection_dim=16),
        text_config=dict(model_type="llama", vocab_size=402, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256, pad_token_id=PAD),
        image_token_index=IMAGE_TOKEN, vision_feature_layer=-2,
        vision_feature_select_strategy="default", projector_hidden_act="gelu")
    model = LlavaForConditionalGeneration(cfg).eval()
    model.save_pretrained(path)
    for f in ("tokenizer.model", "tokenizer.json", "tokenizer_config.json",
              "preprocessor_config.json"):
        shutil.copy(os.path.join(FIXTURE, f), path)


def write_train_data(path):
    qa = [("astronaut.png", "What is shown in this image?", "A woman in a space suit."),
          ("chelsea.png", "What animal is this?", "A cat."),
          ("astronaut.png", "Is this a person?", "Yes."),
          ("chelsea.png", "Describe the image.", "A tabby cat looking to the left.")]
    with open(path, "w") as f:
        for i, (img, q, a) in enumerate(qa):
            rec = {"id": i, "images": [os.path.join(FIXTURE, img)],
                   "messages": [{"role": "user", "content": "<image>\n" + q},
                                {"role": "assistant", "content": a}]}
            f.write(json.dumps(rec) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mmpost", default=os.path.join(ROOT, "build", "mmpost"))
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--lora", action="store_true")
    args = ap.parse_args()
    wd = os.path.abspath(args.workdir)
    shutil.rmtree(wd, ignore_errors=True)
    os.makedirs(wd)
    hf_in, out = os.path.join(wd, "hf_in"), os.path.join(wd, "mmpost_out")
    build_hf_folder(hf_in)
    write_train_data(os.path.join(wd, "train.jsonl"))
    sets = [f"model.path={hf_in}", f"data.train={wd}/train.jsonl", "data.eval=\"\"",
            "train.max_steps=3", "train.batch_size=2", "optim.lr=1e-2", "device=cpu",
            "num_threads=1", "data.shuffle_buffer=0"]
    if args.lora:
        return check_lora(args, wd, hf_in, out, sets)
    subprocess.run([args.mmpost, "sft", "--output", out, "--no-resume", "--set", *sets],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    model, info = LlavaForConditionalGeneration.from_pretrained(out, output_loading_info=True)
    model.eval()
    problems = {k: [str(x) for x in v] for k, v in info.items() if v}
    before = LlavaForConditionalGeneration.from_pretrained(hf_in).state_dict()
    after = model.state_dict()
    moved = sum(not torch.equal(before[k], after[k]) for k in after)

    exp = load_file(os.path.join(FIXTURE, "expected.safetensors"))
    inputs = {"input_ids": exp["b.input_ids"], "attention_mask": exp["b.attention_mask"],
              "pixel_values": exp["b.pixel_values"]}
    save_file(inputs, os.path.join(wd, "inputs.safetensors"))
    subprocess.run([args.mmpost, "inspect", "forward", out, "--inputs",
                    os.path.join(wd, "inputs.safetensors"), "--out",
                    os.path.join(wd, "mmpost_logits.safetensors")],
                   check=True, stdout=subprocess.DEVNULL)
    mm = load_file(os.path.join(wd, "mmpost_logits.safetensors"))["logits"]
    with torch.no_grad():
        hf = model(**inputs).logits.float()
    maxdiff = (hf - mm).abs().max().item()
    ok = not problems and moved > 0 and maxdiff <= 1e-4
    print(json.dumps({"ok": ok, "loading_problems": problems, "tensors_changed_by_training": moved,
                      "n_tensors": len(after), "logits_maxdiff": maxdiff}))
    sys.exit(0 if ok else 1)


def mmpost_logits(args, wd, folder, inputs):
    save_file(inputs, os.path.join(wd, "inputs.safetensors"))
    out = os.path.join(wd, "mmpost_logits.safetensors")
    subprocess.run([args.mmpost, "inspect", "forward", folder, "--inputs",
                    os.path.join(wd, "inputs.safetensors"), "--out", out],
                   check=True, stdout=subprocess.DEVNULL)
    return load_file(out)["logits"]


def check_lora(args, wd, hf_in, out, sets):
    from peft import PeftModel

    lora = ["lora.r=4", "lora.alpha=8", 'lora.target_modules=["q_proj","v_proj","fc1","down_proj"]',
            'lora.modules_to_save=["multi_modal_projector"]']
    subprocess.run([args.mmpost, "sft", "--output", out, "--no-resume", "--set", *sets, *lora],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    merged_out = out + "_merged"
    subprocess.run([args.mmpost, "sft", "--output", merged_out, "--no-resume", "--set", *sets, *lora,
                    "lora.merge_on_save=true"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    exp = load_file(os.path.join(FIXTURE, "expected.safetensors"))
    inputs = {"input_ids": exp["b.input_ids"], "attention_mask": exp["b.attention_mask"],
              "pixel_values": exp["b.pixel_values"]}
    # The PEFT way: the original model, then the adapter folder on top. (transformers with peft
    # installed also loads the folder itself as base + adapter: checked below.)
    base = LlavaForConditionalGeneration.from_pretrained(hf_in)
    peft_model = PeftModel.from_pretrained(base, out).eval()
    auto = LlavaForConditionalGeneration.from_pretrained(out).eval()
    problems = {}
    frozen_ok = True
    adapter = load_file(os.path.join(out, "adapter_model.safetensors"))
    n_lora = sum(".lora_" in k for k in adapter)
    # (the last vision layer is past vision_feature_layer -2: no gradient reaches its adapters)
    b_trained = all(adapter[k].abs().max().item() > 0 for k in adapter
                    if ".lora_B." in k and "language_model" in k)
    with torch.no_grad():
        peft_logits = peft_model(**inputs).logits.float()
        base_logits = LlavaForConditionalGeneration.from_pretrained(hf_in).eval()(**inputs).logits.float()
        auto_logits = auto(**inputs).logits.float()
    mm = mmpost_logits(args, wd, out, inputs)
    maxdiff = max((peft_logits - mm).abs().max().item(), (auto_logits - mm).abs().max().item())
    adapter_effect = (peft_logits - base_logits).abs().max().item()
    merged = LlavaForConditionalGeneration.from_pretrained(merged_out).eval()
    with torch.no_grad():
        merged_logits = merged(**inputs).logits.float()
    merged_diff = (merged_logits - peft_logits).abs().max().item()
    merged_plain = not os.path.exists(os.path.join(merged_out, "adapter_config.json"))
    ok = (not problems and frozen_ok and n_lora == 2 * (4 + 4 + 2 + 2) and b_trained and
          maxdiff <= 1e-4 and adapter_effect > 1e-3 and merged_diff <= 1e-4 and merged_plain)
    print(json.dumps({"ok": ok, "loading_problems": problems, 
                      "lora_tensors": n_lora, "lora_B_trained": b_trained,
                      "peft_vs_mmpost_logits_maxdiff": maxdiff, "adapter_effect": adapter_effect,
                      "merged_vs_peft_maxdiff": merged_diff, "merged_folder_plain": merged_plain}))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
