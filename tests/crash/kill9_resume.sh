#!/usr/bin/env bash
# kill -9 at N random moments of a tiny SFT run that checkpoints every step (so most kills land in
# the middle of a save), each followed by a rerun of the same command. Checks, after every kill,
# that the newest folder with DONE is a complete checkpoint (state.json parses and names its step,
# optimizer.pt and rng.pt exist, model.safetensors has a valid header), that no temporary folder
# is ever trusted, that the rerun resumes from exactly that checkpoint, and finally that the
# weights equal an uninterrupted run's byte for byte (single thread).
#   bash tests/crash/kill9_resume.sh            # N=20 kills; SEED=<int> replays a sequence
# Prints "kill -9 resume: 1 passed, 0 failed" (exit 0) or the failing check (exit 1).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
BIN=${MMPOST_BIN:-$ROOT/build/mmpost}
N=${N:-20}
SEED=${SEED:-$(( $(date +%s) % 100000 ))}
STEPS=${STEPS:-}  # default: sized to this machine's speed (below)
RANDOM=$SEED
work=$(mktemp -d /tmp/mmpost-kill9.XXXXXX)
trap 'rm -rf "$work"' EXIT
log() { echo "[kill9 $(date +%H:%M:%S)] $*" >&2; }
fail() { log "FAIL: $*"; echo "kill -9 resume: 0 passed, 1 failed"; trap - EXIT; log "kept $work"; exit 1; }
[ -x "$BIN" ] || fail "$BIN not built (bash scripts/setup.sh)"

base=(sft -r recipes/tiny/sft-tiny.json --set data.eval= --set train.save_every_n_steps=1
      --set train.keep_last_n_checkpoints=2 --set train.log_every_n_steps=1 --set num_threads=1)
if [ -z "$STEPS" ]; then
  # The kills are spread over N x ~0.8 s of wall time; the run must outlast them on a fast, idle
  # machine as well as on a busy one: 3x the steps this machine does in that time (at least 200).
  t0=$(date +%s%N)
  "$BIN" "${base[@]}" --set train.max_steps=50 --output "$work/calibrate" > /dev/null 2>&1 ||
    fail "calibration run failed"
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  STEPS=$(awk -v ms="$ms" -v n="$N" 'BEGIN { s = int(3 * n * 800 * 50 / (ms > 1 ? ms : 1)); print (s < 200 ? 200 : s) }')
  rm -rf "$work/calibrate"
fi
args=("${base[@]}" --set "train.max_steps=$STEPS")
log "seed $SEED, $N kills, $STEPS steps, checkpoint every step"
"$BIN" "${args[@]}" --output "$work/straight" > /dev/null 2> "$work/straight.log" ||
  fail "the uninterrupted run failed: $(tail -3 "$work/straight.log")"

# The newest step folder holding DONE, and a check that it is complete.
newest_complete() {
  local d best=""
  for d in "$work"/crash/step_*; do [ -f "$d/DONE" ] && best=$d; done
  echo "$best"
}
check_complete() {
  local d=$1 step
  step=$((10#${d##*step_}))
  python3 - "$d" "$step" <<'PY' || return 1
import json, struct, sys
d, step = sys.argv[1], int(sys.argv[2])
s = json.load(open(f"{d}/state.json"))
assert s["step"] == step, f"state.json step {s['step']} != folder {step}"
with open(f"{d}/model.safetensors", "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
    size = max(v["data_offsets"][1] for k, v in header.items() if k != "__metadata__")
    f.seek(0, 2)
    assert f.tell() == 8 + n + size, "model.safetensors is truncated"
for name in ("optimizer.pt", "rng.pt", "tokenizer.model", "config.json"):
    open(f"{d}/{name}", "rb").close()
PY
}

expected=""  # the checkpoint the next start must resume from
for i in $(seq 1 "$N"); do
  "$BIN" "${args[@]}" --output "$work/crash" > /dev/null 2> "$work/run$i.log" &
  pid=$!
  delay=$(( 50 + RANDOM % 1500 ))  # ms: startup, steps and saves
  sleep "$(awk -v ms="$delay" 'BEGIN { printf "%.3f", ms / 1000 }')"
  if ! kill -9 "$pid" 2>/dev/null; then
    wait "$pid" || true
    fail "run $i ended before its kill (raise STEPS)"
  fi
  wait "$pid" 2>/dev/null || true
  # Killed during startup, a run may not have said yet what it loads; once it has, it must be
  # the newest complete checkpoint the previous kill left.
  loaded=$(sed -n 's/.*sft: loading model from \(.*\)$/\1/p' "$work/run$i.log")
  if [ -n "$expected" ] && [ -n "$loaded" ] && [ "$loaded" != "$expected" ]; then
    fail "run $i loaded $loaded, not the newest complete checkpoint $expected"
  fi
  ckpt=$(newest_complete)
  if [ -n "$ckpt" ]; then
    check_complete "$ckpt" || fail "after kill $i the newest checkpoint $ckpt is not complete"
  fi
  n_tmp=0  # a kill during startup may come before the output folder exists
  [ -d "$work/crash" ] && n_tmp=$(find "$work/crash" -maxdepth 1 -name '.step_*.tmp.*' | wc -l)
  log "kill $i after ${delay} ms: newest complete checkpoint ${ckpt##*/} ($n_tmp temp folder(s) left for the next start to clear)"
  expected=$ckpt
done

"$BIN" "${args[@]}" --output "$work/crash" > /dev/null 2> "$work/final.log" ||
  fail "the final rerun failed: $(tail -3 "$work/final.log")"
# The last kill can land after the run finished (run.json written, the process exiting): the rerun
# then leaves the finished run untouched, which is right too.
[ -z "$expected" ] || grep -q "resumed from $expected at step" "$work/final.log" ||
  { [ -f "$work/crash/run.json" ] && grep -q "already holds this run, finished at step $STEPS" "$work/final.log"; } ||
  fail "the final rerun did not resume from $expected"
cmp -s "$work/straight/model.safetensors" "$work/crash/model.safetensors" ||
  fail "final weights differ from the uninterrupted run"
[ -z "$(find "$work/crash" -maxdepth 1 -name '.step_*.tmp.*')" ] || fail "temp folders left after the final run"
log "final weights byte-identical to the uninterrupted run after $N kills"
echo "kill -9 resume: 1 passed, 0 failed"
