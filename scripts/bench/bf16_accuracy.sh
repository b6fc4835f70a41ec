#!/usr/bin/env bash
# bf16 mixed precision against float32 on the main job: recipes/digits-sft.json (2,500 steps
# of batch 32 from random initialisation), each arm then greedily evaluated on the held-out
# test split (360 images), per seed, arms alternating. Prints a markdown table: accuracy on the
# test split, last logged loss, median tokens/s over the logged windows, whole-process wall time
# and peak RSS (/usr/bin/time -v).
# Mixed precision (`mixed_precision=bf16`): bf16 matmuls and attention under autocast, float32
# master weights, gradients and AdamW state, loss in float32. It needs a CPU with native bf16
# (AVX512-BF16 / AMX) or a GPU to be fast; elsewhere oneDNN emulates it, about 10x slower.
# Usage: bash scripts/bench/bf16_accuracy.sh   (about 6 minutes per seed on 2 cores with AMX)
# Env: SEEDS ("42"), STEPS (2500), DEVICE (cpu), BENCH_OUT (/tmp/mmpost-bench-bf16)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$ROOT"
SEEDS=${SEEDS:-42}
STEPS=${STEPS:-2500}
DEVICE=${DEVICE:-cpu}
OUT=${BENCH_OUT:-/tmp/mmpost-bench-bf16}
rm -rf "$OUT" && mkdir -p "$OUT"
echo "| seed | arm | test accuracy | last loss | tokens/s (median of windows) | wall s | peak RSS (MB) |"
echo "|---|---|---|---|---|---|---|"
for seed in $SEEDS; do
  for arm in fp32 bf16; do
    extra=()
    [[ $arm == bf16 ]] && extra=(mixed_precision=bf16)
    run="$OUT/$arm-$seed"
    t0=$(date +%s.%N)
    /usr/bin/time -v build/mmpost sft --recipe recipes/digits-sft.json --output "$run" \
      --no-resume --device "$DEVICE" --set seed="$seed" train.max_steps="$STEPS" \
      train.save_every_n_steps=0 "${extra[@]}" >"$run.out" 2>"$run.err"
    t1=$(date +%s.%N)
    rss=$(grep -o 'Maximum resident set size (kbytes): [0-9]*' "$run.err" | grep -o '[0-9]*$')
    build/mmpost eval --model "$run" --data data/digits-vqa/test.jsonl --device "$DEVICE" \
      >"$run.eval.json" 2>"$run.eval.err"
    acc=$(tail -1 "$run.eval.json" | grep -o '"accuracy": *[0-9.e+-]*' | grep -o '[0-9.e+-]*$')
    python3 - "$run/metrics.jsonl" "$seed" "$arm" "$acc" "$t0" "$t1" "$rss" <<'EOF'
import json, statistics, sys
path, seed, arm, acc, t0, t1, rss = sys.argv[1:]
rows = [json.loads(l) for l in open(path) if '"loss"' in l]
rows = [r for r in rows if "tokens_per_s" in r]
tps = statistics.median(r["tokens_per_s"] for r in rows[1:] or rows)
print(f"| {seed} | {arm} | {float(acc):.3f} | {rows[-1]['loss']:.3g} | {tps:.0f} | "
      f"{float(t1) - float(t0):.0f} | {int(rss) / 1e3:.0f} |")
EOF
  done
done
