#!/usr/bin/env python3
"""Build data/digits-math: arithmetic over 2-4 handwritten digits shown side by side, for
RL post-training with verifiable rewards (`mmpost rlhf`). Digits come from scikit-learn's
bundled copy of the UCI optical digits (load_digits, no download), and each split draws its
digit images only from the matching split of data/digits-vqa, so no held-out digit image
ever appears in a training image.

Usage (from the repo root, after scripts/make_digits_vqa.py):
    .venv/bin/python scripts/make_digits_math.py [--out data/digits-math]

Deterministic: fixed seeds (random.Random with integer seeds), PNGs written with
zlib + struct (no Pillow), so output bytes are stable.
"""
import argparse
import hashlib
import json
import os
import random
import struct
import sys
import zlib

import numpy as np
import sklearn
from sklearn.datasets import load_digits

SEED = 20240611  # record RNG: split k uses random.Random(SEED + k)
GAP = 1          # black pixel columns between two digits

# name -> (digit-vqa split the images come from, [(task, n_digits, count), ...])
SPLITS = {
    "train": ("train", [("sum", 2, 1000), ("sum", 3, 1000)]),
    "test": ("test", [("sum", 2, 150), ("sum", 3, 150)]),
    "ood": ("test", [("sum", 4, 150), ("product", 2, 150)]),
    "sft": ("train", [("sum", 2, 200), ("sum", 3, 200)]),
}

QUESTIONS = {
    "sum": [
        "What is the sum of the digits?",
        "Add up the handwritten digits. What is the total?",
        "What do the digits in the image add up to?",
        "Compute the sum of all digits shown.",
        "What is the total of the digits in this picture?",
    ],
    "product": [
        "What is the product of the two digits?",
        "Multiply the handwritten digits. What is the result?",
        "What do you get when you multiply the digits in the image?",
    ],
}


def png_gray8(pixels):
    """Encode a 2-D uint8 array as an 8-bit grayscale PNG (deterministic bytes)."""
    h, w = pixels.shape

    def chunk(tag, data):
        return (struct.pack(">I", len(data)) + tag + data
                + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF))

    raw = b"".join(b"\x00" + bytes(pixels[r].tolist()) for r in range(h))
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0)  # 8-bit, colour type 0 (gray)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
            + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def read_vqa_split(vqa_dir, name, labels):
    """sklearn row indices of one digits-vqa split, checked against its labels."""
    out = []
    with open(os.path.join(vqa_dir, f"{name}.jsonl"), encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            (path,) = rec["images"]
            i = int(os.path.basename(path).split(".")[0])
            assert str(labels[i]) == rec["messages"][-1]["content"], (name, i)
            out.append(i)
    return sorted(out)


def compose(images, idxs):
    """Digits side by side, GAP black columns apart: 8 x (8k + GAP (k-1)) uint8."""
    k = len(idxs)
    canvas = np.zeros((8, 8 * k + GAP * (k - 1)), dtype=np.uint8)
    for j, i in enumerate(idxs):
        v = images[i].astype(np.int64)
        canvas[:, j * (8 + GAP):j * (8 + GAP) + 8] = ((v * 255 + 8) // 16).astype(np.uint8)
    return canvas


def solution(task, digits):
    """Assistant turn: the worked arithmetic in <think>, the number in <answer>."""
    if task == "sum":
        value = sum(digits)
        work = "+".join(map(str, digits))
    else:
        value = int(np.prod(digits))
        work = "*".join(map(str, digits))
    return str(value), f"<think>{work}={value}</think><answer>{value}</answer>"


def make_split(name, k, pool, plan, images, labels, out, taken):
    """Records of one split; `taken` holds (task, image tuple) pairs already used anywhere."""
    rng = random.Random(SEED + k)
    specs = [(task, n) for task, n, count in plan for _ in range(count)]
    rng.shuffle(specs)  # interleave difficulties
    records = []
    for r, (task, n) in enumerate(specs):
        while True:
            idxs = tuple(rng.choice(pool) for _ in range(n))
            if (task, idxs) not in taken:
                break
        taken.add((task, idxs))
        digits = [int(labels[i]) for i in idxs]
        answer, assistant = solution(task, digits)
        image = f"images/{name}-{r:04d}.png"
        with open(os.path.join(out, image), "wb") as f:
            f.write(png_gray8(compose(images, idxs)))
        records.append({
            "id": f"digits-math-{name}-{r:04d}",
            "images": [image],
            "messages": [
                {"role": "user", "content": "<image>\n" + rng.choice(QUESTIONS[task])},
                {"role": "assistant", "content": assistant},
            ],
            "answer": answer,
            "difficulty": n,
            "task": task,
            "digits": digits,
            "source_rows": list(idxs),
        })
    with open(os.path.join(out, f"{name}.jsonl"), "w", encoding="utf-8", newline="\n") as f:
        for rec in records:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    return records


def main():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(root, "data", "digits-math"))
    ap.add_argument("--vqa", default=os.path.join(root, "data", "digits-vqa"))
    args = ap.parse_args()
    out = os.path.normpath(args.out)
    os.makedirs(os.path.join(out, "images"), exist_ok=True)

    d = load_digits()
    images, labels = d.images, d.target.astype(int)
    assert images.shape == (1797, 8, 8), images.shape
    csv = os.path.join(os.path.dirname(sklearn.datasets.__file__), "data", "digits.csv.gz")
    with open(csv, "rb") as f:
        csv_sha = hashlib.sha256(f.read()).hexdigest()
    print(f"source: sklearn {sklearn.__version__} load_digits() <- {csv} sha256={csv_sha}")

    vqa = {s: read_vqa_split(args.vqa, s, labels) for s in ("train", "val", "test")}
    assert not set(vqa["train"]) & set(vqa["test"])

    taken = set()
    for k, (name, (source, plan)) in enumerate(SPLITS.items()):
        records = make_split(name, k, vqa[source], plan, images, labels, out, taken)
        used = {i for rec in records for i in rec["source_rows"]}
        assert used <= set(vqa[source]), name
        by = {}
        for rec in records:
            key = f"{rec['task']}/{rec['difficulty']}"
            by[key] = by.get(key, 0) + 1
        print(f"{name}: {len(records)} records from {len(used)} distinct {source}-split digit images, {by}")


if __name__ == "__main__":
    sys.exit(main())
