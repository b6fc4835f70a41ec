#!/usr/bin/env bash
# Regenerates docs/report.png, the README's picture of `mmpost report`: the digits SFT recipe at
# two learning rates (the recipe's 2e-3, and 5e-3 for 1,500 steps), reported together and rendered
# by headless Chromium. About 5 minutes on 2 cores; rerunning reuses finished runs.
#   MMPOST_BIN=build/mmpost   the binary;   OUT=runs/report-demo   where the runs go
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${MMPOST_BIN:-build/mmpost}
OUT=${OUT:-runs/report-demo}
"$BIN" sft -r recipes/digits-sft.json --output "$OUT/sft-lr2e-3" > /dev/null
"$BIN" sft -r recipes/digits-sft.json --set optim.lr=5e-3 --set train.max_steps=1500 \
  --output "$OUT/sft-lr5e-3" > /dev/null
"$BIN" report "$OUT/sft-lr2e-3" "$OUT/sft-lr5e-3" --out "$OUT/report.html"
mkdir -p docs
chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1400,1500 \
  --screenshot="$PWD/docs/report.png" "file://$PWD/$OUT/report.html" 2> /dev/null
echo "docs/report.png written from $OUT/report.html" >&2
