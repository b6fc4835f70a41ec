#!/usr/bin/env bash
# GRPO demonstration on the bundled real data (issue 5): visual arithmetic on data/digits-math
# with verifiable rewards. Steps:
#   1. the digits-vqa SFT model (runs/digits-sft, trained on the digits-vqa train split only)
#      if it is missing: its vision tower reads single 8x8 digits;
#   2. split each digits-math composite into one 8x8 image per digit
#      (scripts/split_digits_math.py -> runs/digits-math-split);
#   3. a short SFT warm start from runs/digits-sft on the 400 worked examples (sft.jsonl,
#      recipes/digits-math-sft.json), well below saturation;
#   4. greedy eval before: in-distribution test (2-3 digit sums, unseen digit images) and OOD
#      (4-digit sums, 2-digit products), rewards numeric_match + format;
#   5. GRPO on the 2000 train prompts (recipes/digits-grpo.json: rewards numeric_match + 0.2 format,
#      G 8, staged curriculum difficulty 2 then 2+3);
#   6. the same evals after.
# Prints {"test_before", "test_after", "ood_before", "ood_after"} (numeric_match means) as the
# last stdout line.
#   SFT_OUT=runs/digits-math-sft   OUT=runs/digits-grpo   SPLIT=runs/digits-math-split
#   NUM_THREADS=0            torch CPU threads for every stage (0 = default)
#   MMPOST=./build/mmpost    binary;  SKIP_SETUP=1 skips scripts/setup.sh (e.g. with a copied binary)
#   extra arguments go to `mmpost rlhf` (e.g. --set optim.lr=5e-5)
set -euo pipefail
cd "$(dirname "$0")/.."
[[ "${SKIP_SETUP:-0}" == 1 ]] || bash scripts/setup.sh
SFT_OUT=${SFT_OUT:-runs/digits-math-sft}
OUT=${OUT:-runs/digits-grpo}
SPLIT=${SPLIT:-runs/digits-math-split}
NUM_THREADS=${NUM_THREADS:-0}
MMPOST=${MMPOST:-./build/mmpost}
PY=.venv/bin/python
T=(--set "num_threads=$NUM_THREADS")
numeric() { tail -n 1 | "$PY" -c 'import json, sys; print(json.loads(sys.stdin.read())["rewards/numeric_match"])'; }
evaluate() {  # model split tag
  "$MMPOST" eval --model "$1" --data "$SPLIT/$2.jsonl" --max-new-tokens 24 \
    --reward numeric_match --reward format --num-threads "$NUM_THREADS" \
    --out "$OUT/${2}_predictions_$3.jsonl" | tee "$OUT/eval_${2}_$3.log" | numeric
}

if [[ ! -f runs/digits-sft/model.safetensors ]]; then
  "$MMPOST" sft --recipe recipes/digits-sft.json --output runs/digits-sft --no-resume "${T[@]}"
fi
"$PY" scripts/split_digits_math.py --src data/digits-math --out "$SPLIT"
"$MMPOST" sft --recipe recipes/digits-math-sft.json --set "data.train=$SPLIT/sft.jsonl" "${T[@]}" \
  --output "$SFT_OUT" --no-resume
mkdir -p "$OUT"
test_before=$(evaluate "$SFT_OUT" test before)
ood_before=$(evaluate "$SFT_OUT" ood before)
"$MMPOST" rlhf --recipe recipes/digits-grpo.json --set "model.path=$SFT_OUT" \
  --set "data.train=$SPLIT/train.jsonl" --set "data.eval=$SPLIT/test.jsonl" "${T[@]}" \
  --output "$OUT" --no-resume "$@"
test_after=$(evaluate "$OUT" test after)
ood_after=$(evaluate "$OUT" ood after)
echo "{\"test_before\": $test_before, \"test_after\": $test_after, \"ood_before\": $ood_before, \"ood_after\": $ood_after}"
