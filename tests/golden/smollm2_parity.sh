#!/usr/bin/env bash
# The real SmolLM2-135M-Instruct in mmpost against Hugging Face:
#  * tokenizer: ids identical to `tokenizers` on the hostile strings and ~3 MB of Debian-packaged
#    text (scripts/parity/smollm2_tokenizer.py writes the expected ids, the [smollm2] Catch test
#    compares);
#  * model: 24 ChatML prompts x 32 greedy tokens token-identical to transformers, logits within
#    1e-4 at every position on BLAS (transformers' GEMM library) and within 5e-4 on oneDNN
#    (MMPOST_CPU_GEMM=onednn: another summation order through 30 layers), each checked
#    (scripts/parity/smollm2_generate.py).
# Needs the dequantized model (scripts/get_smollm2.py; scripts/test.sh fetches it and sets
# MMPOST_SMOLLM2_DIR) and transformers in .venv; reports SKIPPED otherwise.
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${MMPOST_SMOLLM2_DIR:-}
if [[ -z "$dir" || ! -f "$dir/DONE" ]]; then
  echo "SKIPPED: no SmolLM2 folder (MMPOST_SMOLLM2_DIR unset or incomplete; run scripts/get_smollm2.py)"
  exit 0
fi
if ! .venv/bin/python -c "import transformers" 2>/dev/null; then
  echo "SKIPPED: transformers is not installed in .venv"
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
.venv/bin/python scripts/parity/smollm2_tokenizer.py "$dir" "$work/tokenizer_expected.json"
MMPOST_SMOLLM2_DIR=$dir MMPOST_SMOLLM2_EXPECTED=$work/tokenizer_expected.json \
  "${MMPOST_TESTS_BIN:?}" "[smollm2]"
.venv/bin/python scripts/parity/smollm2_generate.py --model "$dir" --mmpost "${MMPOST_BIN:?}" \
  --work "$work" > "$work/summary.json"
head -12 "$work/summary.json"
