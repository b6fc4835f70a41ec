#!/usr/bin/env bash
# Times the validation pass (every record parsed, checked and tokenized, image files stat'ed,
# before step 1) on a 1,000,000-line SFT file: data/digits-vqa/train.jsonl repeated, with one
# malformed line in 10,000, under data.on_bad_sample=skip. Prints the pass's log line.
# Usage: bash scripts/bench/validate_1m.sh [BUILD_DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
ln -s "$root/data/digits-vqa/images" "$work/images"
python3 - "$root/data/digits-vqa/train.jsonl" "$work/train.jsonl" <<'PY'
import sys
rows = [l for l in open(sys.argv[1]) if l.strip()]
with open(sys.argv[2], "w") as out:
    for i in range(1_000_000):
        out.write("{broken\n" if i % 10_000 == 9_999 else rows[i % len(rows)])
PY
ls -la "$work/train.jsonl" | awk '{print "file bytes:", $5}'
# max_steps=1: the pass runs in full, then one step.
"$build/mmpost" sft -r "$root/recipes/tiny/sft-tiny.json" --output "$work/out" --set \
  data.train="$work/train.jsonl" data.eval='""' data.on_bad_sample=skip train.max_steps=1 \
  data.num_workers=2 2>&1 | grep -E "sft: checked|records will be skipped" | head -2
