# shellcheck shell=bash
# Shared body of the Slurm batch scripts (sft.sbatch, sft-gpu.sbatch, stage.sbatch); sourced by
# them once they have found the repository, never run directly.
#
# One training run per job, in ONE output folder for the job's whole life: OUT (default
# runs/<stage>-<job id>; the job id survives requeues, so a requeued job resumes the same folder).
# mmpost runs as a plain child of the batch shell, not under srun: srun turns a SIGTERM it receives
# into a SIGKILL of its tasks ("srun: forcing job termination"), which would lose the checkpoint.
#
# Signals:
#   USR1 (sbatch --signal=B:USR1@SECS, before the time limit): SIGTERM to mmpost, which writes a
#       checkpoint and exits 143; then `scontrol requeue` puts the job back in the queue and the
#       next start resumes from that checkpoint. The job never ends as TIMEOUT or FAILED 143.
#   TERM (scontrol requeue, preemption, scancel; Slurm sends it to every process of the job, then
#       SIGKILL after KillWait): mmpost checkpoints and exits 143. A requeued or preempted job
#       resumes on its next start; a cancelled one resumes when resubmitted with OUT=<folder>.
#
# Environment (all optional): RECIPE, OUT, EVAL (1/0), EVAL_DATA (instead of the recipe's
# data.eval), DEVICE (passed as --device), NUM_THREADS (default: SLURM_CPUS_PER_TASK),
# MMPOST_BIN (default: build/mmpost).

_mps_log() { printf '[slurm %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
_mps_die() { _mps_log "error: $2"; exit "$1"; }

# Waits for the background child _mps_child; returns its exit status. The traps below may
# interrupt `wait` (it then returns 128+signal while the child still runs): wait again.
_mps_wait_child() {
  local pid=$_mps_child rc r2
  while :; do
    wait "$pid"; rc=$?
    kill -0 "$pid" 2>/dev/null || break
  done
  if [ "$rc" -gt 128 ]; then  # maybe interrupted just as the child exited: fetch its own status
    wait "$pid" 2>/dev/null; r2=$?
    [ "$r2" -ne 127 ] && rc=$r2
  fi
  _mps_child=''
  return "$rc"
}

_mps_on_usr1() {
  _mps_why=timelimit
  if [ -n "$_mps_child" ] && [ "$_mps_phase" = train ]; then
    _mps_log "time limit near (USR1): asking mmpost to checkpoint and stop (SIGTERM)"
    kill -TERM "$_mps_child" 2>/dev/null
  else
    _mps_log "time limit near (USR1) during $_mps_phase: letting it finish"
  fi
}

_mps_on_term() {
  [ "$_mps_why" = timelimit ] || _mps_why=term
  _mps_log "SIGTERM (scontrol requeue, preemption or scancel): mmpost checkpoints and exits"
  [ -n "$_mps_child" ] && kill -TERM "$_mps_child" 2>/dev/null
}

# SIGINT (Ctrl-C when run by hand) reaches mmpost from the terminal itself; forwarding another
# signal could arrive as its second SIGINT, which kills it without a checkpoint.
_mps_on_int() {
  [ "$_mps_why" = timelimit ] || _mps_why=term
  _mps_log "SIGINT: mmpost checkpoints and exits"
}

# Prints data.eval of a resolved recipe JSON (empty when unset); needs python3 or jq.
_mps_recipe_eval() {
  if command -v python3 >/dev/null 2>&1; then
    python3 -c 'import json, sys
d = json.load(open(sys.argv[1])).get("data") or {}
print(d.get("eval") or "")' "$1"
  elif command -v jq >/dev/null 2>&1; then
    jq -r '.data.eval // ""' "$1"
  else
    _mps_log "neither python3 nor jq found: cannot read data.eval from $1 (set EVAL_DATA)"
  fi
}

# The newest complete checkpoint folder name in OUT (empty when none).
_mps_newest_ckpt() {
  local d newest=''
  for d in "$OUT"/step_*/DONE; do [ -e "$d" ] && newest=$(basename "$(dirname "$d")"); done
  printf '%s' "$newest"
}

_mps_requeue() {
  if [ "$(_mps_newest_ckpt)" = "$_mps_ckpt_at_start" ]; then
    # Stopped where it started (a --signal lead as long as the time limit would loop forever).
    _mps_log "no new checkpoint since this start: not requeueing (is the USR1 lead of --signal longer than the time left?); resubmit with OUT=$OUT to resume"
    exit 143
  fi
  if [ -n "${SLURM_JOB_ID:-}" ] && scontrol requeue "$SLURM_JOB_ID"; then
    _mps_log "job $SLURM_JOB_ID requeued: it restarts in the same folder $OUT once Slurm allows (after AuthInfo cred_expire, 120 s by default)"
    exit 0
  fi
  _mps_log "could not requeue; resubmit with OUT=$OUT to resume from the checkpoint"
  exit 143
}

# mmpost_slurm_main STAGE [mmpost args...]: the whole job. Expects MMPOST_ROOT.
mmpost_slurm_main() {
  local stage=$1; shift
  cd "$MMPOST_ROOT" || _mps_die 2 "cannot cd to MMPOST_ROOT=$MMPOST_ROOT"
  local bin=${MMPOST_BIN:-build/mmpost}
  [ -x "$bin" ] || _mps_die 2 "$MMPOST_ROOT/$bin not found or not executable: build it first (bash scripts/setup.sh)"

  local recipe=${RECIPE:-}
  [ -n "$recipe" ] || _mps_die 2 "set RECIPE to a recipe JSON (e.g. RECIPE=recipes/digits-sft.json sbatch ...)"
  # Relative paths are relative to the repository (the recipes' data paths are); a RECIPE that
  # only exists relative to the submit directory is taken from there.
  if [ ! -f "$recipe" ] && [ -n "${SLURM_SUBMIT_DIR:-}" ] && [ -f "$SLURM_SUBMIT_DIR/$recipe" ]; then
    recipe=$SLURM_SUBMIT_DIR/$recipe
  fi
  [ -f "$recipe" ] || _mps_die 2 "recipe $recipe not found (relative paths are relative to $MMPOST_ROOT)"

  local id=${SLURM_JOB_ID:-local}
  [ -n "${SLURM_ARRAY_JOB_ID:-}" ] && id=${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}
  OUT=${OUT:-runs/$stage-$id}

  local restarts=${SLURM_RESTART_COUNT:-0}
  local threads=${NUM_THREADS:-${SLURM_CPUS_PER_TASK:-$(nproc)}}
  export OMP_NUM_THREADS=$threads

  # The output folder and recipe come from OUT and RECIPE; a requeued start must resume.
  local a args=() device_arg=
  local prev=
  for a in "$@"; do
    case $a in
      -o|--output|--output=*|-r|--recipe|--recipe=*)
        _mps_die 2 "pass the output folder as OUT=... and the recipe as RECIPE=... (environment), not $a" ;;
      --no-resume)
        if [ "$restarts" -gt 0 ]; then _mps_log "requeued start: ignoring --no-resume"; continue; fi ;;
      --device=*) device_arg=${a#--device=} ;;
    esac
    [ "$prev" = --device ] && device_arg=$a
    prev=$a
    args+=("$a")
  done
  if [ -n "${DEVICE:-}" ] && [ -z "$device_arg" ]; then
    args+=(--device "$DEVICE"); device_arg=$DEVICE
  fi

  if [ "$restarts" -gt 0 ]; then
    _mps_log "job $id requeued start (SLURM_RESTART_COUNT=$restarts) on $(hostname): resuming $OUT"
  else
    _mps_log "job $id start (SLURM_RESTART_COUNT=0) on $(hostname): mmpost $stage $recipe -> $OUT ($threads threads)"
  fi
  _mps_log "repository $MMPOST_ROOT; to resume by hand after a cancel: OUT=$OUT sbatch <this script> (same arguments)"

  _mps_child='' _mps_phase=train _mps_why=''
  _mps_ckpt_at_start=$(_mps_newest_ckpt)
  trap _mps_on_usr1 USR1
  trap _mps_on_term TERM
  trap _mps_on_int INT

  "$bin" "$stage" --recipe "$recipe" --output "$OUT" --set num_threads="$threads" \
    ${args[@]+"${args[@]}"} </dev/null &
  _mps_child=$!
  local rc=0
  _mps_wait_child || rc=$?

  case $rc in
    0)
      if [ "$_mps_why" = term ]; then
        _mps_log "mmpost finished as SIGTERM arrived; skipping the evaluation (a requeued start runs it)"
        exit 0
      fi
      _mps_log "mmpost $stage finished: $OUT" ;;
    130|143)
      if [ "$_mps_why" = timelimit ]; then
        _mps_log "mmpost wrote a checkpoint in $OUT and exited $rc; requeueing"
        _mps_requeue
      fi
      _mps_log "mmpost stopped by a signal (exit $rc) after writing a checkpoint in $OUT: a requeued or preempted job resumes from it; after scancel, resubmit with OUT=$OUT"
      exit "$rc" ;;
    1) _mps_die 1 "mmpost $stage failed (exit 1: runtime error, see above)" ;;
    2) _mps_die 2 "mmpost $stage refused the command or recipe (exit 2, see above)" ;;
    3) _mps_die 3 "mmpost $stage stopped on bad data (exit 3, FILE:LINE above)" ;;
    *) _mps_die "$rc" "mmpost $stage exited $rc" ;;
  esac

  # Greedy evaluation of the final model on the recipe's own data.eval (or EVAL_DATA).
  [ "${EVAL:-1}" = 1 ] || exit 0
  local data=${EVAL_DATA:-}
  [ -n "$data" ] || data=$(_mps_recipe_eval "$OUT/recipe.json")
  if [ -z "$data" ]; then
    _mps_log "no data.eval in $OUT/recipe.json and no EVAL_DATA: skipping evaluation"
    exit 0
  fi
  [ -f "$data" ] || _mps_die 3 "evaluation data $data not found"
  local name
  name=$(basename "$data"); name=${name%.jsonl}
  if [ "$OUT/${name}_eval.json" -nt "$OUT/model.safetensors" ]; then
    _mps_log "evaluation on $data already done: $(cat "$OUT/${name}_eval.json")"
    exit 0
  fi
  if [ "$_mps_why" = timelimit ]; then  # no time left for it in this allocation
    _mps_log "training done near the time limit: requeueing for the evaluation"
    _mps_requeue
  fi
  _mps_log "evaluating $OUT on $data (data.eval) -> $OUT/${name}_predictions.jsonl"
  local eval_args=(eval --model "$OUT" --data "$data" --out "$OUT/${name}_predictions.jsonl"
                   --num-threads "$threads")
  [ -n "$device_arg" ] && eval_args+=(--device "$device_arg")
  _mps_phase='eval'
  "$bin" "${eval_args[@]}" </dev/null >"$OUT/${name}_eval.stdout" &
  _mps_child=$!
  rc=0
  _mps_wait_child || rc=$?
  cat "$OUT/${name}_eval.stdout"
  if [ "$rc" -ne 0 ]; then
    rm -f "$OUT/${name}_eval.stdout"
    _mps_die "$rc" "mmpost eval exited $rc"
  fi
  tail -n 1 "$OUT/${name}_eval.stdout" >"$OUT/${name}_eval.json"
  rm -f "$OUT/${name}_eval.stdout"
  _mps_log "done: $OUT (eval: $OUT/${name}_eval.json)"
  exit 0
}
