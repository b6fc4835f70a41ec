#!/usr/bin/env bash
# Preemption test of scripts/slurm/sft.sbatch, and an srun data-parallel job of
# scripts/slurm/multinode.sbatch, on a private single-node Slurm cluster (localhost).
#
#   bash tests/slurm/test_slurm_preemption.sh      # from anywhere; needs root and build/mmpost
#
# Installs Debian's slurm-wlm and munge when missing (prints "SKIPPED: ..." and exits 0 when that
# is impossible), writes its own slurm.conf/cgroup.conf in a temp dir (ports 16817/16818 or the
# next free pair, state and spool in the temp dir), starts munged, slurmctld and slurmd on it and
# stops exactly those daemons (by PID) on exit. Then:
#   1. requeue: a tiny SFT job submitted from a folder outside the clone (the script must find
#      the clone by itself) is preempted with `scontrol requeue` once it has a checkpoint; it must
#      stop with a checkpoint (exit_reason "signal"), restart with SLURM_RESTART_COUNT=1 in the
#      same output folder, resume, finish COMPLETED with exit 0, append to (not truncate) its log,
#      evaluate on the recipe's data.eval, and end with weights byte-identical to the same run
#      done uninterrupted with build/mmpost.
#   2. pre-timeout (skip with SLURM_TEST_PRETIMEOUT=0): a longer job submitted from inside the
#      clone with --time=1 --signal=B:USR1@55 must checkpoint on USR1, requeue itself, resume and
#      finish COMPLETED with exit 0 (Slurm checks time limits every 30 s, so this takes ~1 min).
#   3. srun (skip with SLURM_TEST_SRUN=0): multinode.sbatch with 2 tasks gives the losses of one
#      process with the 2x batch; rank 0 alone prints the summary.
#   4. preempted srun job (with 3): a 2-task multinode.sbatch job is requeued with `scontrol
#      requeue` once it has a checkpoint; both ranks stop at one step, rank 0 checkpoints, the job
#      restarts on 2 ranks, resumes, finishes COMPLETED, and its weights are byte-identical to an
#      uninterrupted 2-rank run launched directly (torchrun-style environment).
# Every wait is bounded; on failure the daemon and job logs are printed and the exit status is 1.
# KEEP=1 keeps the temp dir and run folders. The last line is "slurm preemption: N passed, M failed"
# or "SKIPPED: reason".
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BIN=$ROOT/build/mmpost
NAME="slurm preemption"
T0=$(date +%s)
PASSED=0 FAILED=0
T='' CREATED_POLICY=0
DAEMON_PIDS=() JOBS=() RUN_DIRS=()

log() { printf '[test %s +%ss] %s\n' "$(date +%H:%M:%S)" "$(($(date +%s) - T0))" "$*"; }
skip() { echo "SKIPPED: $*"; exit 0; }

# ---------------------------------------------------------------- prerequisites
[ -x "$BIN" ] || { echo "FAIL: $BIN not found: build first (bash scripts/setup.sh)"; echo "$NAME: 0 passed, 1 failed"; exit 1; }

need=()
for c in munged slurmctld slurmd sbatch scontrol squeue sinfo; do
  command -v "$c" >/dev/null 2>&1 || need+=("$c")
done
if [ ${#need[@]} -gt 0 ]; then
  [ "$(id -u)" = 0 ] || skip "slurm-wlm/munge not installed (${need[*]} missing) and not root to install them"
  command -v apt-get >/dev/null 2>&1 || skip "slurm-wlm/munge not installed and no apt-get"
  log "installing slurm-wlm and munge (missing: ${need[*]})"
  # Keep the packages' init scripts from starting the system's own daemons.
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d && CREATED_POLICY=1
  fi
  aptlog=$(mktemp /tmp/mmpost-slurm-apt.XXXXXX)
  ok=1
  apt-get update -q >"$aptlog" 2>&1 || ok=0
  [ $ok = 1 ] && { DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    slurm-wlm munge >>"$aptlog" 2>&1 || ok=0; }
  [ $CREATED_POLICY = 1 ] && rm -f /usr/sbin/policy-rc.d
  if [ $ok = 0 ]; then
    tail -n 5 "$aptlog"
    skip "could not install slurm-wlm and munge with apt-get (log: $aptlog)"
  fi
  rm -f "$aptlog"
  for c in munged slurmctld slurmd sbatch scontrol squeue sinfo; do
    command -v "$c" >/dev/null 2>&1 || skip "$c still missing after installing slurm-wlm and munge"
  done
fi
[ "$(id -u)" = 0 ] || skip "needs root (slurmd launches jobs; SlurmUser=root)"
command -v python3 >/dev/null 2>&1 || command -v jq >/dev/null 2>&1 ||
  skip "needs python3 or jq (the sbatch script reads data.eval with it)"

# ---------------------------------------------------------------- cleanup and failure report
stop_pid() {  # TERM, up to 10 s, then KILL; only PIDs this script started
  local p=$1 i
  kill -0 "$p" 2>/dev/null || return 0
  kill -TERM "$p" 2>/dev/null
  for i in $(seq 1 50); do kill -0 "$p" 2>/dev/null || return 0; sleep 0.2; done
  kill -KILL "$p" 2>/dev/null
}

cleanup() {
  local rc=$? j i
  trap - EXIT INT TERM
  if [ -n "$T" ] && [ -f "$T/slurm.conf" ] && [ ${#JOBS[@]} -gt 0 ]; then
    for j in "${JOBS[@]}"; do scancel "$j" 2>/dev/null; done
    for i in $(seq 1 75); do  # let slurmstepd finish the jobs before stopping the daemons
      [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
      sleep 0.2
    done
  fi
  for ((i = ${#DAEMON_PIDS[@]} - 1; i >= 0; i--)); do stop_pid "${DAEMON_PIDS[$i]}"; done
  if [ "${KEEP:-0}" = 1 ] || [ "$FAILED" -gt 0 ] || [ "$rc" -ne 0 ]; then
    [ -n "$T" ] && echo "kept for inspection: $T ${RUN_DIRS[*]}"
  else
    [ -n "$T" ] && rm -rf "$T"
    for j in "${RUN_DIRS[@]}"; do rm -rf "$j"; done
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

dump() {
  local f
  echo "================ diagnostics"
  for f in "$T"/munged.log "$T"/slurmctld.log "$T"/slurmd.log; do
    [ -f "$f" ] && { echo "---- $f (last 60 lines)"; tail -n 60 "$f"; }
  done
  for f in "$@"; do
    [ -f "$f" ] && { echo "---- job log $f"; cat "$f"; }
  done
  [ ${#JOBS[@]} -gt 0 ] && for f in "${JOBS[@]}"; do scontrol show job "$f" 2>&1 | head -20; done
  echo "================"
}

fail_now() {  # an unrecoverable failure (setup): report and stop
  log "FAIL: $*"
  dump "${@:2}"
  FAILED=$((FAILED + 1))
  echo "$NAME: $PASSED passed, $FAILED failed ($(($(date +%s) - T0)) s)"
  exit 1
}

# wait_for SECONDS DESCRIPTION COMMAND...: polls COMMAND every 0.5 s
wait_for() {
  local secs=$1 what=$2 end
  shift 2
  end=$(($(date +%s) + secs))
  while ! "$@"; do
    [ "$(date +%s)" -ge "$end" ] && { log "timed out after ${secs}s waiting for $what"; return 1; }
    sleep 0.5
  done
}

job_field() { scontrol show job -o "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -n 1; }
job_final() {
  local s
  s=$(job_field "$1" JobState)
  case $s in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | PREEMPTED | BOOT_FAIL | DEADLINE) return 0 ;; esac
  return 1
}
has_checkpoint() { compgen -G "$1/step_*/DONE" >/dev/null; }
port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# ---------------------------------------------------------------- private cluster
T=$(mktemp -d /tmp/mmpost-slurm.XXXXXX)
chmod 755 "$T"
mkdir -p "$T/munge" "$T/state" "$T/spool" "$T/submit"
chmod 755 "$T/munge"
export SLURM_CONF=$T/slurm.conf
unset MMPOST_ROOT SLURM_JOB_ID SLURM_JOBID

if command -v mungekey >/dev/null 2>&1; then
  mungekey -c -k "$T/munge/munge.key" -b 1024 2>/dev/null
else
  dd if=/dev/urandom of="$T/munge/munge.key" bs=1024 count=1 2>/dev/null
fi
chmod 600 "$T/munge/munge.key"

CTLD_PORT=16817
while port_busy "$CTLD_PORT" || port_busy $((CTLD_PORT + 1)); do
  CTLD_PORT=$((CTLD_PORT + 2))
  [ "$CTLD_PORT" -gt 16900 ] && fail_now "no free port pair in 16817-16900"
done
SLURMD_PORT=$((CTLD_PORT + 1))
CPUS=$(nproc)
MEM=$(free -m | awk '/^Mem:/ {print int($2 * 0.8)}')
# Job ids (and so the default run folders runs/sft-<id>) that no earlier run used.
FIRST_ID=$(((RANDOM * 32768 + RANDOM) % 50000000 + 1000000))
while compgen -G "$ROOT/runs/*-$FIRST_ID" >/dev/null || compgen -G "$ROOT/runs/*-$((FIRST_ID + 1))" >/dev/null; do
  FIRST_ID=$((FIRST_ID + 100))
done

cat >"$T/slurm.conf" <<EOF
# Private single-node cluster of tests/slurm/test_slurm_preemption.sh
ClusterName=mmposttest
SlurmctldHost=localhost
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire is also how long a requeued job waits before it may start again (default 120 s).
AuthInfo=socket=$T/munge/munge.socket.2,cred_expire=5
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/slurmd.pid
SlurmctldLogFile=$T/slurmctld.log
SlurmdLogFile=$T/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig=$T/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=2
SlurmdParameters=config_overrides
MpiDefault=none
MailProg=/bin/true
JobRequeue=1
KillWait=10
ReturnToService=2
InactiveLimit=0
MinJobAge=600
FirstJobId=$FIRST_ID
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
: >"$T/plugstack.conf"
cat >"$T/cgroup.conf" <<EOF
# No cgroups: proctrack/linuxproc and task/none
CgroupAutomount=no
ConstrainCores=no
ConstrainRAMSpace=no
ConstrainDevices=no
EOF

log "starting munged, slurmctld, slurmd (conf $T/slurm.conf, ports $CTLD_PORT/$SLURMD_PORT, $CPUS CPUs, ${MEM} MB)"
munged -F --force --key-file="$T/munge/munge.key" --socket="$T/munge/munge.socket.2" \
  --pid-file="$T/munge/munged.pid" --seed-file="$T/munge/munged.seed" \
  --log-file="$T/munged.log" >"$T/munged.log" 2>&1 &
DAEMON_PIDS+=($!)
munge_ok() { [ -S "$T/munge/munge.socket.2" ] && munge -n -S "$T/munge/munge.socket.2" | unmunge -S "$T/munge/munge.socket.2" >/dev/null 2>&1; }
wait_for 15 "munged" munge_ok || fail_now "munged did not start"
(cd "$T" && exec slurmctld -D -f "$T/slurm.conf" >>"$T/slurmctld.log" 2>&1) &
DAEMON_PIDS+=($!)
(cd "$T" && exec slurmd -D -N localhost -f "$T/slurm.conf" >>"$T/slurmd.log" 2>&1) &
DAEMON_PIDS+=($!)
node_idle() { [ "$(sinfo -h -n localhost -o %T 2>/dev/null)" = idle ]; }
wait_for 40 "the node to be idle" node_idle || fail_now "slurmctld/slurmd did not come up"
log "cluster up"

# ---------------------------------------------------------------- the runs
cd "$ROOT" || exit 1
RECIPE=recipes/tiny/sft-tiny.json
COMMON=(--set num_threads=1 --set data.num_workers=1 --set train.keep_last_n_checkpoints=100
        --set train.log_every_n_steps=100)
RES=(--cpus-per-task=1 --mem=1G)

# Size the runs to this machine (and check that the binary trains at all): job A must still be
# training when the requeue lands (~12 s of steps), job B must outlast the first USR1, which
# Slurm sends up to ~30 s after it is due (~75 s of steps at the calibrated rate, which the short
# calibration run underestimates by up to ~1.5x).
"$BIN" sft --recipe "$RECIPE" --output "$T/calibrate" "${COMMON[@]}" --set train.max_steps=300 \
  --set data.eval='""' >"$T/calibrate.log" 2>&1 </dev/null ||
  { cat "$T/calibrate.log"; fail_now "calibration run (300 steps of $RECIPE) failed"; }
SPS=$(sed -n 's/.*"samples_per_s":\([0-9.]*\).*/\1/p' "$T/calibrate.log" | tail -n 1)
RATE=$(awk -v s="${SPS:-0}" 'BEGIN {r = int(s / 16); print (r < 20 ? 20 : r)}')  # batch 16
steps_for() { awk -v r="$RATE" -v t="$1" -v m="$2" 'BEGIN {n = int(r * t / 100) * 100; print (n < m ? m : n)}'; }
STEPS_A=$(steps_for 12 1000) STEPS_B=$(steps_for 75 3000)
FLAGS_A=("${COMMON[@]}" --set train.max_steps="$STEPS_A" --set train.save_every_n_steps=$((STEPS_A / 10)))
FLAGS_B=("${COMMON[@]}" --set train.max_steps="$STEPS_B" --set train.save_every_n_steps=$((STEPS_B / 10)))
log "calibration: $RATE steps/s on one thread; job A $STEPS_A steps, job B $STEPS_B steps"

submit() {  # submit DIR NAME [sbatch options] -- [script arguments]; prints the job id
  local dir=$1 name=$2
  shift 2
  local opts=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do opts+=("$1"); shift; done
  shift
  (cd "$dir" && env -u MMPOST_ROOT RECIPE="$RECIPE" sbatch --parsable -J "$name" "${opts[@]}" \
    "$ROOT/scripts/slurm/sft.sbatch" "$@")
}

# Job B first (the long one): the pre-timeout path, submitted from inside the clone.
JB='' LOG_B=''
if [ "${SLURM_TEST_PRETIMEOUT:-1}" = 1 ]; then
  SUB_B=$ROOT/runs/slurm-test-$FIRST_ID
  mkdir -p "$SUB_B"
  RUN_DIRS+=("$SUB_B")
  JB=$(submit "$SUB_B" mmpost-timeout "${RES[@]}" --time=1 --signal=B:USR1@55 -- "${FLAGS_B[@]}") ||
    fail_now "sbatch (job B) failed"
  JOBS+=("$JB")
  LOG_B=$SUB_B/mmpost-timeout-$JB.log
  RUN_DIRS+=("$ROOT/runs/sft-$JB")
  log "job B $JB (pre-timeout path: --time=1 --signal=B:USR1@55) submitted from $SUB_B"
fi

# Job A: the scontrol requeue path, submitted from a folder outside the clone.
JA=$(submit "$T/submit" mmpost-preempt "${RES[@]}" --time=10 -- "${FLAGS_A[@]}") ||
  fail_now "sbatch (job A) failed"
JOBS+=("$JA")
LOG_A=$T/submit/mmpost-preempt-$JA.log
OUT_A=$ROOT/runs/sft-$JA
RUN_DIRS+=("$OUT_A")
log "job A $JA (scontrol requeue path) submitted from $T/submit"

wait_for 90 "job A's first checkpoint in $OUT_A" has_checkpoint "$OUT_A" ||
  fail_now "job A wrote no checkpoint" "$LOG_A"
scontrol requeue "$JA" || fail_now "scontrol requeue $JA failed" "$LOG_A"
log "job A has $(basename "$(dirname "$(compgen -G "$OUT_A/step_*/DONE" | head -n 1)")"); scontrol requeue $JA sent"

# The reference: the same recipe and flags, uninterrupted, directly with build/mmpost.
log "uninterrupted reference run (build/mmpost sft, same flags)"
"$BIN" sft --recipe "$RECIPE" --output "$T/straight" --set num_threads=1 "${FLAGS_A[@]}" \
  >"$T/straight.log" 2>&1 </dev/null || { cat "$T/straight.log"; fail_now "reference run failed"; }

wait_for 150 "job A to finish" job_final "$JA" || fail_now "job A did not finish" "$LOG_A"

check() {  # check DESCRIPTION COMMAND...: records a failed expectation
  local what=$1
  shift
  "$@" && return 0
  log "  expected: $what"
  BAD=1
}
in_log() { grep -qF -- "$2" "$1"; }
verdict() {  # verdict NAME WHAT LOG...: counts the test (from BAD); on failure prints the logs
  local name=$1 what=$2
  shift 2
  if [ $BAD = 0 ]; then
    PASSED=$((PASSED + 1))
    log "PASS $name: $what"
  else
    FAILED=$((FAILED + 1))
    log "FAIL $name"
    dump "$@"
  fi
}
requeued_once() {  # requeued_once JOB LOG: COMPLETED 0:0 after one restart that resumed a checkpoint
  local state ec restarts
  state=$(job_field "$1" JobState) ec=$(job_field "$1" ExitCode) restarts=$(job_field "$1" Restarts)
  log "job $1: JobState=$state ExitCode=$ec Restarts=$restarts"
  check "job $1 COMPLETED" [ "$state" = COMPLETED ]
  check "job $1 exit code 0:0" [ "$ec" = 0:0 ]
  check "job $1 restarted once" [ "$restarts" = 1 ]
  check "mmpost stopped with a checkpoint on SIGTERM" in_log "$2" '"exit_reason":"signal"'
  check "the requeued start resumed" in_log "$2" "resumed from"
  check "the requeued start finished training" in_log "$2" '"exit_reason":"completed"'
}
same_weights() {  # same_weights A B WHAT: model.safetensors byte-identical
  if cmp -s "$1/model.safetensors" "$2/model.safetensors"; then
    log "  model.safetensors byte-identical to $3"
  else
    log "  expected: model.safetensors byte-identical to $3 ($2)"
    BAD=1
  fi
}

# ---- test 1: scontrol requeue
BAD=0
requeued_once "$JA" "$LOG_A"
check "found the clone from outside it (Command= path)" in_log "$LOG_A" "repository $ROOT;"
check "the log kept the first start (append, not truncate)" in_log "$LOG_A" "start (SLURM_RESTART_COUNT=0)"
check "the log has the requeued start" in_log "$LOG_A" "requeued start (SLURM_RESTART_COUNT=1)"
check "only one run folder (runs/sft-$JA)" [ "$(grep -cF "runs/sft-$JA" "$LOG_A")" -ge 2 ]
check "evaluation on data.eval ran" test -s "$OUT_A/val_eval.json"
check "final model exists" test -f "$OUT_A/model.safetensors"
same_weights "$OUT_A" "$T/straight" "the uninterrupted run"
verdict requeue "checkpoint on SIGTERM, requeued, resumed, COMPLETED 0, log appended, weights identical" \
  "$LOG_A" "$T/straight.log"

# ---- test 2: pre-timeout USR1 -> checkpoint -> requeue itself -> resume
if [ -n "$JB" ]; then
  wait_for 300 "job B to finish" job_final "$JB" || true
  BAD=0
  state=$(job_field "$JB" JobState) ec=$(job_field "$JB" ExitCode) restarts=$(job_field "$JB" Restarts)
  log "job B: JobState=$state ExitCode=$ec Restarts=$restarts"
  check "job B COMPLETED (not TIMEOUT or FAILED)" [ "$state" = COMPLETED ]
  check "job B exit code 0:0" [ "$ec" = 0:0 ]
  check "job B requeued itself at least once" [ "${restarts:-0}" -ge 1 ]
  check "USR1 reached the batch shell (if job B finished first, the machine ran faster than calibrated)" \
    in_log "$LOG_B" "time limit near (USR1)"
  check "mmpost stopped with a checkpoint" in_log "$LOG_B" '"exit_reason":"signal"'
  check "the job requeued itself" in_log "$LOG_B" "requeued: it restarts in the same folder"
  check "found the clone walking up from the submit dir" in_log "$LOG_B" "repository $ROOT;"
  check "the log kept the first start" in_log "$LOG_B" "start (SLURM_RESTART_COUNT=0)"
  check "the requeued start resumed" in_log "$LOG_B" "resumed from"
  check "training completed" in_log "$LOG_B" '"exit_reason":"completed"'
  check "evaluation on data.eval ran" test -s "$ROOT/runs/sft-$JB/val_eval.json"
  verdict pre-timeout "USR1 -> checkpoint -> self-requeue ($restarts restart(s)) -> resumed -> COMPLETED 0" "$LOG_B"
fi

# ---- test 3: srun data parallelism (scripts/slurm/multinode.sbatch, 2 tasks on this node):
# the losses equal one process with the 2x batch (the loader's window rule), rank 0 alone writes.
if [ "${SLURM_TEST_SRUN:-1}" = 1 ]; then
  BAD=0
  DP_FLAGS=(--set data.eval='""' --set train.max_steps=5 --set train.log_every_n_steps=1
            --set optim.lr=1e-3 --set dist.timeout_s=60 --set data.num_workers=1)
  OUT_DP=$T/dp
  JD=$(cd "$T/submit" && env -u MMPOST_ROOT STAGE=sft RECIPE="$RECIPE" OUT="$OUT_DP" MMPOST_ROOT="$ROOT" \
       sbatch --parsable -J mmpost-dp --nodes=1 --ntasks=2 --cpus-per-task=1 --mem=2G --time=5 \
       "$ROOT/scripts/slurm/multinode.sbatch" "${DP_FLAGS[@]}" --set train.batch_size=6) ||
    fail_now "sbatch (job D, multinode.sbatch) failed"
  JOBS+=("$JD")
  LOG_D=$T/submit/mmpost-dp-$JD.log
  log "job D $JD (srun, 2 tasks) submitted"
  "$BIN" sft --recipe "$RECIPE" --output "$T/dp_one" "${DP_FLAGS[@]}" --set num_threads=1 \
    --set train.batch_size=12 >"$T/dp_one.log" 2>&1 </dev/null || { cat "$T/dp_one.log"; fail_now "1-process reference for job D failed"; }
  wait_for 180 "job D to finish" job_final "$JD" || true
  state=$(job_field "$JD" JobState) ec=$(job_field "$JD" ExitCode)
  log "job D: JobState=$state ExitCode=$ec"
  check "job D COMPLETED" [ "$state" = COMPLETED ]
  check "job D exit code 0:0" [ "$ec" = 0:0 ]
  check "two ranks joined over srun" in_log "$LOG_D" "joining 2 processes (slurm"
  check "one summary line (rank 0 only)" [ "$(grep -c '"exit_reason":"completed"' "$LOG_D")" = 1 ]
  check "losses equal the 1-process run with batch 12 (rel 1e-5)" python3 - "$T/dp_one/metrics.jsonl" "$OUT_DP/metrics.jsonl" <<'PY'
import json, sys
def losses(p):
    return [json.loads(l)["loss"] for l in open(p) if '"loss"' in l]
a, b = losses(sys.argv[1]), losses(sys.argv[2])
print("losses 1 process:", a, "\n losses 2 ranks: ", b, file=sys.stderr)
sys.exit(0 if len(a) == len(b) == 5 and all(abs(x - y) <= 1e-5 * abs(x) for x, y in zip(a, b)) else 1)
PY
  verdict srun "2 ranks via multinode.sbatch equal one process with the 2x batch" "$LOG_D" "$T/dp_one.log"
fi

# ---- test 4: a preempted srun job: SIGTERM to both tasks, one checkpoint, requeue, resume on 2
# ranks, weights byte-identical to an uninterrupted 2-rank run.
if [ "${SLURM_TEST_SRUN:-1}" = 1 ]; then
  BAD=0
  PRE_FLAGS=("${COMMON[@]}" --set data.eval='""' --set dist.timeout_s=60 --set train.batch_size=8
             --set train.max_steps="$STEPS_A" --set train.save_every_n_steps=$((STEPS_A / 10)))
  OUT_E=$T/dp_preempt
  JE=$(cd "$T/submit" && env -u MMPOST_ROOT STAGE=sft RECIPE="$RECIPE" OUT="$OUT_E" MMPOST_ROOT="$ROOT" \
       sbatch --parsable -J mmpost-dp-preempt --nodes=1 --ntasks=2 --cpus-per-task=1 --mem=2G \
       --time=10 "$ROOT/scripts/slurm/multinode.sbatch" "${PRE_FLAGS[@]}") ||
    fail_now "sbatch (job E, multinode.sbatch) failed"
  JOBS+=("$JE")
  LOG_E=$T/submit/mmpost-dp-preempt-$JE.log
  log "job E $JE (srun, 2 tasks, scontrol requeue path) submitted"
  wait_for 90 "job E's first checkpoint in $OUT_E" has_checkpoint "$OUT_E" ||
    fail_now "job E wrote no checkpoint" "$LOG_E"
  scontrol requeue "$JE" || fail_now "scontrol requeue $JE failed" "$LOG_E"
  log "job E has $(basename "$(dirname "$(compgen -G "$OUT_E/step_*/DONE" | head -n 1)")"); scontrol requeue $JE sent"
  wait_for 180 "job E to finish" job_final "$JE" || true
  # The reference: the same 2-rank run uninterrupted, as two processes with torchrun's variables.
  PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  REF_PIDS=()
  for r in 0 1; do
    env -u SLURM_JOB_ID RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 \
      MASTER_PORT="$PORT" "$BIN" sft --recipe "$RECIPE" --output "$T/dp_straight" --set num_threads=1 \
      "${PRE_FLAGS[@]}" >"$T/dp_straight.$r.log" 2>&1 </dev/null &
    REF_PIDS+=($!)
  done
  ref_ok=1
  for p in "${REF_PIDS[@]}"; do wait "$p" || ref_ok=0; done
  [ $ref_ok = 1 ] || { cat "$T/dp_straight.0.log" "$T/dp_straight.1.log"; fail_now "uninterrupted 2-rank reference failed"; }
  requeued_once "$JE" "$LOG_E"
  check "two ranks joined after the requeue" [ "$(grep -c 'joining 2 processes (slurm' "$LOG_E")" -ge 2 ]
  same_weights "$OUT_E" "$T/dp_straight" "the uninterrupted 2-rank run"
  verdict "srun preemption" "both ranks stop at one step, checkpoint, requeue, resume, weights identical" \
    "$LOG_E" "$T/dp_straight.0.log"
fi

echo "$NAME: $PASSED passed, $FAILED failed ($(($(date +%s) - T0)) s)"
[ "$FAILED" = 0 ]
