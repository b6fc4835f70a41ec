"""Reference for `mmpost sft` throughput: a plain PyTorch loop over transformers'
LlavaForConditionalGeneration built from the same resolved recipe (mmpost writes it to
OUTPUT/recipe.json): same HF LlavaConfig, seed, fp32, torch threads, batch size, AdamW
hyper-parameters with mmpost's groups (weight decay on tensors with dim >= 2), clip_grad_norm,
and the same samples in the same order (shuffle_buffer 0: file order), tokenized like mmpost's
LLaVA template (BOS, "USER: <image>\\n{q} ASSISTANT:" unsupervised, " {a}" + EOS supervised,
<image> expanded to the patch count) and right-padded per batch. Loss: HF's own (labels=...).

Batches are built before timing (mmpost's loader builds them on worker threads during the loop).
Timing: windows of train.log_every_n_steps steps, like mmpost's metrics.jsonl; prints one JSON line.
"""
import argparse
import json
import os
import resource
import time

import numpy as np
import sentencepiece as spm
import torch
from PIL import Image
from transformers import LlavaConfig, LlavaForConditionalGeneration
from transformers.utils import logging as hf_logging

PIL_RESAMPLE = {"bicubic": Image.BICUBIC, "bilinear": Image.BILINEAR, "area": Image.BOX,
                "nearest": Image.NEAREST}


class Encoder:
    """mmpost's Tokenizer::encode + encode_conversation (kLlava), over the same sentencepiece model."""

    def extend(self, ids, labels, chunk, sup):
        """Appends token ids, each <image> expanded to the patch count (label -100 there)."""
        for t in chunk:
            if t == self.image_token:
                ids += [t] * self.n_image_tokens
                labels += [-100] * self.n_image_tokens
            else:
                ids.append(t)
                labels.append(t if sup else -100)

    def __init__(self, path, image_token, n_image_tokens):
        self.sp = spm.SentencePieceProcessor(model_file=path)
        self.image_token, self.n_image_tokens = image_token, n_image_tokens
        self.n_unk = len(self.sp.encode(self.sp.id_to_piece(self.sp.unk_id())))

    def plain(self, text, prefix):
        if not text:
            return []
        if prefix:
            return self.sp.encode(text)
        return self.sp.encode(self.sp.id_to_piece(self.sp.unk_id()) + text)[self.n_unk:]

    def text(self, text, prefix):
        ids = []
        for i, chunk in enumerate(text.split("<image>")):
            if i:
                ids.append(self.image_token)
            ids += self.plain(chunk, prefix and i == 0)
        return ids

    def conversation(self, messages):
        segs = []  # (text, supervised, is_eos)
        for m in messages:
            if m["role"] in ("system", "user"):
                t = (m["content"] + " ") if m["role"] == "system" else ("USER: " + m["content"] + " ")
                if segs and not segs[-1][1] and not segs[-1][2]:
                    segs[-1] = (segs[-1][0] + t, False, False)
                else:
                    segs.append((t, False, False))
            else:
                if segs and not segs[-1][1] and not segs[-1][2]:
                    segs[-1] = (segs[-1][0] + "ASSISTANT:", False, False)
                else:
                    segs.append(("ASSISTANT:", False, False))
                segs += [(" " + m["content"], True, False), ("", True, True)]
        ids, labels, first = [self.sp.bos_id()], [-100], True
        for text, sup, eos in segs:
            chunk = [self.sp.eos_id()] if eos else self.text(text, first)
            if not eos:
                first = False
            self.extend(ids, labels, chunk, sup)
        return ids, labels


def pixel_values(path, size, img_cfg):
    im = Image.open(path).convert("RGB")
    w, h = im.size
    s = size / min(w, h)
    nw, nh = (size, int(size * h / w)) if w <= h else (int(size * w / h), size)
    if (nw, nh) != (w, h):
        im = im.resize((nw, nh), PIL_RESAMPLE.get(img_cfg["interpolation"], Image.BICUBIC))
    left, top = (nw - size) // 2, (nh - size) // 2
    im = im.crop((left, top, left + size, top + size))
    x = torch.from_numpy(np.asarray(im, dtype=np.float32) / 255.0).permute(2, 0, 1)
    mean = torch.tensor(img_cfg["image_mean"]).view(3, 1, 1)
    std = torch.tensor(img_cfg["image_std"]).view(3, 1, 1)
    return ((x - mean) / std).contiguous()


def make_batches(recipe, n_batches, root):
    mc = recipe["model"]["config"]
    vc = mc["vision_config"]
    n_img = (vc["image_size"] // vc["patch_size"]) ** 2  # "default" strategy drops CLS
    enc = Encoder(os.path.join(root, recipe["model"]["tokenizer"]), mc["image_token_index"], n_img)
    path = os.path.join(root, recipe["data"]["train"])
    base = os.path.dirname(path)
    records = [json.loads(l) for l in open(path) if l.strip()]
    B, pad = recipe["train"]["batch_size"], mc["text_config"].get("pad_token_id", 0)
    batches, k = [], 0
    for _ in range(n_batches):
        rows = []
        for _ in range(B):
            r = records[k % len(records)]
            k += 1
            ids, labels = enc.conversation(r["messages"])
            ids, labels = ids[: recipe["data"]["max_length"]], labels[: recipe["data"]["max_length"]]
            pix = [pixel_values(os.path.join(base, p), vc["image_size"], recipe["data"]["image"])
                   for p in r.get("images", [])]
            rows.append((ids, labels, pix))
        T = max(len(r[0]) for r in rows)
        input_ids = torch.full((B, T), pad, dtype=torch.long)
        labels = torch.full((B, T), -100, dtype=torch.long)
        mask = torch.zeros((B, T), dtype=torch.long)
        for i, (ids, lab, _) in enumerate(rows):
            input_ids[i, : len(ids)] = torch.tensor(ids)
            labels[i, : len(lab)] = torch.tensor(lab)
            mask[i, : len(ids)] = 1
        pix = torch.stack([p for r in rows for p in r[2]])
        batches.append(dict(input_ids=input_ids, attention_mask=mask, labels=labels, pixel_values=pix))
    return batches


def param_counts(model):
    c = {"total": 0, "vision_tower": 0, "projector": 0, "lm_embed": 0, "lm_other": 0}
    for name, p in model.named_parameters():
        c["total"] += p.numel()
        if "vision_tower" in name:
            c["vision_tower"] += p.numel()
        elif "multi_modal_projector" in name:
            c["projector"] += p.numel()
        elif "embed_tokens" in name:
            c["lm_embed"] += p.numel()
        else:
            c["lm_other"] += p.numel()  # decoder layers, final norm, lm_head
    return c


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--recipe", required=True, help="mmpost's resolved OUTPUT/recipe.json")
    p.add_argument("--root", default=".", help="repository root (recipe paths are relative to it)")
    a = p.parse_args()
    hf_logging.set_verbosity_error()
    recipe = json.load(open(a.recipe))
    tr, opt_cfg = recipe["train"], recipe["optim"]
    if recipe.get("num_threads", 0) > 0:
        torch.set_num_threads(recipe["num_threads"])
    rss_before_model = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    torch.manual_seed(recipe["seed"])
    model = LlavaForConditionalGeneration(LlavaConfig(**recipe["model"]["config"])).float().train()
    batches = make_batches(recipe, tr["max_steps"], a.root)
    decay = [q for q in model.parameters() if q.dim() >= 2]
    no_decay = [q for q in model.parameters() if q.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": opt_cfg["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}],
        lr=opt_cfg["lr"], betas=tuple(opt_cfg["betas"]), eps=opt_cfg["eps"],
        # HF Trainer / TRL default optim "adamw_torch_fused" on torch >= 2.8: the fused kernel.
        fused=opt_cfg.get("fused", True))
    params = list(model.parameters())

    windows, losses = [], []
    t_last, tokens, samples = time.perf_counter(), 0, 0
    for step, b in enumerate(batches, start=1):
        optimizer.zero_grad()
        out = model(**b)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(params, tr["clip_grad_norm"])
        optimizer.step()
        losses.append(out.loss.item())
        tokens += int(b["attention_mask"].sum())
        samples += b["input_ids"].shape[0]
        if step % tr["log_every_n_steps"] == 0 or step == len(batches):
            now = time.perf_counter()
            windows.append({"step": step, "tokens_per_s": tokens / (now - t_last),
                            "samples_per_s": samples / (now - t_last)})
            t_last, tokens, samples = now, 0, 0
    print(json.dumps({"windows": windows, "loss_first": losses[0], "loss_last": losses[-1],
                      "params": param_counts(model), "attn_implementation": model.config._attn_implementation,
                      "torch_threads": torch.get_num_threads(),
                      "tokens_per_sample": float(np.mean([int(b["attention_mask"].sum()) / b["input_ids"].shape[0] for b in batches])),
                      "maxrss_before_model_kb": rss_before_model,
                      "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))


if __name__ == "__main__":
    main()
