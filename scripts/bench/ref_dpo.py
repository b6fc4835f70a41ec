"""Reference for `mmpost dpo` throughput: the step TRL's DPOTrainer runs, written out as a plain
PyTorch loop over transformers' LlavaForConditionalGeneration, built from the resolved recipe
mmpost wrote (OUTPUT/recipe.json).

Mirrors TRL (trl/trainer/dpo_trainer.py, DPOTrainer without precompute_ref_log_probs):
  - data: DataCollatorForVisionPreference.torch_call: each pair gives the rows prompt+chosen and
    prompt+rejected, chosen rows first, right-padded to the longest row; the images of the batch
    are repeated for the rejected half (`images = [...] * 2`), so the vision tower sees each
    image twice (--vision-once: once, shared by both rows, as mmpost does);
  - policy forward: DPOTrainer._compute_loss -> model(input_ids, attention_mask, pixel_values,
    use_cache=False), shift, selective_log_softmax, completion tokens summed per row;
  - reference: a frozen copy of the starting model (DPOTrainer's ref_model, eval mode), the same
    forward under torch.no_grad() (_compute_loss, the `else` branch of precompute_ref_logps);
  - loss: loss_type "sigmoid": -logsigmoid(beta * ((pi_c - ref_c) - (pi_r - ref_r))), mean over
    pairs; recipe dpo.rpo_alpha (or a "sft" loss_type) adds loss_type "sft" with that weight:
    F.cross_entropy over the chosen completion tokens (TRL's `loss += per_sequence_loss.mean() *
    loss_weight`); other loss types are refused;
  - optimizer: HF Trainer default adamw_torch_fused (torch.optim.AdamW(fused=True)), clip to
    train.clip_grad_norm, the recipe's lr schedule; fp32 (or the recipe's dtype), sdpa attention,
    torch.set_num_threads(num_threads); train.gradient_accumulation_steps micro-batches, each
    loss divided by their number (Trainer.training_step).
Tokenization is mmpost's (LLaVA template over the folder's sentencepiece model, <image> expanded
to the patch count; ref_common.MmpostEncoder), truncation mmpost's (dpo.max_prompt_length keeps the
end of the prompt, then dpo.max_completion_length and data.max_length cut the completions).
The same pairs in the same order as mmpost with data.shuffle_buffer=0 (file order).
Not included: TRL's per-step logging extras (entropy over all logits, mean_token_accuracy; add them
with --trl-metrics). mmpost's own metrics (rewards/*, logps/*, logits/*) are computed here too.

Batches are built before timing (mmpost builds them on loader threads during the loop).
Timing: windows of train.log_every_n_steps steps like mmpost's metrics.jsonl (tokens = non-pad
tokens of the 2B rows, samples = pairs); prints one JSON line with the windows and the first
steps' metrics (policy == reference at step 1: loss ln 2 + the sft term).
"""
import argparse
import copy
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F
from transformers.modeling_outputs import BaseModelOutputWithPooling
from transformers.utils import logging as hf_logging

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ref_common as rc  # noqa: E402


def loss_terms(recipe):
    d = recipe["dpo"]
    types = d.get("loss_type", ["sigmoid"])
    types = [types] if isinstance(types, str) else list(types)
    weights = list(d.get("loss_weights", []) or [1.0] * len(types))
    if d.get("rpo_alpha", 0) and d["rpo_alpha"] > 0:  # mmpost (and TRL's old rpo_alpha): an extra "sft" term
        types.append("sft")
        weights.append(d["rpo_alpha"])
    bad = [t for t in types if t not in ("sigmoid", "sft")]
    if bad or d.get("use_weighting") or d.get("ld_alpha") is not None or d.get("mdpo", {}).get("enabled"):
        sys.exit(f"ref_dpo: only loss types sigmoid (+ sft / rpo_alpha) are reproduced, got {types}")
    return list(zip(types, weights))


def completion_of(messages_or_text):
    if isinstance(messages_or_text, str):
        return [{"role": "assistant", "content": messages_or_text}]
    return messages_or_text


def make_pair(rec, enc, limits, base, size, img_cfg):
    """data::make_preference_sample: prompt ids (generation prompt), completion ids/labels."""
    prompt = rec["prompt"]
    prompt = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    p_ids = enc.prompt(prompt)
    sides = []
    for key in ("chosen", "rejected"):
        ids, labels = enc.conversation(prompt + completion_of(rec[key]))
        assert ids[:len(p_ids)] == p_ids, "prompt is not a prefix of prompt + completion"
        sides.append((ids[len(p_ids):], labels[len(p_ids):]))
    max_prompt, max_comp, max_len = limits
    if max_prompt > 0 and len(p_ids) > max_prompt:
        cut = len(p_ids) - max_prompt
        assert enc.image_token not in p_ids[:cut], "truncating the prompt would cut image tokens"
        p_ids = p_ids[cut:]
    if max_comp > 0:
        sides = [(i[:max_comp], l[:max_comp]) for i, l in sides]
    if max_len > 0:
        room = max_len - len(p_ids)
        assert room > 0, "prompt leaves no room for a completion within max_length"
        sides = [(i[:room], l[:room]) for i, l in sides]
    pix = rc.load_images(rec.get("images", []), base, size, img_cfg)
    return p_ids, sides, pix


def collate(pairs, pad_id):
    """data::collate_preference / TRL's collator: rows [chosen x B; rejected x B], right-padded."""
    B = len(pairs)
    rows = [(p, s[0]) for p, s, _ in pairs] + [(p, s[1]) for p, s, _ in pairs]
    T = max(len(p) + len(c[0]) for p, c in rows)
    ids = torch.full((2 * B, T), pad_id, dtype=torch.long)
    mask = torch.zeros((2 * B, T), dtype=torch.long)
    labels = torch.full((2 * B, T), -100, dtype=torch.long)
    for r, (p, (c_ids, c_lab)) in enumerate(rows):
        n = len(p) + len(c_ids)
        ids[r, :n] = torch.tensor(p + c_ids)
        mask[r, :n] = 1
        labels[r, len(p):n] = torch.tensor(c_lab)
    pix = [x for _, _, x in pairs if x is not None]
    pix = torch.cat(pix) if pix else None
    return dict(input_ids=ids, attention_mask=mask, labels=labels, pixel_values=pix, B=B)


def forward_logits(model, b, vision_once, dtype):
    """[2B, T, V] logits. TRL: pixel_values of the batch twice (one set per half); --vision-once:
    the image features once, handed to LlavaModel.forward for both halves (mm_encoder_outputs)."""
    pix = b["pixel_values"]
    if pix is None:
        return model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], use_cache=False).logits
    pix = pix.to(dtype)
    if not vision_once:
        return model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                     pixel_values=torch.cat([pix, pix]), use_cache=False).logits
    # LlavaModel.get_image_features once, then the model's own splice via mm_encoder_outputs.
    feats = list(model.model.get_image_features(pixel_values=pix, return_dict=True).pooler_output)
    both = BaseModelOutputWithPooling(pooler_output=feats + feats)
    return model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                 mm_encoder_outputs={"image": both}, use_cache=False).logits


def sequence_logps(logits, b):
    """DPOTrainer._compute_loss: shift, selective_log_softmax, zero outside the completion, sum."""
    shift_logits = logits[:, :-1, :]
    shift_labels = b["input_ids"][:, 1:]
    cmask = b["labels"][:, 1:] != -100
    per_token = rc.selective_log_softmax(shift_logits.float(), shift_labels)
    per_token = per_token.masked_fill(~cmask, 0.0)
    return per_token.sum(1), shift_logits, shift_labels, cmask


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipe", required=True, help="mmpost's resolved OUTPUT/recipe.json")
    ap.add_argument("--root", default=".", help="directory mmpost ran in (recipe paths are relative to it)")
    ap.add_argument("--vision-once", action="store_true",
                    help="encode each image once for its chosen and rejected rows (mmpost) instead of twice (TRL)")
    ap.add_argument("--trl-metrics", action="store_true",
                    help="also compute TRL's per-step entropy and mean_token_accuracy metrics")
    ap.add_argument("--steps", type=int, default=0, help="override train.max_steps")
    a = ap.parse_args()
    hf_logging.set_verbosity_error()
    recipe = rc.load_recipe(a.recipe)
    tr, d = recipe["train"], recipe["dpo"]
    rc.setup_torch(recipe)
    rss_before_model = rc.maxrss_kb()
    terms = loss_terms(recipe)
    beta = d.get("beta", 0.1)

    model, folder = rc.load_model(recipe, a.root)
    model.train()
    dtype = rc.train_dtype(recipe)
    if d.get("ref_model"):
        from transformers import LlavaForConditionalGeneration
        ref = LlavaForConditionalGeneration.from_pretrained(rc.resolve(a.root, d["ref_model"]), dtype=dtype,
                                                            attn_implementation="sdpa")
    else:
        ref = copy.deepcopy(model)  # the frozen start model (TRL: create_model_from_path of the same id)
    if d.get("ref_dtype") == "bfloat16":
        ref = ref.to(torch.bfloat16)
    ref.eval()
    for p in ref.parameters():
        p.requires_grad_(False)

    enc = rc.make_encoder(recipe, a.root, folder, model)
    img_cfg = rc.image_settings(recipe, folder)
    size = model.config.vision_config.image_size
    path = rc.resolve(a.root, recipe["data"]["train"])
    base = os.path.dirname(path)
    records = [json.loads(l) for l in open(path) if l.strip()]
    limits = (d.get("max_prompt_length", 0), d.get("max_completion_length", 0), recipe["data"].get("max_length", 0))
    B, n_micro = tr["batch_size"], tr.get("gradient_accumulation_steps", 1)
    steps = a.steps or tr["max_steps"] or math.ceil(tr.get("epochs", 1.0) * len(records) / (B * n_micro))
    pad_id = rc.pad_id_of(enc)
    if recipe["data"].get("shuffle_buffer", 0) != 0:
        print("ref_dpo: warning: data.shuffle_buffer != 0; the reference reads the pairs in file order",
              file=sys.stderr)
    # File order (shuffle_buffer 0); an epoch's last window may be short, as mmpost's loader.
    batches, k = [], 0
    for _ in range(steps * n_micro):
        if k >= len(records):
            k = 0
        take = records[k:k + B]
        k += len(take)
        batches.append(collate([make_pair(r, enc, limits, base, size, img_cfg) for r in take], pad_id))

    optimizer, params = rc.make_optimizer(model, recipe)
    windows, first_steps = [], []
    t_last, tokens, samples = time.perf_counter(), 0, 0
    for step in range(1, steps + 1):
        for g in optimizer.param_groups:
            g["lr"] = rc.lr_at(recipe, step - 1, steps)
        optimizer.zero_grad(set_to_none=True)
        step_loss, m = 0.0, {}
        for j in range(n_micro):
            b = batches[(step - 1) * n_micro + j]
            Bm = b["B"]
            with rc.autocast(recipe):
                logits = forward_logits(model, b, a.vision_once, dtype)
                logps, shift_logits, shift_labels, cmask = sequence_logps(logits, b)
                with torch.no_grad():
                    ref_logits = forward_logits(ref, b, a.vision_once, next(ref.parameters()).dtype)
                    ref_logps = sequence_logps(ref_logits, b)[0].float()
            chosen, rejected = logps.chunk(2)
            ref_chosen, ref_rejected = ref_logps.chunk(2)
            chosen_lr, rejected_lr = chosen - ref_chosen, rejected - ref_rejected
            loss, parts = 0.0, {}
            for t, w in terms:
                if t == "sigmoid":  # DPOTrainer._compute_loss, loss_type == "sigmoid"
                    per_seq = -F.logsigmoid(beta * (chosen_lr - rejected_lr))
                else:  # loss_type == "sft": token-mean NLL of the chosen completions
                    cl, clab, cm = shift_logits[:Bm], shift_labels[:Bm], cmask[:Bm]
                    per_seq = F.cross_entropy(cl[cm].float(), clab[cm]).expand(Bm)
                loss = loss + per_seq.mean() * w
                parts[f"loss/{t}"] = float(per_seq.mean())
            (loss / n_micro).backward()
            step_loss += loss.item() / n_micro
            with torch.no_grad():  # mmpost's (= TRL's) metric names
                rcw, rrw = beta * chosen_lr.detach(), beta * rejected_lr.detach()
                V = shift_logits.shape[-1]
                lsum = (shift_logits.detach().float() * cmask.unsqueeze(-1)).sum((1, 2))
                lmean = lsum / (cmask.sum(1).clamp_min(1) * V)
                vals = {"rewards/chosen": rcw.mean(), "rewards/rejected": rrw.mean(),
                        "rewards/accuracies": (rcw > rrw).float().mean(), "rewards/margins": (rcw - rrw).mean(),
                        "logps/chosen": chosen.detach().mean(), "logps/rejected": rejected.detach().mean(),
                        "logits/chosen": lmean[:Bm].mean(), "logits/rejected": lmean[Bm:].mean()}
                if a.trl_metrics:
                    ent = rc.entropy_from_logits(shift_logits.detach().float())
                    vals["entropy"] = (ent * cmask).sum() / cmask.sum()
                    pred = shift_logits[:Bm].detach().argmax(-1)
                    vals["mean_token_accuracy"] = ((pred == shift_labels[:Bm]) & cmask[:Bm]).sum() / cmask[:Bm].sum()
                vals.update(parts)
                for key, v in vals.items():
                    m[key] = m.get(key, 0.0) + float(v) / n_micro
            tokens += int(b["attention_mask"].sum())
            samples += Bm
        grad_norm = torch.nn.utils.clip_grad_norm_(params, tr.get("clip_grad_norm", 1.0))
        optimizer.step()
        if step <= 3:
            first_steps.append({"step": step, "loss": step_loss, "grad_norm": float(grad_norm), **m})
        if step % tr["log_every_n_steps"] == 0 or step == steps:
            now = time.perf_counter()
            windows.append({"step": step, "tokens_per_s": tokens / (now - t_last),
                            "samples_per_s": samples / (now - t_last), "pairs_per_s": samples / (now - t_last)})
            t_last, tokens, samples = now, 0, 0
    print(json.dumps({"windows": windows, "first_steps": first_steps, "loss_types": terms,
                      "params": rc.param_counts(model), "attn_implementation": model.config._attn_implementation,
                      "torch_threads": torch.get_num_threads(), "vision_passes_per_image": 1 if a.vision_once else 2,
                      "tokens_per_pair": sum(int(b["attention_mask"].sum()) for b in batches) / sum(b["B"] for b in batches),
                      "maxrss_before_model_kb": rss_before_model, "maxrss_kb": rc.maxrss_kb()}))


if __name__ == "__main__":
    main()
