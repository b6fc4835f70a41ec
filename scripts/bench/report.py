"""Turns the raw results of run_all.sh (BENCH_OUT folder) into BENCHMARKS.md (stdout)."""
import argparse
import datetime
import glob
import json
import os
import platform
import re
import statistics
import subprocess

import PIL
import torch
import transformers

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def sh(*cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT).stdout.strip()
    except OSError:
        return "?"


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def spread(xs):
    return f"{min(xs):.4g}–{max(xs):.4g}" if xs else "–"


def maxrss_mb(path):
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", open(path).read())
    return int(m.group(1)) / 1024 if m else float("nan")


def cpu_model():
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "?"


def cpu_flags():
    for line in open("/proc/cpuinfo"):
        if line.startswith("flags"):
            f = set(line.split(":", 1)[1].split())
            return " ".join(x for x in ["avx2", "fma", "avx512f", "avx512_bf16", "amx_tile"] if x in f)
    return "?"


def mfu_flops(params, vision_cfg, tokens_per_s, images_per_s):
    """6 * N * tokens for each part, each part over the tokens it actually processes."""
    p = (vision_cfg["image_size"] // vision_cfg["patch_size"]) ** 2
    return 6 * (params["lm_other"] * tokens_per_s + params["projector"] * p * images_per_s
                + params["vision_tower"] * (p + 1) * images_per_s)


GENERATED = ("## Machine and versions", "## 1. ", "## 2. ", "## 3. ", "## Commands")


def kept_sections(path):
    """The `## ` sections of an earlier BENCHMARKS.md that main() does not write, as lines."""
    if not path or not os.path.exists(path):
        return []
    out, keep = [], False
    for line in open(path, encoding="utf-8").read().split("\n"):
        if line.startswith("## "):
            keep = not line.startswith(GENERATED)
        if keep:
            out.append(line)
    return out


NOTES_BEGIN, NOTES_END = "<!-- notes: {} -->", "<!-- /notes -->"


def kept_notes(path, name):
    """The hand-written block `<!-- notes: name -->` ... `<!-- /notes -->` of an earlier
    BENCHMARKS.md (run history, A/B results), as lines, markers included; a default pair of
    empty markers when there is none, so the next run keeps what is written between them."""
    begin = NOTES_BEGIN.format(name)
    if path and os.path.exists(path):
        lines = open(path, encoding="utf-8").read().split("\n")
        if begin in lines and NOTES_END in lines[lines.index(begin):]:
            i = lines.index(begin)
            return lines[i:lines.index(NOTES_END, i) + 1]
    return [begin, NOTES_END]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--mmpost", required=True)
    ap.add_argument("--pre", required=True)
    ap.add_argument("--repeats", type=int, required=True)
    ap.add_argument("--sft-repeats", type=int, required=True)
    ap.add_argument("--seconds", type=int, required=True)
    ap.add_argument("--keep-from", default="",
                    help="the previous BENCHMARKS.md: its sections this script does not write "
                         "(made by other scripts, each naming its command) are carried over")
    a = ap.parse_args()
    o = a.out_dir
    loads = [json.loads(l) for l in open(os.path.join(o, "load.jsonl"))]
    gemm = json.load(open(os.path.join(o, "gemm.json")))
    peak = gemm["peak_gflops"][str(a.threads)] * 1e9
    rev = sh("git", "rev-parse", "--short", "HEAD")
    # BENCHMARKS.md itself is being rewritten by this run (the shell truncates it first): not an edit.
    dirty = sh("git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!BENCHMARKS.md")
    mtime = datetime.datetime.fromtimestamp(os.path.getmtime(a.mmpost)).strftime("%Y-%m-%d %H:%M")
    pre_desc = "`build/mmpost bench-preprocess`"
    L = []
    w = L.append
    w("# mmpost benchmarks (CPU)\n")
    w("Regenerate with one command (about 7-10 minutes on 2 cores; it writes this file):\n")
    w("    bash scripts/bench/run_all.sh\n")
    w(f"Generated {datetime.datetime.now().strftime('%Y-%m-%d %H:%M')} in {a.seconds} s. "
      "Every mmpost run is paired with its reference run back to back in the same invocation, "
      "so both see the same machine state; ratios are mmpost / reference (> 1: mmpost faster or "
      "bigger).\n")
    w("## Machine and versions\n")
    w("| | |\n|---|---|")
    w(f"| CPU | {cpu_model()} ({cpu_flags()}), {os.cpu_count()} cores visible |")
    w(f"| load average (1/5/15 min) | start {loads[0]['load']}, end {loads[-1]['load']} |")
    w(f"| torch | {torch.__version__} (BLAS {gemm['blas']}, oneDNN {gemm['mkldnn']}); mmpost links the same libtorch |")
    w(f"| transformers / Pillow | {transformers.__version__} / {PIL.__version__} |")
    w(f"| mmpost | git {rev}{' + uncommitted edits in the tree' if dirty else ''}; build/mmpost built {mtime} |")
    try:
        malloc = [l.split(None, 1)[1].strip() for l in subprocess.run(
            [a.mmpost, "--version"], capture_output=True, text=True, timeout=60).stdout.splitlines()
            if l.startswith("malloc ")]
    except (OSError, subprocess.SubprocessError):
        malloc = []
    if malloc:
        w(f"| mmpost malloc | {malloc[0]}; the reference: glibc's (and tcmalloc in the ref + tcmalloc column) |")
    gemm_lines = [l for l in open(os.path.join(o, "sft-100m-1.mmpost.log"))
                  if "CPU matmuls in" in l] if os.path.exists(os.path.join(o, "sft-100m-1.mmpost.log")) else []
    if gemm_lines:
        w(f"| mmpost CPU GEMM | {gemm_lines[0].split('matmuls in ', 1)[1].strip()}; the reference: torch's nn.Linear (BLAS) |")
    w(f"| preprocessing binary | {pre_desc} |\n")
    start_load = float(loads[0]["load"].split()[0])
    w("The machine is shared with other users; compare ratios, not absolute values, across runs.\n")
    if start_load >= 1.0:
        w(f"> **Warning: measured under load {start_load:.1f} on {os.cpu_count()} cores** (other "
          "processes were running). Oversubscribed OpenMP threads stall at barriers, so "
          f"{a.threads}-thread training windows can be several times slower than on an idle machine "
          "and vary 5-10x between windows (see the min-max columns); the training ratios below are "
          "then dominated by which process happened to be descheduled, not by the code. "
          "Preprocessing (1 thread per worker) and GEMM are less affected. Rerun when idle.\n")

    # ---- 1. preprocessing
    rows = [json.loads(l) for l in open(os.path.join(o, "preprocess.jsonl"))]
    w("## 1. Preprocessing throughput (images/s)\n")
    w("JSONL record -> decoded RGB image -> shortest-edge resize + center crop -> rescale + "
      "normalize -> LLaVA prompt tokenized with `<image>` expanded to the patch count. "
      f"Median of {a.repeats} runs, each one untimed warm-up pass then timed passes over the file. "
      "1 thread per worker (torch and OpenCV in mmpost; torch in each HF DataLoader worker).\n")
    w("- **mmpost**: `bench-preprocess` = the `StreamingLoader<SftSample>` + `make_sft_sample` of "
      "`mmpost sft` (worker threads; builds labels too).")
    w("- **reference**: `LlavaProcessor(CLIPImageProcessor, LlamaTokenizer)` per record, PIL "
      "`Image.open().convert('RGB')` (torchvision is not installed, so CLIPImageProcessor is the "
      "PIL backend, `CLIPImageProcessorPil`); 1 worker = in-process loop, 2 = "
      "`torch.utils.data.DataLoader(num_workers=2, persistent_workers=True)`.")
    w("- photos: 54 files (18 scikit-image sample photos x 3 scales, JPEG/PNG, 150-2000 px), "
      "image_size 224, patch 14 (256 image tokens), bicubic (OpenCV's, not antialiased, vs PIL's "
      "antialiased bicubic; `mmpost_pil` rows use mmpost's Pillow-exact `pil_bicubic` where the "
      "build has it). digits: data/digits-vqa/train.jsonl (1287 8x8 PNGs), image_size 8, patch 4, "
      "mmpost `area` / PIL `BOX` (no resize happens at 8 px).\n")
    w("| data | workers | mmpost img/s | reference img/s | ratio | mmpost runs | reference runs | tokens/sample mmpost / ref |")
    w("|---|---|---|---|---|---|---|---|")
    for ds in ["photos", "digits"]:
        for wk in [1, 2]:
            sel = lambda impl: [r["result"] for r in rows if r["dataset"] == ds and r["workers"] == wk and r["impl"] == impl]
            m, h = sel("mmpost"), sel("hf")
            if not m or not h:
                continue
            mi, hi = [x["images_per_s"] for x in m], [x["images_per_s"] for x in h]
            tok = f"{m[0]['n_tokens'] / m[0]['n']:.1f} / {h[0]['n_tokens'] / h[0]['n']:.1f}"
            w(f"| {ds} | {wk} | {med(mi):.1f} | {med(hi):.1f} | **{med(mi) / med(hi):.2f}** | {spread(mi)} | {spread(hi)} | {tok} |")
            mp = sel("mmpost_pil")
            if mp:
                pi = [x["images_per_s"] for x in mp]
                w(f"| {ds} (mmpost_pil) | {wk} | {med(pi):.1f} | {med(hi):.1f} | **{med(pi) / med(hi):.2f}** | {spread(pi)} | {spread(hi)} | |")
    w("")

    # ---- 2. SFT
    w("## 2. SFT training step (tokens/s, peak RSS)\n")
    w("`mmpost sft` vs `scripts/bench/ref_sft.py`: a plain PyTorch loop over transformers' "
      "`LlavaForConditionalGeneration(LlavaConfig(**same config))` (`model.train()`, default "
      "attention = SDPA, HF's loss from `labels`, `loss.backward()`, "
      "`clip_grad_norm_(1.0)`, `torch.optim.AdamW(fused=True)` (HF Trainer / TRL default `adamw_torch_fused`) with mmpost's hyper-parameters and decay groups "
      f"(no decay on 1-D tensors), fp32, `torch.set_num_threads({a.threads})`). Same samples in "
      "the same order (digits train split, shuffle off), same template and padding. The reference "
      "builds its batches before the loop; mmpost preprocesses on 1 loader thread during the loop "
      "(cheap here: 8x8 PNGs). tokens = non-padding tokens (image tokens included). Throughput: "
      "windows of `log_every_n_steps` steps (mmpost's metrics.jsonl; the same windows in the "
      "reference), first window dropped as warm-up, median over the remaining windows of "
      f"{a.sft_repeats} runs. Peak RSS: `/usr/bin/time -v` maximum resident set of the whole "
      "process (mmpost's includes its final checkpoint save; the reference's includes the Python "
      "interpreter with torch + transformers imported, shown separately).\n")
    has_tc = bool(glob.glob(os.path.join(o, "sft-*.ref_tc.json")))
    if has_tc:
        w("Column **ref + tcmalloc**: the same reference with gperftools' tcmalloc in LD_PRELOAD, "
          "what PyTorch's CPU launcher (`python -m torch.backends.xeon.run_cpu`) does by default; "
          "build/mmpost links tcmalloc itself (`mmpost --version` names the allocator). The "
          "issue's targets are against the plain reference.\n")
    tc_head = " ref + tcmalloc tok/s | ratio vs it |" if has_tc else ""
    w("| config | params | batch x tokens/sample | mmpost tok/s | reference tok/s | ratio | mmpost windows | reference windows | peak RSS mmpost / ref (MB) | ref RSS before model (MB) |" + tc_head)
    w("|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if has_tc else ""))
    mfu_rows = []
    for cfg in ["digits", "100m"]:
        mt, rt, ms, rs, mr, rr, rb, tps, tct = [], [], [], [], [], [], [], [], []
        params = recipe = None
        for d in sorted(glob.glob(os.path.join(o, f"sft-{cfg}-*"))):
            if not os.path.isdir(d):
                continue
            recipe = json.load(open(os.path.join(d, "recipe.json")))
            met = [json.loads(l) for l in open(os.path.join(d, "metrics.jsonl")) if "tokens_per_s" in l]
            mt += [m["tokens_per_s"] for m in met[1:]]
            ms += [m["samples_per_s"] for m in met[1:]]
            tps += [m["tokens_per_s"] / m["samples_per_s"] for m in met]
            ref = json.loads(open(d + ".ref.json").read().strip().splitlines()[-1])
            params = ref["params"]
            rt += [x["tokens_per_s"] for x in ref["windows"][1:]]
            rs += [x["samples_per_s"] for x in ref["windows"][1:]]
            mr.append(maxrss_mb(d + ".mmpost.time"))
            rr.append(maxrss_mb(d + ".ref.time"))
            rb.append(ref["maxrss_before_model_kb"] / 1024)
            ref_tps = ref["tokens_per_sample"]
            if os.path.exists(d + ".ref_tc.json"):
                lines = open(d + ".ref_tc.json").read().strip().splitlines()
                if lines and lines[-1].startswith("{"):
                    tct += [x["tokens_per_s"] for x in json.loads(lines[-1])["windows"][1:]]
        if not mt:
            continue
        B = recipe["train"]["batch_size"]
        w(f"| {cfg} | {params['total'] / 1e6:.2f} M | {B} x {med(tps):.1f} (ref {ref_tps:.1f}) | "
          f"{med(mt):.0f} | {med(rt):.0f} | **{med(mt) / med(rt):.2f}** | {spread(mt)} | {spread(rt)} | "
          f"{med(mr):.0f} / {med(rr):.0f} | {med(rb):.0f} |" +
          ((f" {med(tct):.0f} | **{med(mt) / med(tct):.2f}** |" if tct else " - | - |") if has_tc else ""))
        vc = recipe["model"]["config"]["vision_config"]
        mfu_rows.append((cfg, params, vc, mfu_flops(params, vc, med(mt), med(ms)),
                         mfu_flops(params, vc, med(rt), med(rs))))
    w("")
    w("Configs: **digits** = recipes/digits-sft.json's model (CLIP 3x96 at 8 px / patch 4, Llama "
      "2x128, vocab 512), batch 32, 60 steps, windows of 10 (20 steps with windows of 5 before 2026-12-07 05:50). **100m** = scripts/bench/sft-100m.json "
      "(CLIP 4 layers x 512 at 64 px / patch 8 = 64 patches, Llama 12 layers x 768, MLP 2048, "
      "12 heads, vocab 512), batch 2, 16 steps, windows of 2 (8 steps before 2026-12-07 20:00, so that "
      "each run's median rests on 7 windows instead of 3).\n")
    L.extend(kept_notes(a.keep_from, "sft"))
    w("")

    # ---- 3. GEMM and MFU
    w("## 3. GEMM peak and model FLOPs utilization\n")
    w("Peak: n x n fp32 products in this torch build on both of its CPU GEMM libraries, BLAS "
      "(`torch.mm`, MKL) and oneDNN (`torch.ops.mkldnn._linear_pointwise`, the kernel mmpost's "
      "`cpu_gemm=onednn` runs), timed alternately, 2n^3 FLOP per call, median of 7 calls "
      "(scripts/bench/gemm_peak.py). The peak is the best of both.\n")
    by_path = gemm.get("gflops_by_path", {"blas": gemm["gflops"]})
    sizes = [k.split(":")[1] for k in by_path["blas"] if k.startswith("1:")]
    w("| path | threads | " + " | ".join(f"n={n}" for n in sizes) + " | best |")
    w("|---|---|" + "---|" * (1 + len(sizes)))
    for path, r in by_path.items():
        for th in gemm["peak_gflops"]:
            vals = [r[f"{th}:{n}"] for n in sizes]
            w(f"| {path} | {th} | " + " | ".join(f"{v:.1f}" for v in vals) + f" | **{max(vals):.1f} GFLOP/s** |")
    w("")
    w("MFU = achieved training FLOP/s / the peak above at the training's thread count "
      f"({a.threads}), with training FLOP/s = 6 x (N_lm x tokens/s + N_proj x P x images/s + "
      "N_vision x (P + 1) x images/s): forward + backward ~ 6 FLOP per parameter per token each "
      "part processes; N_lm = language-model parameters without the embedding table (lookup, "
      "not a matmul) but with lm_head; the projector sees the P patch tokens of each image, the "
      "vision tower P + 1 (class token); images/s = samples/s (one image per sample). Attention "
      "score/value matmuls (~12 L T d per token) are left out: T <= 100 here, a few percent.\n")
    w("| config | N_lm / N_proj / N_vision (M) | mmpost GFLOP/s | reference GFLOP/s | mmpost MFU | reference MFU |")
    w("|---|---|---|---|---|---|")
    for cfg, p, vc, fm, fr in mfu_rows:
        w(f"| {cfg} | {p['lm_other'] / 1e6:.2f} / {p['projector'] / 1e6:.2f} / {p['vision_tower'] / 1e6:.2f} | "
          f"{fm / 1e9:.1f} | {fr / 1e9:.1f} | {100 * fm / peak:.1f}% | {100 * fr / peak:.1f}% |")
    w("")
    L.extend(kept_sections(a.keep_from))
    w("## Commands\n")
    w("```")
    w("# 1. preprocessing (per workers W in 1 2, per repeat), photos then digits:")
    w("PHOTOS='--data $BENCH_OUT/photos/photos.jsonl --image-size 224 --patch-size 14 --interpolation bicubic --epochs 3'")
    w("DIGITS='--data data/digits-vqa/train.jsonl --image-size 8 --patch-size 4 --interpolation area --image-mean 0.5 0.5 0.5 --image-std 0.5 0.5 0.5 --epochs 2'")
    w("build/mmpost bench-preprocess $PHOTOS --num-workers W --num-threads 1")
    w(".venv/bin/python scripts/bench/ref_preprocess.py $PHOTOS --num-workers W --num-threads 1")
    w("# 2. SFT (per config, per repeat); the reference reads the recipe mmpost resolved:")
    w(f"SET='train.save_every_n_steps=0 train.eval_every_n_steps=0 data.eval=\"\" num_threads={a.threads} data.shuffle_buffer=0 data.num_workers=1 scheduler.name=\"constant\" scheduler.warmup_steps=0 device=\"cpu\"'")
    w("/usr/bin/time -v build/mmpost sft --recipe recipes/digits-sft.json --output $D --no-resume --set $SET train.max_steps=20 train.log_every_n_steps=5")
    w("/usr/bin/time -v build/mmpost sft --recipe scripts/bench/sft-100m.json --output $D --no-resume --set $SET train.batch_size=2 train.max_steps=8 train.log_every_n_steps=2")
    w("/usr/bin/time -v .venv/bin/python scripts/bench/ref_sft.py --recipe $D/recipe.json")
    w("# 3. GEMM peak")
    w(f".venv/bin/python scripts/bench/gemm_peak.py --threads 1 {a.threads}")
    w("```\n")
    print("\n".join(L))


if __name__ == "__main__":
    main()
