#!/usr/bin/env bash
# Train the mmpost SentencePiece tokenizer with Debian's spm_train
# (package `sentencepiece`, libsentencepiece 0.1.97).
#
# Usage (from the repo root, after scripts/make_digits_vqa.py):
#     bash scripts/make_tokenizer.sh
# Output: data/tokenizer/tokenizer.model, data/tokenizer/tokenizer.vocab
# Deterministic: single thread, fixed seed, no sentence sampling, corpus
# built in a fixed order with LC_ALL=C; re-running gives identical bytes.
set -euo pipefail
export LC_ALL=C
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DATA="$ROOT/data/digits-vqa"
TOK="$ROOT/data/tokenizer"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
command -v "$PY" >/dev/null 2>&1 || PY=python3

for s in train val test; do
  [[ -f "$DATA/$s.jsonl" ]] || { echo "missing $DATA/$s.jsonl; run scripts/make_digits_vqa.py first" >&2; exit 1; }
done

# The trainer records --input and --model_prefix verbatim in the model's
# TrainerSpec, so both are fixed relative names (run from $TOK) to keep the
# model bytes independent of temp dirs and of where the repo is checked out.
CORPUS_NAME="corpus.tmp.txt"
CORPUS="$TOK/$CORPUS_NAME"
trap 'rm -f "$CORPUS"' EXIT

# Corpus = every sample rendered with the chat template words (one line per
# text line; spm_train splits on "\n", the newline itself is covered by
# byte fallback <0x0A>) + the hand-written extra sentences.
"$PY" - "$DATA" > "$CORPUS" <<'PYEOF'
import json, sys, os
d = sys.argv[1]
for split in ("train", "val", "test"):
    with open(os.path.join(d, split + ".jsonl"), encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            user = rec["messages"][0]["content"]
            ans = rec["messages"][1]["content"]
            text = "USER: " + user + " ASSISTANT: " + ans
            for part in text.split("\n"):
                print(part)
PYEOF
cat "$TOK/corpus_extra.txt" >> "$CORPUS"

cd "$TOK"
spm_train \
  --input="$CORPUS_NAME" \
  --model_prefix=tokenizer \
  --model_type=bpe \
  --vocab_size=512 \
  --character_coverage=1.0 \
  --byte_fallback=true \
  --split_digits=true \
  --user_defined_symbols='<image>,<think>,</think>,<answer>,</answer>' \
  --unk_id=0 --bos_id=1 --eos_id=2 --pad_id=3 \
  --unk_piece='<unk>' --bos_piece='<s>' --eos_piece='</s>' --pad_piece='<pad>' \
  --add_dummy_prefix=true \
  --remove_extra_whitespaces=false \
  --normalization_rule_name=identity \
  --input_sentence_size=0 \
  --shuffle_input_sentence=false \
  --num_threads=1 \
  --random_seed=1234 \
  --minloglevel=1

sha256sum tokenizer.model tokenizer.vocab
