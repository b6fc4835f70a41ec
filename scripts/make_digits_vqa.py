#!/usr/bin/env python3
"""Build data/digits-vqa: the UCI optical handwritten digits (as bundled in
scikit-learn's load_digits) turned into a tiny VQA set in TRL conversational form.

Usage (from the repo root):
    .venv/bin/python scripts/make_digits_vqa.py [--out data/digits-vqa]

Deterministic: fixed seeds, no dependence on time or hash order. PNGs are
written with zlib + struct (no Pillow needed), so output bytes are stable.
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
from sklearn.model_selection import train_test_split

SEED = 20240607          # split seed (sklearn random_state)
PROMPT_SEED = 1234       # question-phrasing RNG seed
N_TEST = 360
N_VAL = 150

QUESTIONS = [
    "Which digit is this?",
    "What number is written in the image?",
    "Read the handwritten digit.",
    "What digit does this image show? Answer with a single digit.",
    "Which handwritten digit (0-9) appears in this picture?",
    "Identify the digit in the image.",
]


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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "data", "digits-vqa"))
    args = ap.parse_args()
    out = os.path.normpath(args.out)
    os.makedirs(os.path.join(out, "images"), exist_ok=True)

    d = load_digits()
    images = d.images  # (1797, 8, 8) float, values 0..16
    labels = d.target.astype(int)
    n = len(labels)
    assert images.shape == (1797, 8, 8), images.shape
    assert images.min() >= 0 and images.max() <= 16
    assert np.all(images == np.round(images))

    csv = os.path.join(os.path.dirname(sklearn.datasets.__file__), "data", "digits.csv.gz")
    with open(csv, "rb") as f:
        csv_sha = hashlib.sha256(f.read()).hexdigest()
    print(f"source: sklearn {sklearn.__version__} load_digits() <- {csv} sha256={csv_sha}")

    # pixel mapping: value*255/16 rounded half-up (values are integers 0..16)
    for i in range(n):
        v = images[i].astype(np.int64)
        px = ((v * 255 + 8) // 16).astype(np.uint8)
        with open(os.path.join(out, "images", f"{i:04d}.png"), "wb") as f:
            f.write(png_gray8(px))

    idx = np.arange(n)
    rest, test = train_test_split(idx, test_size=N_TEST, stratify=labels, random_state=SEED)
    train, val = train_test_split(rest, test_size=N_VAL, stratify=labels[rest], random_state=SEED + 1)
    splits = {"train": sorted(train.tolist()), "val": sorted(val.tolist()), "test": sorted(test.tolist())}
    assert not (set(splits["train"]) & set(splits["val"]))
    assert not (set(splits["train"]) & set(splits["test"]))
    assert not (set(splits["val"]) & set(splits["test"]))
    assert sum(len(v) for v in splits.values()) == n

    rng = random.Random(PROMPT_SEED)
    qchoice = [rng.randrange(len(QUESTIONS)) for _ in range(n)]  # indexed by image id

    for name in ("train", "val", "test"):
        with open(os.path.join(out, f"{name}.jsonl"), "w", encoding="utf-8", newline="\n") as f:
            for i in splits[name]:
                rec = {
                    "id": f"digits-{i:04d}",
                    "images": [f"images/{i:04d}.png"],
                    "messages": [
                        {"role": "user", "content": "<image>\n" + QUESTIONS[qchoice[i]]},
                        {"role": "assistant", "content": str(int(labels[i]))},
                    ],
                }
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
        counts = np.bincount(labels[splits[name]], minlength=10).tolist()
        print(f"{name}: {len(splits[name])} samples, per-class {counts}")


if __name__ == "__main__":
    sys.exit(main())
