#!/usr/bin/env bash
# mmpost vs reference benchmarks on CPU; writes BENCHMARKS.md at the repository root.
#   1. preprocessing images/s: mmpost bench-preprocess vs HF LlavaProcessor (photos, digits; 1 and 2 workers)
#   2. SFT tokens/s and peak RSS: mmpost sft vs a plain PyTorch loop over transformers'
#      LlavaForConditionalGeneration (digits config and a ~100M config), same threads/data/optimizer
#   3. fp32 GEMM peak of the same torch build, and each training figure as a fraction of it (MFU)
# Each pair runs back to back in this one invocation (mmpost, then the reference, per repeat).
# Usage: bash scripts/bench/run_all.sh      (about 7-10 minutes on 2 cores)
# Env: BENCH_OUT (scratch folder, default /tmp/mmpost-bench-run), REPEATS (preprocessing, 3),
#      SFT_REPEATS (2), REF_TCMALLOC (the tcmalloc library preloaded into a third, reference run;
#      empty: skip it), THREADS (torch threads for training and GEMM, 2), MAX_LOAD (1.0) and
#      LOAD_WAIT_S (240): wait up to that long for the 1-minute load average to fall below MAX_LOAD.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$ROOT"
OUT="${BENCH_OUT:-/tmp/mmpost-bench-run}"
REPEATS="${REPEATS:-3}"
SFT_REPEATS="${SFT_REPEATS:-2}"
THREADS="${THREADS:-2}"
MAX_LOAD="${MAX_LOAD:-1.0}"
LOAD_WAIT_S="${LOAD_WAIT_S:-240}"
PY="$ROOT/.venv/bin/python"
MMPOST="$ROOT/build/mmpost"
TIME=/usr/bin/time
[[ -x "$MMPOST" ]] || { echo "no $MMPOST: cmake --build build --target mmpost -j2" >&2; exit 2; }
[[ -x "$TIME" ]] || { echo "needs GNU time: apt-get install time" >&2; exit 2; }
"$PY" -c "import PIL, skimage, transformers, sentencepiece" 2>/dev/null ||
  { echo "needs: .venv/bin/python -m pip install pillow scikit-image (torch must stay as is)" >&2; exit 2; }
rm -rf "$OUT" && mkdir -p "$OUT"
T_START=$(date +%s)
load1() { cut -d' ' -f1 /proc/loadavg; }
wait_for_low_load() {  # best effort: other users share the machine
  local waited=0
  while awk -v l="$(load1)" -v m="$MAX_LOAD" 'BEGIN{exit !(l>=m)}' && ((waited < LOAD_WAIT_S)); do
    sleep 10; waited=$((waited + 10))
  done
  echo "load $(load1) after waiting ${waited}s" >&2
}
log() { echo "[bench $(date +%T)] $*" >&2; }

# ---- the bench-preprocess binary ------------------------------------------------------------
"$MMPOST" bench-preprocess --help >/dev/null 2>&1 || { log "build/mmpost missing: run scripts/setup.sh"; exit 1; }
PRE="$MMPOST"

wait_for_low_load
echo "{\"phase\": \"start\", \"load\": \"$(cut -d' ' -f1-3 /proc/loadavg)\"}" >"$OUT/load.jsonl"

# ---- 1. preprocessing --------------------------------------------------------------------------
"$PY" scripts/bench/make_photos.py "$OUT/photos" >&2
PHOTOS_BASE=(--data "$OUT/photos/photos.jsonl" --image-size 224 --patch-size 14 --epochs 3)
PHOTOS=("${PHOTOS_BASE[@]}" --interpolation bicubic)
DIGITS=(--data data/digits-vqa/train.jsonl --image-size 8 --patch-size 4 --interpolation area
        --image-mean 0.5 0.5 0.5 --image-std 0.5 0.5 0.5 --epochs 2)
run_pre() {  # dataset impl workers repeat args...
  local ds=$1 impl=$2 w=$3 r=$4; shift 4
  local line
  if [[ $impl == mmpost* ]]; then
    line=$("$PRE" bench-preprocess "$@" --num-workers "$w" --num-threads 1 2>"$OUT/last.err" | tail -1) || true
  else
    line=$("$PY" scripts/bench/ref_preprocess.py "$@" --num-workers "$w" --num-threads 1 2>"$OUT/last.err" | tail -1) || true
  fi
  if [[ "$line" != "{"* ]]; then
    log "FAILED: $impl $ds workers=$w: $(tail -3 "$OUT/last.err")"; return 0
  fi
  echo "{\"dataset\": \"$ds\", \"impl\": \"$impl\", \"workers\": $w, \"repeat\": $r, \"result\": $line}" >>"$OUT/preprocess.jsonl"
}
for w in 1 2; do
  for r in $(seq "$REPEATS"); do
    log "preprocess photos workers=$w repeat=$r"
    run_pre photos mmpost "$w" "$r" "${PHOTOS[@]}"
    run_pre photos hf "$w" "$r" "${PHOTOS[@]}"
    # Pillow-exact resampling, when this build of mmpost has it (interpolation pil_bicubic)
    if "$PRE" bench-preprocess "${PHOTOS_BASE[@]}" --interpolation pil_bicubic >/dev/null 2>&1; then
      run_pre photos mmpost_pil "$w" "$r" "${PHOTOS_BASE[@]}" --interpolation pil_bicubic
    fi
    log "preprocess digits workers=$w repeat=$r"
    run_pre digits mmpost "$w" "$r" "${DIGITS[@]}"
    run_pre digits hf "$w" "$r" "${DIGITS[@]}"
  done
done

# ---- 2. SFT step -------------------------------------------------------------------------------
# Both read the same resolved recipe: mmpost writes OUTPUT/recipe.json, the reference reads it.
COMMON_SET=(train.save_every_n_steps=0 train.eval_every_n_steps=0 'data.eval=""' "num_threads=$THREADS"
            data.shuffle_buffer=0 data.num_workers=1 'scheduler.name="constant"' scheduler.warmup_steps=0
            'device="cpu"')
# build/mmpost links tcmalloc (CMakeLists.txt); the reference also runs a third time with it
# preloaded, the allocator PyTorch's CPU launcher (torch.backends.xeon.run_cpu) preloads by default.
REF_TCMALLOC="${REF_TCMALLOC-$( (ldconfig -p 2>/dev/null || true) | awk '/libtcmalloc_minimal\.so\.4 /{p = $NF} END {print p}')}"
declare -A RECIPE=([digits]=recipes/digits-sft.json [100m]=scripts/bench/sft-100m.json)
declare -A SETS=([digits]="train.max_steps=60 train.log_every_n_steps=10"
                 [100m]="train.batch_size=2 train.max_steps=16 train.log_every_n_steps=2")
for cfg in digits 100m; do
  for r in $(seq "$SFT_REPEATS"); do
    d="$OUT/sft-$cfg-$r"
    log "sft $cfg repeat=$r: mmpost"
    # shellcheck disable=SC2086
    $TIME -v -o "$d.mmpost.time" "$MMPOST" sft --recipe "${RECIPE[$cfg]}" --output "$d" --no-resume \
      --set "${COMMON_SET[@]}" ${SETS[$cfg]} 2>"$d.mmpost.log" >/dev/null
    log "sft $cfg repeat=$r: reference"
    $TIME -v -o "$d.ref.time" "$PY" scripts/bench/ref_sft.py --recipe "$d/recipe.json" \
      >"$d.ref.json" 2>"$d.ref.log"
    if [[ -n "$REF_TCMALLOC" ]]; then  # the reference as `python -m torch.backends.xeon.run_cpu` runs it
      log "sft $cfg repeat=$r: reference with tcmalloc preloaded"
      LD_PRELOAD="$REF_TCMALLOC" $TIME -v -o "$d.ref_tc.time" "$PY" scripts/bench/ref_sft.py \
        --recipe "$d/recipe.json" >"$d.ref_tc.json" 2>"$d.ref_tc.log"
    fi
    rm -rf "$d"/step_* "$d"/*.safetensors  # checkpoints are not needed (100m: ~1.2 GB each)
  done
done

# ---- 3. GEMM peak ------------------------------------------------------------------------------
log "gemm peak"
"$PY" scripts/bench/gemm_peak.py --threads 1 "$THREADS" >"$OUT/gemm.json"
echo "{\"phase\": \"end\", \"load\": \"$(cut -d' ' -f1-3 /proc/loadavg)\"}" >>"$OUT/load.jsonl"

# ---- report ------------------------------------------------------------------------------------
# Sections other scripts wrote (dist_comm.sh, smollm2.sh, lora_smollm2.sh, steps.sh) are kept.
cp BENCHMARKS.md "$OUT/BENCHMARKS.previous.md" 2>/dev/null || true
"$PY" scripts/bench/report.py --out-dir "$OUT" --threads "$THREADS" --mmpost "$MMPOST" --pre "$PRE" \
  --sft-repeats "$SFT_REPEATS" --repeats "$REPEATS" --seconds $(($(date +%s) - T_START)) \
  --keep-from "$OUT/BENCHMARKS.previous.md" >BENCHMARKS.md
log "wrote BENCHMARKS.md ($(($(date +%s) - T_START)) s)"
