#!/usr/bin/env bash
# DPO demonstration on the bundled real data (issue 4): a short SFT of the digits recipe (below its
# best accuracy), greedy eval on the held-out test split, on-policy preference pairs from the
# model's own mistakes on the train split (scripts/make_digits_preferences.py, balanced mode), DPO
# (recipes/digits-dpo.json: sigmoid + RPO NLL term), greedy eval on test again. Prints
# {"before": acc, "after": acc} as the last stdout line.
#   SFT_STEPS=300            steps of the short SFT (the full recipe's 2500 reach ~0.95)
#   SFT_OUT=runs/digits-sft-short   OUT=runs/digits-dpo   output folders
#   NUM_THREADS=0            torch CPU threads for every stage (0 = default)
#   MMPOST=./build/mmpost    binary;  SKIP_SETUP=1 skips scripts/setup.sh (e.g. with a copied binary)
#   extra arguments go to `mmpost dpo` (e.g. --set dpo.beta=1.0)
set -euo pipefail
cd "$(dirname "$0")/.."
[[ "${SKIP_SETUP:-0}" == 1 ]] || bash scripts/setup.sh
SFT_STEPS=${SFT_STEPS:-300}
SFT_OUT=${SFT_OUT:-runs/digits-sft-short}
OUT=${OUT:-runs/digits-dpo}
NUM_THREADS=${NUM_THREADS:-0}
MMPOST=${MMPOST:-./build/mmpost}
PY=.venv/bin/python
T=(--set "num_threads=$NUM_THREADS")
accuracy() { tail -n 1 | "$PY" -c 'import json, sys; print(json.loads(sys.stdin.read())["accuracy"])'; }

"$MMPOST" sft --recipe recipes/digits-sft.json --set "train.max_steps=$SFT_STEPS" "${T[@]}" \
  --output "$SFT_OUT" --no-resume
mkdir -p "$OUT"
before=$("$MMPOST" eval --model "$SFT_OUT" --data data/digits-vqa/test.jsonl --num-threads "$NUM_THREADS" \
  --out "$OUT/test_predictions_before.jsonl" | accuracy)
for split in train val; do
  "$MMPOST" eval --model "$SFT_OUT" --data "data/digits-vqa/$split.jsonl" --num-threads "$NUM_THREADS" \
    --out "$OUT/${split}_predictions.jsonl" >/dev/null
  "$PY" scripts/make_digits_preferences.py --data "data/digits-vqa/$split.jsonl" \
    --predictions "$OUT/${split}_predictions.jsonl" --out "$OUT/prefs_$split.jsonl"
done
# --no-resume starts from scratch but keeps the pairs just written in $OUT. The reference log-prob
# caches go: mmpost dpo keys them by paths + file size, not contents, so a retrained $SFT_OUT or
# same-size new pairs would silently reuse stale values.
rm -f "$OUT/ref_logps.safetensors" "$OUT/ref_logps_eval.safetensors"
"$MMPOST" dpo --recipe recipes/digits-dpo.json --set "model.path=$SFT_OUT" \
  --set "data.train=$OUT/prefs_train.jsonl" --set "data.eval=$OUT/prefs_val.jsonl" "${T[@]}" \
  --output "$OUT" --no-resume "$@"
after=$("$MMPOST" eval --model "$OUT" --data data/digits-vqa/test.jsonl --num-threads "$NUM_THREADS" \
  --out "$OUT/test_predictions_after.jsonl" | accuracy)
echo "{\"before\": $before, \"after\": $after}"
