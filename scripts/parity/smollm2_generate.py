#!/usr/bin/env python3
"""mmpost vs transformers on the real SmolLM2-135M-Instruct (issue 12's "must show").

For N text prompts (ChatML through the checkpoint's chat template) this runs:
  * transformers: LlamaForCausalLM (float32, its default sdpa attention) from the dequantized folder,
    greedy `generate(max_new_tokens=32)`, one prompt at a time;
  * mmpost: `mmpost init` (a LLaVA folder on that language model, new vision tower), then
    `mmpost generate --temperature 0 --max-new-tokens 32` on the same prompts, and
    `mmpost inspect forward` on prompt + transformers' completion (teacher forcing).
It checks: the rendered prompt text is transformers', the completions are token-identical, and
the logits at every position of each sequence are within --atol of transformers' (over the
language model's 49,152 ids; the composed model's extra <image> row is not compared). mmpost
runs once per CPU GEMM library (--gemm, MMPOST_CPU_GEMM): on BLAS, the library transformers'
nn.Linear uses, the logits must be within --atol; on oneDNN (another summation order through
30 layers) within --atol-onednn; the tokens must be identical on both.
Prints one JSON summary on stdout; exits 1 on a mismatch, 0 when everything matches.

    .venv/bin/python scripts/parity/smollm2_generate.py --model DIR --mmpost build/mmpost
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoTokenizer, LlamaForCausalLM

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis in one sentence.",
    "List three prime numbers greater than 10.",
    "Translate 'good morning' into Spanish.",
    "What is 12 times 12?",
    "Give me a synonym for 'happy'.",
    "Who wrote Romeo and Juliet?",
    "Describe a cat to someone who has never seen one.",
    "What does a compiler do?",
    "Name the planets of the solar system.",
    "How do I boil an egg?",
    "Write a Python function that adds two numbers.",
    "What is the boiling point of water in Fahrenheit?",
    "Summarize the plot of Cinderella in two sentences.",
    "Why is the sky blue?",
    "Suggest a name for a pet turtle.",
    "What is the difference between weather and climate?",
    "Count from one to ten in French.",
    "Tell me a fun fact about octopuses.",
    "Quelle est la capitale de l'Allemagne ?",
    "What is 7 + 15? Answer with a number.",
    "Give two tips for learning to play the guitar.",
    "¿Cuál es el río más largo del mundo?",
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="dequantized SmolLM2 folder (scripts/get_smollm2.py)")
    ap.add_argument("--mmpost", required=True, help="the mmpost binary")
    ap.add_argument("--n", type=int, default=len(PROMPTS), help="prompts (default all 24)")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--atol", type=float, default=1e-4)
    ap.add_argument("--atol-onednn", type=float, default=5e-4)
    ap.add_argument("--gemm", nargs="+", default=["blas", "onednn"], choices=["blas", "onednn"],
                    help="mmpost's CPU GEMM libraries to check (MMPOST_CPU_GEMM)")
    ap.add_argument("--work", default=None, help="work folder (default: a temporary one)")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    work = args.work or tempfile.mkdtemp(prefix="mmpost_smollm2_")
    os.makedirs(work, exist_ok=True)
    prompts = PROMPTS[: args.n]

    tok = AutoTokenizer.from_pretrained(args.model)
    lm = LlamaForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    # transformers against itself (eager vs sdpa attention): the floor of float32 differences.
    lm_eager = LlamaForCausalLM.from_pretrained(args.model, dtype=torch.float32,
                                                attn_implementation="eager").eval()
    hf = []
    t0 = time.time()
    for p in prompts:
        msgs = [{"role": "user", "content": p}]
        text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        ids = tok(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            out = lm.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                              max_new_tokens=args.max_new_tokens, pad_token_id=tok.pad_token_id)
        hf.append({"text": text, "prompt_ids": ids[0].tolist(), "new": out[0, ids.shape[1]:].tolist()})
    hf_gen_s = time.time() - t0

    # mmpost: compose, generate, teacher-forced logits.
    composed = os.path.join(work, "smolvlm")
    vision = {"vision_config": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                                "num_attention_heads": 4, "image_size": 32, "patch_size": 8}}
    subprocess.run([args.mmpost, "init", "--language-model", args.model, "--config", json.dumps(vision),
                    "--out", composed, "--force"], check=True, stdout=subprocess.DEVNULL)
    data = os.path.join(work, "prompts.jsonl")
    with open(data, "w", encoding="utf-8") as f:
        for i, p in enumerate(prompts):
            f.write(json.dumps({"id": str(i), "messages": [{"role": "user", "content": p}]},
                               ensure_ascii=False) + "\n")
    # Teacher forcing on prompt + transformers' completion: each sequence alone, as transformers
    # runs it, and (for information) all of them right-padded in one batch, where other GEMM
    # blockings give float32 differences of the size of transformers' own eager vs sdpa.
    seqs = [h["prompt_ids"] + h["new"] for h in hf]
    V = lm.config.vocab_size
    refs, floor = [], 0.0
    for s in seqs:
        one = torch.tensor([s])
        with torch.no_grad():
            ref = lm(one).logits[0]
            floor = max(floor, (lm_eager(one).logits[0] - ref).abs().max().item())
        refs.append(ref)
    T = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), T), tok.pad_token_id, dtype=torch.int64)
    mask = torch.zeros((len(seqs), T), dtype=torch.int64)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1

    def check(gemm):
        env = dict(os.environ, MMPOST_CPU_GEMM=gemm)
        t0 = time.time()
        gen = subprocess.run([args.mmpost, "generate", "--model", composed, "--data", data, "--temperature", "0",
                              "--max-new-tokens", str(args.max_new_tokens), "--batch-size", "1"],
                             check=True, capture_output=True, text=True, env=env)
        gen_s = time.time() - t0
        mm = {}
        for line in gen.stdout.splitlines():
            j = json.loads(line)
            mm[int(j["id"])] = j

        def mmpost_logits(ids, mask, name):
            save_file({"input_ids": ids, "attention_mask": mask}, os.path.join(work, name + ".in.safetensors"))
            subprocess.run([args.mmpost, "inspect", "forward", composed, "--inputs",
                            os.path.join(work, name + ".in.safetensors"), "--out",
                            os.path.join(work, name + ".out.safetensors")], check=True,
                           stdout=subprocess.DEVNULL, env=env)
            return load_file(os.path.join(work, name + ".out.safetensors"))["logits"]

        batched = mmpost_logits(ids, mask, "batched")
        rows, worst, worst_batched = [], 0.0, 0.0
        for i, h in enumerate(hf):
            m = mm.get(i)
            one = torch.tensor([seqs[i]])
            diff = (mmpost_logits(one, torch.ones_like(one), "one")[0, :, :V] - refs[i]).abs().max().item()
            worst = max(worst, diff)
            worst_batched = max(worst_batched, (batched[i, : len(seqs[i]), :V] - refs[i]).abs().max().item())
            rows.append({
                "prompt": prompts[i],
                "prompt_text_equal": m is not None and m["prompt"] == h["text"],
                "tokens_equal": m is not None and m["tokens"] == h["new"],
                "n_new": len(h["new"]),
                "max_abs_logit_diff": diff,
                "transformers": tok.decode(h["new"]),
                "mmpost": m["completion"] if m else None,
            })
        atol = args.atol if gemm == "blas" else args.atol_onednn
        ok = all(r["prompt_text_equal"] and r["tokens_equal"] for r in rows) and worst <= atol
        return {
            "prompts": len(rows),
            "token_identical": sum(r["tokens_equal"] for r in rows),
            "prompt_text_identical": sum(r["prompt_text_equal"] for r in rows),
            "new_tokens": sum(r["n_new"] for r in rows),
            "max_abs_logit_diff": worst,
            "atol": atol,
            "batched_padded_max_abs_logit_diff": worst_batched,
            "mmpost_generate_incl_load_s": round(gen_s, 1),
            "ok": ok,
            "rows": rows,
        }

    by_gemm = {g: check(g) for g in args.gemm}
    ok = all(r["ok"] for r in by_gemm.values())
    summary = {
        "ok": ok,
        "transformers_eager_vs_sdpa_max_abs_logit_diff": floor,
        "by_cpu_gemm": {g: {k: v for k, v in r.items() if k != "rows"} for g, r in by_gemm.items()},
        "transformers_generate_s": round(hf_gen_s, 1),
        "rows": {g: r["rows"] for g, r in by_gemm.items()},
    }
    rows = [r for g in by_gemm.values() for r in g["rows"]]
    print(json.dumps(summary, ensure_ascii=False, indent=1))
    for r in rows:
        if not (r["prompt_text_equal"] and r["tokens_equal"]):
            print(f"MISMATCH: {r['prompt']!r}\n  transformers: {r['transformers']!r}\n  mmpost:       {r['mmpost']!r}",
                  file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
