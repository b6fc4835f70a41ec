#!/usr/bin/env python3
"""Builds DPO preference pairs from the digits VQA data and a model's own predictions.

For every record of the split: chosen = the correct digit; rejected = the model's own wrong
answer when it made one (on-policy pairs, from `mmpost eval --out PREDICTIONS`), otherwise the
digit the model most often confuses with the correct one on this split (its confusion matrix),
falling back to the class whose mean image is nearest in pixel space. Output is TRL's
conversational preference JSONL with image paths relative to the output file:

  {"id", "images": [...], "prompt": [user message], "chosen": [{"role": "assistant", ...}],
   "rejected": [...], "on_policy": true|false}

Usage:
  mmpost eval --model runs/digits-sft-short --data data/digits-vqa/train.jsonl \
      --out runs/digits-dpo/train_predictions.jsonl
  .venv/bin/python scripts/make_digits_preferences.py --data data/digits-vqa/train.jsonl \
      --predictions runs/digits-dpo/train_predictions.jsonl --out runs/digits-dpo/prefs.jsonl

Needs Pillow (installed in .venv by scripts/setup.sh).
"""
import argparse
import collections
import json
import os
import sys

from PIL import Image


def read_gray(path):
    """Pixel values of an image as a flat list of grayscale ints."""
    with Image.open(path) as im:
        return list(im.convert("L").getdata())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, help="digits VQA JSONL (SFT form)")
    ap.add_argument("--predictions", required=True, help="`mmpost eval --out` JSONL on --data")
    ap.add_argument("--out", required=True, help="preference JSONL to write")
    ap.add_argument("--max-pairs", type=int, default=0, help="0 = one pair per record")
    args = ap.parse_args()

    records = [json.loads(l) for l in open(args.data) if l.strip()]
    preds = {}
    for n, line in enumerate(open(args.predictions), 1):
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

    # The model's confusions on this split: confusions[truth][wrong digit] = count.
    confusions = collections.defaultdict(collections.Counter)
    for r in records:
        truth, pred = r["messages"][-1]["content"], preds[r["id"]]
        if pred != truth and pred.isdigit() and len(pred) == 1:
            confusions[truth][pred] += 1
    # Fallback: nearest other class by mean image.
    sums, counts = {}, collections.Counter()
    for r in records:
        d = r["messages"][-1]["content"]
        px = read_gray(os.path.join(data_dir, r["images"][0]))
        sums[d] = [a + b for a, b in zip(sums.get(d, [0] * len(px)), px)]
        counts[d] += 1
    means = {d: [v / counts[d] for v in s] for d, s in sums.items()}

    def nearest(d):
        return min((o for o in means if o != d),
                   key=lambda o: sum((a - b) ** 2 for a, b in zip(means[d], means[o])))

    n_on_policy = 0
    with open(args.out, "w") as out:
        for k, r in enumerate(records):
            if args.max_pairs and k >= args.max_pairs:
                break
            truth, pred = r["messages"][-1]["content"], preds[r["id"]]
            on_policy = pred != truth and pred != ""
            if on_policy:
                rejected = pred
            elif confusions[truth]:
                rejected = confusions[truth].most_common(1)[0][0]
            else:
                rejected = nearest(truth)
            n_on_policy += on_policy
            images = [os.path.relpath(os.path.join(data_dir, p), out_dir) for p in r["images"]]
            out.write(json.dumps({
                "id": r["id"], "images": images, "prompt": r["messages"][:-1],
                "chosen": [{"role": "assistant", "content": truth}],
                "rejected": [{"role": "assistant", "content": rejected}],
                "on_policy": on_policy}) + "\n")
    total = min(len(records), args.max_pairs) if args.max_pairs else len(records)
    print(f"{args.out}: {total} pairs, {n_on_policy} on-policy (the model's own mistakes), "
          f"{total - n_on_policy} from its confusion matrix", file=sys.stderr)


if __name__ == "__main__":
    main()
