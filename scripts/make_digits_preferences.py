#!/usr/bin/env python3
"""Builds DPO preference pairs from the digits VQA data and a model's own predictions.

chosen = the correct digit. Two ways to pick the rejected answer (--mode):

  balanced (default)  one on-policy pair per record the model got wrong (rejected = its own wrong
                      answer, from `mmpost eval --out PREDICTIONS`), plus "anchor" pairs that
                      cancel the bias of those pairs: a weak model over-predicts a few digits, so
                      its mistakes reject those digits far more often than they are chosen, and
                      plain DPO then learns "say a digit the model rarely says" instead of reading
                      the image (held-out accuracy collapses onto 3/7/8). Anchor pairs take
                      records of an over-rejected digit t (records the model got right first) and
                      reject an under-rejected digit x, until every digit is rejected exactly as
                      often as it is chosen. Records the model got right that no anchor needs are
                      left out.
  confusion           one pair per record: the model's own wrong answer when it made one,
                      otherwise the digit it most often confuses with the correct one on this
                      split (its confusion matrix), falling back to the class whose mean image is
                      nearest in pixel space.

Output is TRL's conversational preference JSONL with image paths relative to the output file:

  {"id", "images": [...], "prompt": [user message], "chosen": [{"role": "assistant", ...}],
   "rejected": [...], "on_policy": true|false}

Usage:
  mmpost eval --model runs/digits-sft-short --data data/digits-vqa/train.jsonl \
      --out runs/digits-dpo/train_predictions.jsonl
  .venv/bin/python scripts/make_digits_preferences.py --data data/digits-vqa/train.jsonl \
      --predictions runs/digits-dpo/train_predictions.jsonl --out runs/digits-dpo/prefs.jsonl

Needs Pillow (installed in .venv by scripts/setup.sh) for --mode confusion.
"""
import argparse
import collections
import json
import os
import sys


def read_gray(path):
    """Pixel values of an image as a flat list of grayscale ints."""
    from PIL import Image
    with Image.open(path) as im:
        im = im.convert("L")
        return list(im.get_flattened_data() if hasattr(im, "get_flattened_data") else im.getdata())


def truth_of(r):
    return r["messages"][-1]["content"].strip()


def confusion_pairs(records, preds, data_dir):
    """[(record index, rejected, on_policy)]: one per record (the original scheme)."""
    confusions = collections.defaultdict(collections.Counter)
    for r in records:
        truth, pred = truth_of(r), preds[r["id"]]
        if pred != truth and pred.isdigit() and len(pred) == 1:
            confusions[truth][pred] += 1
    means = None

    def nearest(d):
        nonlocal means
        if means is None:  # nearest other class by mean image (only when needed: slow)
            sums, counts = {}, collections.Counter()
            for r in records:
                t = truth_of(r)
                px = read_gray(os.path.join(data_dir, r["images"][0]))
                sums[t] = [a + b for a, b in zip(sums.get(t, [0] * len(px)), px)]
                counts[t] += 1
            means = {t: [v / counts[t] for v in s] for t, s in sums.items()}
        return min((o for o in means if o != d),
                   key=lambda o: sum((a - b) ** 2 for a, b in zip(means[d], means[o])))

    out = []
    for k, r in enumerate(records):
        truth, pred = truth_of(r), preds[r["id"]]
        if pred != truth and pred != "":
            out.append((k, pred, True))
        elif confusions[truth]:
            out.append((k, confusions[truth].most_common(1)[0][0], False))
        else:
            out.append((k, nearest(truth), False))
    return out


def balanced_pairs(records, preds):
    """[(record index, rejected, on_policy)]: the model's mistakes + bias-cancelling anchors."""
    out = []
    surplus = collections.Counter()  # times rejected - times chosen, per answer
    for k, r in enumerate(records):
        truth, pred = truth_of(r), preds[r["id"]]
        if pred != truth and pred != "":
            out.append((k, pred, True))
            surplus[pred] += 1
            surplus[truth] -= 1
    digits = sorted({truth_of(r) for r in records})
    # Anchor records per truth: the ones the model got right first, then the rest, cycled.
    by_truth = collections.defaultdict(list)
    for k, r in sorted(enumerate(records), key=lambda kr: preds[kr[1]["id"]] != truth_of(kr[1])):
        by_truth[truth_of(r)].append(k)
    used = collections.Counter()
    for t in sorted(digits, key=lambda d: -surplus[d]):
        while surplus[t] > 0 and by_truth[t]:
            x = min((d for d in surplus if d != t), key=lambda d: surplus[d], default=None)
            if x is None or surplus[x] >= 0:
                break
            k = by_truth[t][used[t] % len(by_truth[t])]
            used[t] += 1
            out.append((k, x, False))
            surplus[t] -= 1
            surplus[x] += 1
    return sorted(out, key=lambda p: p[0])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, help="digits VQA JSONL (SFT form)")
    ap.add_argument("--predictions", required=True, help="`mmpost eval --out` JSONL on --data")
    ap.add_argument("--out", required=True, help="preference JSONL to write")
    ap.add_argument("--mode", choices=["balanced", "confusion"], default="balanced")
    ap.add_argument("--max-pairs", type=int, default=0, help="0 = all pairs")
    args = ap.parse_args()

    records = [json.loads(l) for l in open(args.data) if l.strip()]
    preds = {}
    for line in open(args.predictions):
        if line.strip():
            p = json.loads(line)
            preds[p["id"]] = p["prediction"].strip()
    missing = [r["id"] for r in records if r["id"] not in preds]
    if missing:
        sys.exit(f"error: {args.predictions}: no prediction for {len(missing)} record(s), "
                 f"e.g. {missing[0]} (run `mmpost eval --out` on the same --data)")

    data_dir = os.path.dirname(os.path.abspath(args.data))
    out_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(out_dir, exist_ok=True)

    if args.mode == "balanced":
        pairs = balanced_pairs(records, preds)
    else:
        pairs = confusion_pairs(records, preds, data_dir)
    if args.max_pairs:
        pairs = pairs[:args.max_pairs]

    n_correct = sum(preds[r["id"]] == truth_of(r) for r in records)
    chosen_n, rejected_n = collections.Counter(), collections.Counter()
    with open(args.out, "w") as out:
        for k, rejected, on_policy in pairs:
            r = records[k]
            truth = truth_of(r)
            chosen_n[truth] += 1
            rejected_n[rejected] += 1
            images = [os.path.relpath(os.path.join(data_dir, p), out_dir) for p in r["images"]]
            out.write(json.dumps({
                "id": r["id"], "images": images, "prompt": r["messages"][:-1],
                "chosen": [{"role": "assistant", "content": truth}],
                "rejected": [{"role": "assistant", "content": rejected}],
                "on_policy": on_policy}) + "\n")
    n_on = sum(p[2] for p in pairs)
    skew = sum(abs(rejected_n[d] - chosen_n[d]) for d in set(chosen_n) | set(rejected_n))
    print(f"{args.out}: {len(pairs)} pairs ({args.mode}), {n_on} on-policy (the model's own "
          f"mistakes), {len(pairs) - n_on} others; model accuracy on --data "
          f"{n_correct / max(1, len(records)):.4f}; sum |rejected - chosen| over answers {skew}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
