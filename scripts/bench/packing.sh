#!/usr/bin/env bash
# Packing benchmark (issue 14): `mmpost sft` on a mixed-length set (the digits with 1-6 turns
# per conversation, scripts/bench/make_mixed_digits.py) with data.packing off and on, the two
# runs interleaved (off, on, off, on, ...) in this one invocation. Prints per run the mean
# tokens/s (real tokens, padding not counted) and padding fraction of the logged windows, and the
# median on/off ratio over the pairs.
# Usage: bash scripts/bench/packing.sh   (about 3 minutes on 2 cores)
# Env: PAIRS (3), STEPS (120), THREADS (2), BENCH_OUT (/tmp/mmpost-bench-packing)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$ROOT"
OUT="${BENCH_OUT:-/tmp/mmpost-bench-packing}"
PAIRS="${PAIRS:-3}"
STEPS="${STEPS:-120}"
THREADS="${THREADS:-2}"
MMPOST="$ROOT/build/mmpost"
[[ -x "$MMPOST" ]] || { echo "no $MMPOST: bash scripts/setup.sh" >&2; exit 2; }
rm -rf "$OUT" && mkdir -p "$OUT"
python3 scripts/bench/make_mixed_digits.py "$OUT/data"
run() {  # name packing
  local dir="$OUT/$1"
  rm -rf "$dir"
  "$MMPOST" sft -r recipes/digits-sft.json --no-resume --output "$dir" \
    --set data.train="$OUT/data/train.jsonl" data.eval= data.max_length=160 \
          model.config.text_config.max_position_embeddings=160 \
          train.max_steps="$STEPS" train.log_every_n_steps=20 train.save_every_n_steps=0 \
          train.eval_every_n_steps=0 num_threads="$THREADS" data.packing="$2" \
    2>"$dir.log" >/dev/null
  # Mean over the logged windows after the first (warm-up).
  python3 - "$dir/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"tokens_per_s"' in l and '"loss"' in l][1:]
tps = sum(r["tokens_per_s"] for r in rows) / len(rows)
pad = sum(r["padding_fraction"] for r in rows) / len(rows)
print(f"{tps:.1f} {pad:.4f}")
PY
}
ratios=()
printf '%-6s %-8s %12s %10s\n' pair packing tokens/s padding
for i in $(seq 1 "$PAIRS"); do
  read -r off_tps off_pad < <(run "off_$i" false)
  read -r on_tps on_pad < <(run "on_$i" true)
  printf '%-6s %-8s %12s %10s\n' "$i" off "$off_tps" "$off_pad"
  printf '%-6s %-8s %12s %10s\n' "$i" on "$on_tps" "$on_pad"
  ratios+=("$(python3 -c "print(f'{$on_tps / $off_tps:.3f}')")")
done
echo "on/off tokens/s per pair: ${ratios[*]}"
python3 -c "import statistics,sys; print('median on/off:', statistics.median(map(float, sys.argv[1:])))" "${ratios[@]}"
