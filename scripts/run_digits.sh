#!/usr/bin/env bash
# The main job from README.md, end to end on the bundled real data: setup if needed, SFT of a
# LLaVA-style VLM from random initialisation on data/digits-vqa (train split), then greedy eval
# on the held-out test split. Prints the eval JSON (accuracy) as the last stdout line.
#   OUT=runs/digits-sft   output folder;  extra arguments go to `mmpost sft` (e.g. --set ...)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
OUT=${OUT:-runs/digits-sft}
./build/mmpost sft --recipe recipes/digits-sft.json --output "$OUT" --no-resume "$@"
./build/mmpost eval --model "$OUT" --data data/digits-vqa/test.jsonl --out "$OUT/test_predictions.jsonl"
