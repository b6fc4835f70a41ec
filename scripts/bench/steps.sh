#!/usr/bin/env bash
# mmpost's DPO step and GRPO step vs the loop a TRL user runs, written out in plain PyTorch over
# transformers' LlavaForConditionalGeneration (scripts/bench/ref_dpo.py, ref_grpo.py: TRL's
# DPOTrainer / GRPOTrainer math and data layout, HF's default fused AdamW, sdpa, fp32), CPU, the
# same torch threads, the same start model, data, order and resolved recipe.
#   data:   data/digits-math cut into per-digit 8x8 crops (scripts/split_digits_math.py);
#           preference pairs from its train split: chosen = the gold worked answer
#           "<think>a+b=c</think><answer>c</answer>", rejected = the same with a wrong sum;
#   start:  a short SFT of recipes/digits-sft.json's model on the formatted answers (sft split);
#   dpo:    recipes/digits-dpo.json (sigmoid, beta 0.1, rpo_alpha 1.0, batch 32 pairs) with a live
#           reference model (precompute_ref_log_probs false, as TRL without precompute);
#   grpo:   recipes/digits-grpo.json (16 prompts x G 8, 20 new tokens, numeric_match + 0.2 format,
#           dapo, beta 0, its staged curriculum).
#   LARGE=1 adds the same two stages on scripts/bench/sft-100m.json's ~100M model (a 1-step SFT
#           start; DPO batch 2 pairs; GRPO 2 prompts x G 4, 16 new tokens).
# Every run: constant lr, no eval, no intermediate checkpoint, shuffle off (file order), one
# loader thread. First a parity check at step 1 (log every step): DPO loss / logps / grad norm on
# both sides (policy == reference: the sigmoid term is ln 2), and GRPO at temperature 0 (greedy:
# both sides must sample the same completions, so rewards, lengths and entropy agree). Then
# REPEATS interleaved pairs (mmpost, reference, mmpost, ...) per stage; each side's throughput is
# its work over the time of its log windows after the first (warm-up); the table gives the median
# and range over the pairs of those runs' values and of the per-pair ratios mmpost / reference,
# and each side's peak RSS (/usr/bin/time -v; mmpost's includes its final model + AdamW save).
# Usage: bash scripts/bench/steps.sh      (about 10 minutes on 2 cores; LARGE=1 about 10 more)
# Env: REPEATS (5), THREADS (2), LARGE (0), LARGE_REPEATS (2), BENCH_OUT (/tmp/mmpost-bench-steps),
#      SFT_STEPS (300), DPO_STEPS (20) / DPO_LOG (5), GRPO_STEPS (12) / GRPO_LOG (3), CHECK (1: parity check),
#      REF_DPO_ARGS (e.g. --vision-once: the reference encodes each image once, as mmpost, not twice as TRL)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$ROOT"
REPEATS=${REPEATS:-5}
THREADS=${THREADS:-2}
LARGE=${LARGE:-0}
LARGE_REPEATS=${LARGE_REPEATS:-2}
OUT=${BENCH_OUT:-/tmp/mmpost-bench-steps}
SFT_STEPS=${SFT_STEPS:-300}
DPO_STEPS=${DPO_STEPS:-20}
DPO_LOG=${DPO_LOG:-5}
GRPO_STEPS=${GRPO_STEPS:-12}
GRPO_LOG=${GRPO_LOG:-3}
CHECK=${CHECK:-1}
REF_DPO_ARGS=${REF_DPO_ARGS:-}
PY="$ROOT/.venv/bin/python"
MMPOST="$ROOT/build/mmpost"
TIME=/usr/bin/time
[[ -x "$MMPOST" ]] || { echo "no $MMPOST: build it first (scripts/setup.sh)" >&2; exit 2; }
[[ -x "$TIME" ]] || { echo "needs GNU time: apt-get install time" >&2; exit 2; }
log() { echo "[steps $(date +%T)] $*" >&2; }
rm -rf "$OUT" && mkdir -p "$OUT"
T_START=$(date +%s)

# ---- data and start models ---------------------------------------------------------------------
SPLIT="$OUT/split"
"$PY" scripts/split_digits_math.py --src data/digits-math --out "$SPLIT" >/dev/null
"$PY" - "$SPLIT/train.jsonl" "$SPLIT/pairs.jsonl" <<'PY'
import json, sys
with open(sys.argv[2], "w") as f:
    for i, line in enumerate(open(sys.argv[1])):
        r = json.loads(line)
        gold, a = r["messages"][1]["content"], int(r["answer"])
        w = a + 1 + i % 3  # a wrong sum, same format
        bad = gold.replace(f"={a}</think>", f"={w}</think>").replace(f"<answer>{a}</answer>", f"<answer>{w}</answer>")
        assert bad != gold
        f.write(json.dumps({"id": r["id"], "images": r["images"], "prompt": [r["messages"][0]],
                            "chosen": [{"role": "assistant", "content": gold}],
                            "rejected": [{"role": "assistant", "content": bad}]}) + "\n")
PY
COMMON=(train.save_every_n_steps=0 train.eval_every_n_steps=0 'data.eval=""' "num_threads=$THREADS"
        data.shuffle_buffer=0 data.num_workers=1 'scheduler.name="constant"' scheduler.warmup_steps=0
        'device="cpu"')
log "start model: $SFT_STEPS SFT steps of the digits model on $SPLIT/sft.jsonl"
"$MMPOST" sft --recipe recipes/digits-sft.json --output "$OUT/start-digits" --no-resume \
  --set "${COMMON[@]}" "data.train=\"$SPLIT/sft.jsonl\"" "train.max_steps=$SFT_STEPS" \
  train.log_every_n_steps=100 >/dev/null 2>"$OUT/start-digits.log"
rm -rf "$OUT"/start-digits/step_*
CONFIGS=(digits)
if [[ "$LARGE" == 1 ]]; then
  log "start model: 1 SFT step of scripts/bench/sft-100m.json"
  "$MMPOST" sft --recipe scripts/bench/sft-100m.json --output "$OUT/start-100m" --no-resume \
    --set "${COMMON[@]}" "data.train=\"$SPLIT/sft.jsonl\"" data.max_length=256 train.max_steps=1 \
    train.log_every_n_steps=1 >/dev/null 2>"$OUT/start-100m.log"
  rm -rf "$OUT"/start-100m/step_*
  CONFIGS+=(100m)
fi

# Per config and stage: the recipe and the --set arguments of a timed run.
sets() {  # config stage -> prints one --set argument per line
  local cfg=$1 stage=$2
  printf '%s\n' "${COMMON[@]}" "model.path=\"$OUT/start-$cfg\""
  if [[ $stage == dpo ]]; then
    printf '%s\n' "data.train=\"$SPLIT/pairs.jsonl\"" dpo.precompute_ref_log_probs=false
    if [[ $cfg == digits ]]; then
      printf '%s\n' "train.max_steps=$DPO_STEPS" "train.log_every_n_steps=$DPO_LOG"
    else
      printf '%s\n' data.max_length=256 train.batch_size=2 train.max_steps=4 train.log_every_n_steps=1
    fi
  else
    printf '%s\n' "data.train=\"$SPLIT/train.jsonl\""
    if [[ $cfg == digits ]]; then
      printf '%s\n' "train.max_steps=$GRPO_STEPS" "train.log_every_n_steps=$GRPO_LOG"
    else
      printf '%s\n' data.max_length=256 train.batch_size=2 rlhf.num_generations=4 \
        rlhf.max_completion_length=16 train.max_steps=4 train.log_every_n_steps=1
    fi
  fi
}
recipe_of() { [[ $1 == dpo ]] && echo recipes/digits-dpo.json || echo recipes/digits-grpo.json; }
ref_of() { [[ $1 == dpo ]] && echo scripts/bench/ref_dpo.py || echo scripts/bench/ref_grpo.py; }
cmd_of() { [[ $1 == dpo ]] && echo dpo || echo rlhf; }

run_pair() {  # config stage tag extra-set...   -> $OUT/<tag>.{mmpost,ref}.*
  local cfg=$1 stage=$2 tag=$3; shift 3
  local d="$OUT/$tag"
  mapfile -t S < <(sets "$cfg" "$stage")
  $TIME -v -o "$d.mmpost.time" "$MMPOST" "$(cmd_of "$stage")" --recipe "$(recipe_of "$stage")" \
    --output "$d" --no-resume --set "${S[@]}" "$@" >"$d.mmpost.out" 2>"$d.mmpost.log" ||
    { log "FAILED: mmpost $stage $cfg ($tag): $(tail -3 "$d.mmpost.log")"; return 1; }
  local extra=()
  [[ $stage == dpo && -n "$REF_DPO_ARGS" ]] && read -r -a extra <<<"$REF_DPO_ARGS"
  $TIME -v -o "$d.ref.time" "$PY" "$(ref_of "$stage")" --recipe "$d/recipe.json" "${extra[@]}" \
    >"$d.ref.json" 2>"$d.ref.log" ||
    { log "FAILED: reference $stage $cfg ($tag): $(tail -3 "$d.ref.log")"; return 1; }
  rm -rf "$d"/step_* "$d"/*.safetensors "$d"/ref_logps*.safetensors
}

# ---- parity at step 1 --------------------------------------------------------------------------
if [[ "$CHECK" == 1 ]]; then
  log "parity check: dpo, 2 steps, log every step (sigmoid alone, then with the recipe's rpo_alpha)"
  run_pair digits dpo check-dpo train.max_steps=2 train.log_every_n_steps=1 dpo.rpo_alpha=0
  run_pair digits dpo check-dpo-rpo train.max_steps=2 train.log_every_n_steps=1
  log "parity check: grpo at temperature 0 (greedy), 1 step"
  run_pair digits grpo check-grpo train.max_steps=1 train.log_every_n_steps=1 rlhf.temperature=0
fi

# ---- timed pairs -------------------------------------------------------------------------------
for cfg in "${CONFIGS[@]}"; do
  n=$REPEATS
  [[ $cfg == digits ]] || n=$LARGE_REPEATS
  for r in $(seq "$n"); do
    for stage in dpo grpo; do
      log "$stage $cfg repeat $r/$n"
      run_pair "$cfg" "$stage" "$stage-$cfg-$r" || true
    done
  done
done

# ---- report ------------------------------------------------------------------------------------
"$PY" - "$OUT" "$REPEATS" "$LARGE_REPEATS" "$THREADS" "$CHECK" "$(($(date +%s) - T_START))" "${CONFIGS[@]}" <<'PY'
import json, math, os, re, statistics, sys
out, repeats, large_repeats, threads, check, secs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6]
configs = sys.argv[7:]

def metrics(tag):
    return [json.loads(l) for l in open(os.path.join(out, tag, "metrics.jsonl")) if l.strip()]

def ref(tag):
    return json.loads(open(os.path.join(out, tag + ".ref.json")).read().strip().splitlines()[-1])

def rss_mb(path):
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", open(path).read())
    return int(m.group(1)) / 1024 if m else float("nan")

def med(xs):
    return statistics.median(xs) if xs else float("nan")

def fmt(x):
    return "nan" if x != x else f"{x:.4g}" if abs(x) < 1e4 else f"{x:,.0f}"

if check == "1":
    print("### Parity at step 1\n")
    print("| stage | metric | mmpost | reference | abs diff |")
    print("|---|---|---|---|---|")
    for tag, label in (("check-dpo", "dpo sigmoid"), ("check-dpo-rpo", "dpo sigmoid + rpo")):
        try:
            for step in (1, 2):
                mm = [m for m in metrics(tag) if m.get("step") == step and "loss" in m][0]
                rf = ref(tag)["first_steps"][step - 1]
                keys = ["loss", "loss/sigmoid", "loss/sft", "logps/chosen", "logps/rejected", "logits/chosen",
                        "logits/rejected", "rewards/accuracies", "rewards/margins", "grad_norm"]
                for k in keys if step == 1 else ["loss", "logps/chosen", "rewards/margins"]:
                    if k in rf and k in mm:
                        print(f"| {label}, step {step} | {k} | {mm[k]:.7g} | {rf[k]:.7g} | {abs(mm[k] - rf[k]):.2g} |")
                    elif k in rf:
                        print(f"| {label}, step {step} | {k} | (not logged) | {rf[k]:.7g} | |")
        except Exception as e:  # noqa: BLE001
            print(f"| {label} | (check failed: {e}) | | | |")
    print(f"| | ln 2 | | | {math.log(2):.7f} |")
    try:
        mm = [m for m in metrics("check-grpo") if m.get("step") == 1 and "reward" in m][0]
        rf = ref("check-grpo")["first_steps"][0]
        for k in sorted(set(mm) & set(rf)):
            if k.startswith("rewards/") or k in ("reward", "completions/mean_length", "completions/max_length",
                                                 "completions/clipped_ratio", "entropy", "frac_reward_zero_std",
                                                 "loss", "grad_norm"):
                print(f"| grpo (greedy) | {k} | {mm[k]:.6g} | {rf[k]:.6g} | {abs(mm[k] - rf[k]):.2g} |")
    except Exception as e:  # noqa: BLE001
        print(f"| grpo | (check failed: {e}) | | | |")
    print()

def after_first(rows):
    """(window, steps in it) for every log window after the first (warm-up)."""
    out, prev = [], 0
    for w in rows:
        out.append((w, w["step"] - prev))
        prev = w["step"]
    return out[1:]

def dpo_run(tag):
    """Work over time of the windows after the first: pairs/s and tokens/s of the same windows."""
    def agg(ws):
        t = sum(n / w["pairs_per_s"] for w, n in ws)  # seconds / pairs per step (a constant)
        return sum(n for _, n in ws) / t, sum(w["tokens_per_s"] * n / w["pairs_per_s"] for w, n in ws) / t
    mm, mm_tok = agg(after_first([m for m in metrics(tag) if "pairs_per_s" in m]))
    rf, rf_tok = agg(after_first(ref(tag)["windows"]))
    return {"mm": mm, "ref": rf, "mm_tok": mm_tok, "ref_tok": rf_tok, "tpp": ref(tag)["tokens_per_pair"]}

def grpo_run(tag):
    """Per side, over the windows after the first: mean step time, completion tokens per second of
    the whole step, and the step-weighted means of the rollout / update token rates."""
    r = ref(tag)
    B, G = r["prompts_per_step"], r["num_generations"]
    mm = after_first([m for m in metrics(tag) if "step_time_s" in m])
    rf = after_first(r["windows"])
    def wmean(ws, key):
        return sum(w[key] * n for w, n in ws) / sum(n for _, n in ws)
    def ctok(ws):  # completion tokens / seconds
        return sum(w["completions/mean_length"] * B * G * n for w, n in ws) / sum(w["step_time_s"] * n for w, n in ws)
    return {"step_mm": wmean(mm, "step_time_s"), "step_ref": wmean(rf, "step_time_s"),
            "ctok_mm": ctok(mm), "ctok_ref": ctok(rf),
            "roll_mm": wmean(mm, "rollout_tokens_per_s"), "roll_ref": wmean(rf, "rollout_tokens_per_s"),
            "upd_mm": wmean(mm, "update_tokens_per_s"), "upd_ref": wmean(rf, "update_tokens_per_s"),
            "len_mm": wmean(mm, "completions/mean_length"), "len_ref": wmean(rf, "completions/mean_length")}

print(f"### DPO and GRPO steps, mmpost vs TRL-equivalent PyTorch loops ({threads} threads, {secs} s)\n")
print("| config | stage | throughput | mmpost (median) | reference (median) | ratio mmpost/ref: median (min-max) | pairs | peak RSS mmpost / ref (MB) |")
print("|---|---|---|---|---|---|---|---|")
for cfg in configs:
    n = repeats if cfg == "digits" else large_repeats
    for stage in ("dpo", "grpo"):
        runs, rss = [], []
        for r in range(1, n + 1):
            tag = f"{stage}-{cfg}-{r}"
            try:
                runs.append(dpo_run(tag) if stage == "dpo" else grpo_run(tag))
                rss.append((rss_mb(os.path.join(out, tag + ".mmpost.time")), rss_mb(os.path.join(out, tag + ".ref.time"))))
            except Exception as e:  # noqa: BLE001
                print(f"<!-- {tag}: {e} -->")
        if not runs:
            continue
        rs = f"{med([a for a, _ in rss]):.0f} / {med([b for _, b in rss]):.0f}"
        if stage == "dpo":
            rows = [("pairs/s", "mm", "ref", False), ("tokens/s", "mm_tok", "ref_tok", False)]
        else:
            rows = [("steps/s (1 / step_time_s)", "step_mm", "step_ref", True),
                    ("completion tokens/s, whole step", "ctok_mm", "ctok_ref", False),
                    ("rollout: completion tokens/s", "roll_mm", "roll_ref", False),
                    ("update: completion tokens/s", "upd_mm", "upd_ref", False)]
        for name, a, b, inverse in rows:
            va, vb = [x[a] for x in runs], [x[b] for x in runs]
            ratios = [(y / x) if inverse else (x / y) for x, y in zip(va, vb)]
            if inverse:
                va, vb = [1 / x for x in va], [1 / y for y in vb]
            print(f"| {cfg} | {stage} | {name} | {fmt(med(va))} | {fmt(med(vb))} | **{med(ratios):.2f}** "
                  f"({min(ratios):.2f}-{max(ratios):.2f}) | {len(runs)} | {rs} |")
        if stage == "dpo":
            print(f"| {cfg} | dpo | tokens per pair (ref) | | {runs[0]['tpp']:.1f} | | | |")
        else:
            print(f"| {cfg} | grpo | mean completion length | {med([x['len_mm'] for x in runs]):.2f} | "
                  f"{med([x['len_ref'] for x in runs]):.2f} | | | |")
PY
