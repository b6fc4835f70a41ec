#!/usr/bin/env bash
# mmpost vs transformers on the real SmolLM2-135M-Instruct (as the language model of a VLM folder
# from `mmpost init`; the same folder for both), CPU float32, the same torch threads:
#   generate: the 40 prompts of data/instruct-text/heldout.jsonl, batches of 8, greedy, 32 new
#             tokens (mmpost generate vs LlavaForConditionalGeneration.generate);
#   tokenize: 3 MB of Debian-packaged text through SmolLM2's tokenizer.json (mmpost
#             bench-tokenize vs HF tokenizers' encode per chunk and encode_batch);
#   sft:      full fine-tuning steps of batch 8 on the same text conversations (mmpost sft vs a
#             plain PyTorch AdamW loop over transformers' model, scripts/bench/ref_smollm2.py).
# The pairs run interleaved (mmpost, transformers, mmpost, ...) REPEATS times in this one
# invocation; the ratio is taken pair by pair and the median printed, with each side's
# in-process throughput (model loading excluded), whole-process wall time and peak RSS
# (GNU time's maximum resident set size of each process).
# Usage: bash scripts/bench/smollm2.sh      (about 10 minutes on 2 cores)
# Env: REPEATS (3), THREADS (2), STEPS (10), BENCH_OUT (/tmp/mmpost-bench-smollm2)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$ROOT"
REPEATS=${REPEATS:-3}
THREADS=${THREADS:-2}
STEPS=${STEPS:-10}
OUT=${BENCH_OUT:-/tmp/mmpost-bench-smollm2}
LR=1e-5
source "$ROOT/scripts/bench/smollm2_common.sh"
now() { date +%s.%N; }
TIME=/usr/bin/time
[[ -x "$TIME" ]] || { echo "needs GNU time: apt-get install time" >&2; exit 2; }
rss_mb() { awk -F: '/Maximum resident set size/ {printf "%.1f", $2 / 1024}' "$1"; }  # GNU time -v file -> MB
rows="$OUT/rows.jsonl"
"$PY" -c 'import sys; sys.path.insert(0, "scripts/parity"); import smollm2_tokenizer as t; open(sys.argv[1], "w", encoding="utf-8").write("".join(t.debian_text(3_000_000)))' "$OUT/corpus.txt"
for r in $(seq 1 "$REPEATS"); do
  # tokenize (one thread each; tokenizers' encode_batch uses all cores)
  mm=$("$MMPOST" bench-tokenize --tokenizer "$LM/tokenizer.json" --text "$OUT/corpus.txt" --epochs 2)
  ref=$("$PY" scripts/bench/ref_smollm2.py tokenize --model "$LM" --text "$OUT/corpus.txt" --epochs 2)
  echo "{\"bench\": \"tokenize\", \"mmpost\": $mm, \"ref\": $ref}" >> "$rows"
  # generate
  t0=$(now)
  $TIME -v -o "$OUT/gen.mm.time" "$MMPOST" generate --model "$OUT/vlm" --data "$DATA" --temperature 0 --max-new-tokens 32 \
    --batch-size 8 > "$OUT/gen.jsonl" 2> "$OUT/gen.err"
  t1=$(now)
  mm=$(grep -o '[0-9.]* tokens/s' "$OUT/gen.err" | tail -1 | cut -d' ' -f1)
  ref=$(OMP_NUM_THREADS=$THREADS $TIME -v -o "$OUT/gen.ref.time" "$PY" scripts/bench/ref_smollm2.py generate --model "$OUT/vlm" \
          --data "$DATA" --threads "$THREADS")
  t2=$(now)
  echo "{\"bench\": \"generate\", \"mmpost_tok_s\": $mm, \"mmpost_wall_s\": $(awk "BEGIN{print $t1 - $t0}"), \"ref\": $ref, \"ref_wall_s\": $(awk "BEGIN{print $t2 - $t1}"), \"mmpost_rss_mb\": $(rss_mb "$OUT/gen.mm.time"), \"ref_rss_mb\": $(rss_mb "$OUT/gen.ref.time")}" >> "$rows"
  # sft
  t0=$(now)
  rm -rf "$OUT/sft"
  $TIME -v -o "$OUT/sft.mm.time" "$MMPOST" sft --recipe "$OUT/sft.json" --output "$OUT/sft" --no-resume >/dev/null 2> "$OUT/sft.err"
  t1=$(now)
  mm=$("$PY" -c 'import json,sys; r=[json.loads(l) for l in open(sys.argv[1]) if "loss" in l][1:]; print(sum(x["tokens_per_s"] for x in r)/len(r))' "$OUT/sft/metrics.jsonl")
  ref=$(OMP_NUM_THREADS=$THREADS $TIME -v -o "$OUT/sft.ref.time" "$PY" scripts/bench/ref_smollm2.py sft --model "$OUT/vlm" \
          --data "$DATA" --threads "$THREADS" --steps "$STEPS")
  t2=$(now)
  echo "{\"bench\": \"sft\", \"mmpost_tok_s\": $mm, \"mmpost_wall_s\": $(awk "BEGIN{print $t1 - $t0}"), \"ref\": $ref, \"ref_wall_s\": $(awk "BEGIN{print $t2 - $t1}"), \"mmpost_rss_mb\": $(rss_mb "$OUT/sft.mm.time"), \"ref_rss_mb\": $(rss_mb "$OUT/sft.ref.time")}" >> "$rows"
  echo "[bench $(date +%T)] repeat $r/$REPEATS done" >&2
done
"$PY" - "$rows" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
tk = [r for r in rows if r["bench"] == "tokenize"]
rows = [r for r in rows if r["bench"] != "tokenize"]
print("| SmolLM2-135M, CPU fp32 | mmpost | transformers | speed-up of mmpost (median of pairs) |")
print("|---|---|---|---|")
for b, key in (("generate", "new_tokens_per_s"), ("sft", "tokens_per_s")):
    rs = [r for r in rows if r["bench"] == b]
    mm = [r["mmpost_tok_s"] for r in rs]
    ref = [r["ref"][key] for r in rs]
    ratio = statistics.median(m / f for m, f in zip(mm, ref))
    wall = statistics.median(r["ref_wall_s"] / r["mmpost_wall_s"] for r in rs)
    unit = "new tokens/s" if b == "generate" else "tokens/s (SFT step)"
    print(f"| {b}: {unit} | {statistics.median(mm):.1f} | {statistics.median(ref):.1f} | {ratio:.2f}x |")
    print(f"| {b}: whole-process wall s (incl. start-up, load) | {statistics.median(r['mmpost_wall_s'] for r in rs):.1f} | "
          f"{statistics.median(r['ref_wall_s'] for r in rs):.1f} | {wall:.2f}x |")
    rss = statistics.median(r["mmpost_rss_mb"] / r["ref_rss_mb"] for r in rs)
    print(f"| {b}: peak RSS MB (whole process; last column mmpost / transformers) | "
          f"{statistics.median(r['mmpost_rss_mb'] for r in rs):.0f} | "
          f"{statistics.median(r['ref_rss_mb'] for r in rs):.0f} | {rss:.2f} |")
mm = [r["mmpost"]["tokens_per_s"] for r in tk]
one = [r["ref"]["tokens_per_s"] for r in tk]
bat = [r["ref"]["batch_tokens_per_s"] for r in tk]
print(f"| tokenize: tokens/s, 1 thread, 4 KB chunks of {tk[0]['mmpost']['bytes'] / 1e6:.1f} MB text | {statistics.median(mm):,.0f} | "
      f"{statistics.median(one):,.0f} | {statistics.median(m / f for m, f in zip(mm, one)):.2f}x |")
print(f"| tokenize: vs tokenizers' encode_batch (all cores) | {statistics.median(mm):,.0f} | "
      f"{statistics.median(bat):,.0f} | {statistics.median(m / f for m, f in zip(mm, bat)):.2f}x |")
PY
