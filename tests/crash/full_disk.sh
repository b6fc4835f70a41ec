#!/usr/bin/env bash
# A full disk under a training run, on small tmpfs mounts (needs root; prints "SKIPPED: reason"
# where tmpfs cannot be mounted). Two ways to fill it:
#   bytes:  a 1.5 MiB tmpfs and a checkpoint every step: the free-space check (model + AdamW
#           moments + tokenizer) refuses the save that would not fit;
#   inodes: a tmpfs with room for bytes but few inodes: a save fails in the middle of writing
#           (ENOSPC from open()), past the free-space check.
# Each must exit 1 (not abort) with a message naming the checkpoint folder and the space needed,
# leave the previous checkpoint complete and no temporary folder, and, once the mount is enlarged,
# a rerun of the same command must resume and end with weights identical to an uninterrupted run.
# Prints "full disk: N passed, 0 failed" or the failing check (exit 1).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
BIN=${MMPOST_BIN:-$ROOT/build/mmpost}
work=$(mktemp -d /tmp/mmpost-fulldisk.XXXXXX)
mounts=()
cleanup() {
  for m in "${mounts[@]}"; do umount "$m" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
log() { echo "[full-disk $(date +%H:%M:%S)] $*" >&2; }
fail() { log "FAIL: $*"; echo "full disk: 0 passed, 1 failed"; exit 1; }
[ -x "$BIN" ] || fail "$BIN not built (bash scripts/setup.sh)"
[ "$(id -u)" = 0 ] || { echo "SKIPPED: mounting a tmpfs needs root"; exit 0; }
mkdir -p "$work/probe"
if ! mount -t tmpfs -o size=64k tmpfs "$work/probe" 2>/dev/null; then
  echo "SKIPPED: cannot mount a tmpfs here (no CAP_SYS_ADMIN in this container?)"
  exit 0
fi
umount "$work/probe"

args=(sft -r recipes/tiny/sft-tiny.json --set data.eval= --set train.max_steps=12
      --set train.save_every_n_steps=1 --set train.keep_last_n_checkpoints=100
      --set train.log_every_n_steps=1 --set num_threads=1)
"$BIN" "${args[@]}" --output "$work/straight" > /dev/null 2> "$work/straight.log" ||
  fail "uninterrupted run failed: $(tail -3 "$work/straight.log")"

# scenario NAME MOUNT_OPTIONS REMOUNT_OPTIONS EXPECTED_MESSAGE
passed=0
scenario() {
  local name=$1 opts=$2 bigger=$3 expect=$4 mnt=$work/$1 rc=0 out newest
  mkdir -p "$mnt"
  mount -t tmpfs -o "$opts" tmpfs "$mnt" || fail "$name: mount -o $opts failed"
  mounts+=("$mnt")
  "$BIN" "${args[@]}" --output "$mnt/run" > "$work/$name.out" 2> "$work/$name.err" || rc=$?
  out=$(grep '^error:' "$work/$name.err" || true)
  log "$name: exit $rc: ${out:-<no error line>}"
  [ "$rc" = 1 ] || fail "$name: exit $rc, expected 1 (stderr: $(tail -3 "$work/$name.err"))"
  case $out in
    *"cannot write the checkpoint (needs about "*"$expect"*) ;;
    *) fail "$name: the message does not name the folder, the space needed and '$expect'" ;;
  esac
  grep -q "is intact" "$work/$name.err" || fail "$name: no word on the previous checkpoint"
  newest=$(ls -d "$mnt"/run/step_* 2>/dev/null | while read -r d; do [ -f "$d/DONE" ] && echo "$d"; done | tail -1)
  [ -n "$newest" ] || fail "$name: no complete checkpoint left (the disk filled too early)"
  python3 -c "import json,sys; s=json.load(open(sys.argv[1]+'/state.json')); assert s['step']==int(sys.argv[1].rsplit('_',1)[1])" "$newest" ||
    fail "$name: $newest is not a complete checkpoint"
  for f in model.safetensors optimizer.pt rng.pt tokenizer.model; do
    [ -s "$newest/$f" ] || fail "$name: $newest/$f missing"
  done
  [ -z "$(find "$mnt/run" -maxdepth 1 -name '.step_*.tmp.*')" ] || fail "$name: temporary folder left"
  log "$name: newest complete checkpoint ${newest##*/} intact; enlarging the mount and rerunning"
  mount -o "remount,$bigger" "$mnt" || fail "$name: remount failed"
  "$BIN" "${args[@]}" --output "$mnt/run" > /dev/null 2> "$work/$name.rerun" ||
    fail "$name: the rerun failed: $(tail -3 "$work/$name.rerun")"
  grep -q "resumed from $newest" "$work/$name.rerun" || fail "$name: the rerun did not resume from $newest"
  cmp -s "$work/straight/model.safetensors" "$mnt/run/model.safetensors" ||
    fail "$name: final weights differ from the uninterrupted run"
  log "$name: PASS (exit 1, clear message, previous checkpoint intact, resumed to identical weights)"
  passed=$((passed + 1))
}

scenario bytes "size=1536k" "size=64m" "not enough free disk space"
scenario inodes "size=64m,nr_inodes=40" "nr_inodes=10000" "No space left on device"
echo "full disk: $passed passed, 0 failed"
