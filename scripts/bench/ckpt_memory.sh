#!/usr/bin/env bash
# Peak memory of one SFT step at 100M parameters (scripts/bench/sft-100m.json) without and with
# activation checkpointing, side by side in one invocation: /usr/bin/time -v maximum resident
# set of the whole process (model build, data, one step, final save), the step's loss and
# gradient norm (must be equal) and tokens/s.
# Usage: bash scripts/bench/ckpt_memory.sh     (about 5 minutes on 2 cores at batch 64)
# Env: BATCH (64), BENCH_OUT (/tmp/mmpost-bench-ckpt)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$ROOT"
BATCH=${BATCH:-64}
OUT=${BENCH_OUT:-/tmp/mmpost-bench-ckpt}
rm -rf "$OUT" && mkdir -p "$OUT"
echo "| batch $BATCH, 100M sft step | peak RSS (GB) | loss | grad_norm | tokens/s |"
echo "|---|---|---|---|---|"
for ck in false true; do
  /usr/bin/time -v build/mmpost sft --recipe scripts/bench/sft-100m.json --output "$OUT/$ck" \
    --no-resume --set train.batch_size="$BATCH" train.max_steps=1 train.log_every_n_steps=1 \
    train.save_every_n_steps=0 train.eval_every_n_steps=0 data.eval='""' \
    model.enable_activation_checkpointing=$ck >/dev/null 2>"$OUT/$ck.err"
  rss=$(grep -o 'Maximum resident set size (kbytes): [0-9]*' "$OUT/$ck.err" | grep -o '[0-9]*$')
  row=$(grep '"loss"' "$OUT/$ck/metrics.jsonl" | head -1)
  get() { echo "$row" | grep -o "\"$1\": *[0-9.e+-]*" | grep -o '[0-9.e+-]*$'; }
  echo "| activation checkpointing $ck | $(awk "BEGIN{printf \"%.2f\", $rss / 1e6}") | $(get loss) | $(get grad_norm) | $(get tokens_per_s) |"
done
