#!/usr/bin/env bash
# LoRA against full fine-tuning on the real SmolLM2-135M-Instruct (the language model of a VLM
# folder from `mmpost init`), CPU float32, the same recipe and data for both: sft steps of batch
# 8 on data/instruct-text/heldout.jsonl. The two runs alternate (full, lora, full, ...) REPEATS
# times in this one invocation. For each: trainable parameters (from the stage's log), peak RSS
# of the whole process (/usr/bin/time -v, model load and the final save included), tokens/s of
# the steps after the first (in-process), and the loss of the last step.
# Usage: bash scripts/bench/lora_smollm2.sh     (about 10 minutes on 2 cores)
# Env: REPEATS (3), THREADS (2), STEPS (10), RANK (16), TARGETS (q,k,v,o as JSON list),
#      BENCH_OUT (/tmp/mmpost-bench-lora)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$ROOT"
REPEATS=${REPEATS:-3}
THREADS=${THREADS:-2}
STEPS=${STEPS:-10}
RANK=${RANK:-16}
TARGETS=${TARGETS:-'["q_proj","k_proj","v_proj","o_proj"]'}
OUT=${BENCH_OUT:-/tmp/mmpost-bench-lora}
LR=1e-4
source "$ROOT/scripts/bench/smollm2_common.sh"
rows="$OUT/rows.jsonl"
for r in $(seq 1 "$REPEATS"); do
  for mode in full lora; do
    set_lora=()
    [[ $mode == lora ]] && set_lora=(--set "lora.r=$RANK" --set "lora.alpha=$((2 * RANK))" --set "lora.target_modules=$TARGETS")
    rm -rf "$OUT/$mode"
    /usr/bin/time -v "$MMPOST" sft --recipe "$OUT/sft.json" --output "$OUT/$mode" --no-resume \
      "${set_lora[@]}" > /dev/null 2> "$OUT/$mode.err"
    "$PY" - "$mode" "$OUT/$mode.err" "$OUT/$mode/metrics.jsonl" >> "$rows" <<'PY'
import json, re, sys
mode, err, metrics = sys.argv[1:]
log = open(err).read()
m = re.search(r"model (\d+) parameters, (\d+) trainable", log)  # adapters included
trainable = int(m.group(2))
rss_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", log).group(1))
steps = [json.loads(l) for l in open(metrics) if '"loss"' in l]
tok_s = sum(s["tokens_per_s"] for s in steps[1:]) / len(steps[1:])
print(json.dumps({"mode": mode, "params": int(m.group(1)), "trainable": trainable,
                  "peak_rss_gb": rss_kb / 1e6, "tokens_per_s": tok_s, "last_loss": steps[-1]["loss"]}))
PY
  done
  echo "[bench $(date +%T)] repeat $r/$REPEATS done" >&2
done
"$PY" - "$rows" "$RANK" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
full = [r for r in rows if r["mode"] == "full"]
lora = [r for r in rows if r["mode"] == "lora"]
med = lambda rs, k: statistics.median(r[k] for r in rs)
print(f"| SmolLM2-135M sft, CPU fp32, batch 8 | full fine-tuning | LoRA r={sys.argv[2]} | LoRA / full (median of pairs) |")
print("|---|---|---|---|")
print(f"| trainable parameters | {full[0]['trainable']:,} | {lora[0]['trainable']:,} | {lora[0]['trainable'] / full[0]['trainable']:.4f} |")
for k, name in (("peak_rss_gb", "peak RSS (GB)"), ("tokens_per_s", "tokens/s")):
    ratio = statistics.median(l[k] / f[k] for f, l in zip(full, lora))
    lo = min(l[k] / f[k] for f, l in zip(full, lora)); hi = max(l[k] / f[k] for f, l in zip(full, lora))
    print(f"| {name} | {med(full, k):.3f} | {med(lora, k):.3f} | {ratio:.2f} ({lo:.2f}-{hi:.2f}) |")
print(f"| loss after the last step | {med(full, 'last_loss'):.4f} | {med(lora, 'last_loss'):.4f} | |")
PY
