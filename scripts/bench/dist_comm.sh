#!/usr/bin/env bash
# Data-parallel communication cost of `mmpost sft` on CPU (Gloo over loopback), for N ranks and
# two model sizes (the tiny recipe, and a ~7.6M-parameter text tower on the same recipe):
#   1. bytes moved per optimizer step per rank vs the ideal ring all-reduce volume
#      2(N-1)/N x parameter bytes. All N ranks run inside a private network namespace
#      (`unshare --net`, then `ip link set lo up`), so the namespace's loopback carries only their
#      traffic. We read lo's TX byte counter (/proc/net/dev) before and after a run; on loopback
#      each byte sent is counted once on TX and once on RX (the two are equal), so TX is the
#      traffic. The counters count whole frames (TCP/IP headers, ACKs), i.e. real wire bytes.
#      Setup traffic (TCPStore rendezvous, Gloo pair setup, the initial parameter broadcast, the
#      final barrier) cancels by differencing two otherwise identical runs:
#        bytes/step/rank = (TX(STEPS_LONG) - TX(STEPS_SHORT)) / (STEPS_LONG - STEPS_SHORT) / N.
#   2. the fraction of step time blocked on communication: means over steps STEPS_SHORT+1 ..
#      STEPS_LONG of dist/comm_wait_s and dist/comm_s (rank 0's metrics.jsonl, logged every step)
#      divided by the mean step time = train.batch_size (per rank) / samples_per_s (rank 0's own
#      samples over that step's log window). The wall-clock difference of the two runs divided by
#      the step difference is shown as a cross-check.
# If a network namespace cannot be created (not root and no user namespaces), the ranks run on the
# host loopback, which other programs share, so only part 2 is reported (said so on stdout).
# Needs: build/mmpost, python3, util-linux `unshare`, iproute2 `ip` (installed with
# `apt-get install -y iproute2` when missing and running as root with apt-get; else fallback).
#
# Usage: bash scripts/bench/dist_comm.sh > table.md      (about 1-2 minutes on 2 cores)
# Env: WORLDS ("2 3"), STEPS_LONG (25), STEPS_SHORT (5), BATCH (8, per rank), MODELS ("tiny 7m"),
#      BUCKET_MB (unset: the recipe default, 25), DIST_TIMEOUT_S (120), MMPOST (build/mmpost).
# Prints a markdown table on stdout; progress goes to stderr. Each rank: num_threads=1,
# data.num_workers=1, no eval, no intermediate checkpoints.
set -euo pipefail

# ---- inner mode: runs one N-rank job (inside the namespace when there is one) -----------------
# dist_comm.sh --inner N STEPS OUTDIR PORT [mmpost args...]; prints "RESULT tx_bytes tx_packets wall_s rc".
lo_tx() {  # lo's TX bytes and packets: after "lo:", fields 9 and 10
  sed -n 's/^ *lo: *//p' /proc/net/dev | awk '{print $9, $10}'
}
if [[ "${1:-}" == "--inner" ]]; then
  shift
  n="$1" steps="$2" out="$3" port="$4"
  shift 4
  if [[ "${DC_NETNS:-0}" == 1 ]]; then ip link set lo up; fi
  pids=()
  trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done' TERM INT
  read -r tx0 pk0 < <(lo_tx)
  t0=$(date +%s.%N)
  for ((r = 0; r < n; r++)); do
    RANK=$r LOCAL_RANK=$r WORLD_SIZE=$n LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      "$MMPOST" sft "$@" --set train.max_steps="$steps" --output "$out" \
      >"$out.rank$r.log" 2>&1 &
    pids+=($!)
  done
  rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=$?; done
  t1=$(date +%s.%N)
  read -r tx1 pk1 < <(lo_tx)
  echo "RESULT $((tx1 - tx0)) $((pk1 - pk0)) $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.3f", b-a}') $rc"
  exit 0
fi

# ---- driver ------------------------------------------------------------------------------------
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
SELF="$ROOT/scripts/bench/$(basename "$0")"
cd "$ROOT"
export MMPOST="${MMPOST:-$ROOT/build/mmpost}"
WORLDS="${WORLDS:-2 3}"
STEPS_LONG="${STEPS_LONG:-25}"
STEPS_SHORT="${STEPS_SHORT:-5}"
BATCH="${BATCH:-8}"
MODELS="${MODELS:-tiny 7m}"
DIST_TIMEOUT_S="${DIST_TIMEOUT_S:-120}"
log() { echo "[dist_comm $(date +%T)] $*" >&2; }
[[ -x "$MMPOST" ]] || { log "no $MMPOST: cmake --build build --target mmpost -j2"; exit 2; }
command -v python3 >/dev/null || { log "needs python3"; exit 2; }
((STEPS_LONG > STEPS_SHORT && STEPS_SHORT >= 1)) || { log "need STEPS_LONG > STEPS_SHORT >= 1"; exit 2; }

TMP="$(mktemp -d /tmp/mmpost-dist-comm.XXXXXX)"
INNER_PID=""
cleanup() {
  if [[ -n "$INNER_PID" ]]; then kill "$INNER_PID" 2>/dev/null || true; wait "$INNER_PID" 2>/dev/null || true; fi
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# How to get a private network namespace: as root, or as a user via a user namespace.
NETNS=()
if ! command -v ip >/dev/null; then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    log "iproute2 (ip) missing: installing it with apt-get install -y iproute2"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2; } >&2 ||
      log "apt-get install iproute2 failed"
  fi
fi
if command -v ip >/dev/null && command -v unshare >/dev/null; then
  if unshare --net -- sh -c 'ip link set lo up' 2>/dev/null; then
    NETNS=(unshare --net --)
  elif unshare --user --map-root-user --net -- sh -c 'ip link set lo up' 2>/dev/null; then
    NETNS=(unshare --user --map-root-user --net --)
  fi
fi
if ((${#NETNS[@]})); then
  log "traffic: ranks run in a private network namespace (${NETNS[*]})"
else
  log "traffic: cannot create a network namespace (unshare --net not permitted or ip missing);" \
      "reporting only the communication-wait fraction"
fi

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

model_args() {
  case "$1" in
    tiny) ;;  # recipes/tiny/sft-tiny.json as is
    7m) echo "--set model.config.text_config.hidden_size=384 --set model.config.text_config.intermediate_size=1024" \
             "--set model.config.text_config.num_hidden_layers=4 --set model.config.text_config.num_attention_heads=4" \
             "--set model.config.text_config.num_key_value_heads=4" ;;
    *) log "unknown model $1 (tiny | 7m)"; exit 2 ;;
  esac
}

# run_job MODEL N STEPS: sets R_TX R_PK R_WALL, leaves $TMP/MODEL-N-STEPS/metrics.jsonl. Runs in
# this shell (not a subshell), so INNER_PID is what cleanup() stops on an interrupt.
run_job() {
  local model="$1" n="$2" steps="$3" out="$TMP/$1-$2-$3" port=29500 line
  local -a args
  read -r -a args <<<"$(model_args "$model")"
  args=(-r recipes/tiny/sft-tiny.json --set data.eval= --set train.log_every_n_steps=1
        --set train.batch_size="$BATCH" --set train.save_every_n_steps=0 --set num_threads=1
        --set data.num_workers=1 --set dist.timeout_s="$DIST_TIMEOUT_S" "${args[@]}")
  if [[ -n "${BUCKET_MB:-}" ]]; then args+=(--set dist.bucket_mb="$BUCKET_MB"); fi
  if ((${#NETNS[@]})); then
    DC_NETNS=1 "${NETNS[@]}" bash "$SELF" --inner "$n" "$steps" "$out" "$port" "${args[@]}" >"$out.result" &
  else
    port="$(free_port)"
    bash "$SELF" --inner "$n" "$steps" "$out" "$port" "${args[@]}" >"$out.result" &
  fi
  INNER_PID=$!
  wait "$INNER_PID" || true
  INNER_PID=""
  line="$(grep '^RESULT ' "$out.result" || true)"
  read -r _ tx pk wall rc <<<"$line"
  if [[ -z "$line" || "$rc" != 0 || ! -s "$out/metrics.jsonl" ]]; then
    log "$model N=$n steps=$steps failed (rc ${rc:-?}); rank logs:"
    tail -n 5 "$out".rank*.log >&2 || true
    exit 1
  fi
  R_TX="$tx" R_PK="$pk" R_WALL="$wall"
}

LOAD_START="$(cut -d' ' -f1-3 /proc/loadavg)"
ROWS="$TMP/rows.tsv"
: >"$ROWS"
for model in $MODELS; do
  for n in $WORLDS; do
    log "$model N=$n: $STEPS_SHORT steps"
    run_job "$model" "$n" "$STEPS_SHORT"
    txs="$R_TX" pks="$R_PK" walls="$R_WALL"
    log "$model N=$n: $STEPS_LONG steps"
    run_job "$model" "$n" "$STEPS_LONG"
    txl="$R_TX" pkl="$R_PK" walll="$R_WALL"
    params="$("$MMPOST" inspect model "$TMP/$model-$n-$STEPS_LONG" --json |
              python3 -c 'import json,sys; print(json.load(sys.stdin)["parameters"]["total"])')"
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$model" "$n" "$params" \
      "$txs" "$pks" "$walls" "$txl" "$pkl" "$walll" "$TMP/$model-$n-$STEPS_LONG/metrics.jsonl" >>"$ROWS"
    rm -rf "$TMP/$model-$n-$STEPS_SHORT"
  done
done
LOAD_END="$(cut -d' ' -f1-3 /proc/loadavg)"

HAVE_NETNS=$((${#NETNS[@]} > 0 ? 1 : 0)) STEPS_LONG="$STEPS_LONG" STEPS_SHORT="$STEPS_SHORT" BATCH="$BATCH" \
LOAD_START="$LOAD_START" LOAD_END="$LOAD_END" python3 - "$ROWS" <<'EOF'
import json, os, sys
L, S, B = int(os.environ["STEPS_LONG"]), int(os.environ["STEPS_SHORT"]), int(os.environ["BATCH"])
netns = os.environ["HAVE_NETNS"] == "1"
MiB = 1024.0 * 1024.0
mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")
print(f"| model | params | N | payload MiB/step/rank | ideal ring MiB/step/rank | measured lo TX MiB/step/rank "
      f"| measured / ideal | TX packets/step/rank | step ms | step ms (wall Δ) | comm_wait ms | wait % "
      f"| comm_s ms | comm % |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for line in open(sys.argv[1]):
    model, n, params, txs, pks, walls, txl, pkl, walll, metrics = line.rstrip("\n").split("\t")
    n, params = int(n), int(params)
    rows = [json.loads(l) for l in open(metrics) if l.strip()]
    rows = [r for r in rows if S < r.get("step", 0) <= L and "samples_per_s" in r]
    step_s = mean([B / r["samples_per_s"] for r in rows])
    wait_s = mean([r["dist/comm_wait_s"] for r in rows])
    comm_s = mean([r["dist/comm_s"] for r in rows])
    payload = mean([r["dist/allreduce_mb"] for r in rows])
    ideal = 2 * (n - 1) / n * params * 4 / MiB  # fp32 gradients, every parameter trainable
    wall_step = (float(walll) - float(walls)) / (L - S)
    if netns:
        per = (int(txl) - int(txs)) / (L - S) / n
        pk = (int(pkl) - int(pks)) / (L - S) / n
        meas, ratio, pkts = f"{per / MiB:.3f}", f"**{per / MiB / ideal:.2f}**", f"{pk:.0f}"
    else:
        meas = ratio = pkts = "n/a"
    print(f"| {model} | {params / 1e6:.3f} M | {n} | {payload:.3f} | {ideal:.3f} | {meas} | {ratio} | {pkts} "
          f"| {step_s * 1e3:.1f} | {wall_step * 1e3:.1f} | {wait_s * 1e3:.2f} | **{100 * wait_s / step_s:.0f}%** "
          f"| {comm_s * 1e3:.2f} | {100 * comm_s / step_s:.0f}% |")
print()
print(f"Steps {S + 1}-{L} of a {L}-step run, per-rank batch {B}; traffic = (TX after {L} steps - TX after {S}) / {L - S} / N, "
      f"lo TX bytes from /proc/net/dev in a private network namespace." if netns else
      "**Traffic not measured**: no private network namespace could be created (unshare --net not permitted), "
      "so only the wait fraction is reported.")
print(f"Load average (1/5/15 min): start {os.environ['LOAD_START']}, end {os.environ['LOAD_END']}.")
EOF
