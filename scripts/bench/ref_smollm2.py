"""Reference side of scripts/bench/smollm2.sh: transformers on the same composed SmolLM2 VLM folder
that mmpost runs (LlavaForConditionalGeneration, float32, the default sdpa attention, the same
torch threads), as a transformers user runs it.

  generate: the prompts of a JSONL (ChatML via the folder's chat template, add_generation_prompt),
            batches of --batch-size left-padded, greedy, --max-new-tokens; prints new tokens/s.
  sft:      --steps AdamW steps (lr 1e-5, betas (0.9, 0.98), clip 1.0) on the conversations of a
            text-only JSONL in file order, --batch-size per step, right-padded, labels on the
            assistant replies (as mmpost builds them) with -100 elsewhere; prints tokens/s.
  tokenize: a text file cut into --chunk-byte pieces, encoded one by one with HF `tokenizers`
            (and with encode_batch, its parallel API); prints tokens/s.
One JSON line on stdout.
"""
import argparse
import json
import os
import time

import torch
from transformers import AutoTokenizer, LlavaForConditionalGeneration
from transformers.utils import logging as hf_logging


def records(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(l) for l in f if l.strip()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["generate", "sft", "tokenize"])
    ap.add_argument("--text", help="tokenize: UTF-8 text file, cut as mmpost bench-tokenize cuts it")
    ap.add_argument("--chunk", type=int, default=4096)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", help="generate / sft: JSONL")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    hf_logging.set_verbosity_error()
    if a.mode == "tokenize":  # HF tokenizers (Rust): encode one chunk at a time, and encode_batch
        from tokenizers import Tokenizer
        tk = Tokenizer.from_file(os.path.join(a.model, "tokenizer.json"))
        data = open(a.text, "rb").read()
        chunks, i = [], 0
        while i < len(data):
            n = min(a.chunk, len(data) - i)
            while i + n < len(data) and (data[i + n] & 0xC0) == 0x80:
                n += 1
            chunks.append(data[i:i + n].decode("utf-8"))
            i += n
        n_tok = sum(len(tk.encode(c, add_special_tokens=False).ids) for c in chunks)
        t0 = time.time()
        for _ in range(a.epochs):
            for c in chunks:
                tk.encode(c, add_special_tokens=False)
        single = time.time() - t0
        t0 = time.time()
        for _ in range(a.epochs):
            tk.encode_batch(chunks, add_special_tokens=False)
        batch = time.time() - t0
        print(json.dumps({"mode": "tokenize", "n_tokens": n_tok, "bytes": len(data),
                          "tokens_per_s": n_tok * a.epochs / single,
                          "batch_tokens_per_s": n_tok * a.epochs / batch}))
        return
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(a.model)
    model = LlavaForConditionalGeneration.from_pretrained(a.model, dtype=torch.float32)
    recs = records(a.data)
    if a.mode == "generate":
        model.eval()
        tok.padding_side = "left"
        texts = [tok.apply_chat_template([m for m in r["messages"] if m["role"] != "assistant"],
                                         tokenize=False, add_generation_prompt=True) for r in recs]
        t0, n_new = time.time(), 0
        for i in range(0, len(texts), a.batch_size):
            enc = tok(texts[i:i + a.batch_size], return_tensors="pt", padding=True, add_special_tokens=False)
            with torch.no_grad():
                out = model.generate(**enc, do_sample=False, max_new_tokens=a.max_new_tokens,
                                     pad_token_id=tok.pad_token_id)
            new = out[:, enc["input_ids"].shape[1]:]
            n_new += int((new != tok.pad_token_id).sum()) + int((new == tok.eos_token_id).any(1).sum())
        s = time.time() - t0
        print(json.dumps({"mode": "generate", "prompts": len(texts), "new_tokens": n_new, "seconds": s,
                          "new_tokens_per_s": n_new / s}))
        return
    # sft: labels on the assistant replies and their <|im_end|>, as mmpost's turn-by-turn build.
    model.train()
    rows = []
    for r in recs:
        ids, labels = [], []
        for k in range(len(r["messages"])):
            part = tok.apply_chat_template(r["messages"][: k + 1], tokenize=False)
            prev = tok.apply_chat_template(r["messages"][:k], tokenize=False) if k else ""
            piece = tok(part[len(prev):], add_special_tokens=False)["input_ids"]
            ids += piece
            sup = r["messages"][k]["role"] == "assistant"
            labels += piece if sup else [-100] * len(piece)
        rows.append((ids, labels))
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.0}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-5, betas=(0.9, 0.98), fused=True)  # HF/TRL adamw_torch_fused
    n_tok, t0 = 0, None
    for step in range(a.steps + 1):  # step 0 warms up and is not timed
        batch = [rows[(step * a.batch_size + j) % len(rows)] for j in range(a.batch_size)]
        T = max(len(x[0]) for x in batch)
        ids = torch.full((len(batch), T), tok.pad_token_id)
        lab = torch.full((len(batch), T), -100)
        mask = torch.zeros((len(batch), T), dtype=torch.long)
        for j, (x, y) in enumerate(batch):
            ids[j, : len(x)] = torch.tensor(x)
            lab[j, : len(y)] = torch.tensor(y)
            mask[j, : len(x)] = 1
        loss = model(input_ids=ids, attention_mask=mask, labels=lab).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step == 0:
            t0 = time.time()
        else:
            n_tok += int(mask.sum())
    s = time.time() - t0
    print(json.dumps({"mode": "sft", "steps": a.steps, "tokens": n_tok, "seconds": s, "tokens_per_s": n_tok / s,
                      "final_loss": float(loss)}))


if __name__ == "__main__":
    main()
