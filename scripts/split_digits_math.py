#!/usr/bin/env python3
"""Split data/digits-math composite images into one 8x8 image per digit.

Each digits-math image shows k handwritten digits side by side: 8 rows x (8k + (k-1))
columns, digit j in columns [9j, 9j+8), digits separated by one black column (see
data/digits-math/README.md). A small VLM whose vision tower was trained on single 8x8
digits (runs/digits-sft, the digits-vqa model) can read the crops directly, so this script
rewrites every record to carry k images, `images/<split>-NNNN-<j>.png`, and replaces the
single `<image>` placeholder in the user turn by k consecutive `<image>` placeholders.
All other fields (answer, difficulty, task, digits, source_rows, messages) are kept.

Deterministic: output bytes depend only on the input files (Pillow only decodes; PNGs are
written with zlib + struct like scripts/make_digits_math.py). Usage (from the repository root):

    .venv/bin/python scripts/split_digits_math.py [--src data/digits-math] [--out runs/digits-math-split]
"""
import argparse
import json
import os
import struct
import sys
import zlib

from PIL import Image

SPLITS = ("train", "test", "ood", "sft")
DIGIT = 8   # digit width/height in pixels
GAP = 1     # black separator column between digits


def png_gray8(img):
    """Encode an 8-bit grayscale PIL image as PNG with zlib + struct (deterministic bytes,
    the same encoder as scripts/make_digits_math.py), independent of the Pillow version."""
    w, h = img.size
    data = img.tobytes()

    def chunk(tag, payload):
        return (struct.pack(">I", len(payload)) + tag + payload
                + struct.pack(">I", zlib.crc32(tag + payload) & 0xFFFFFFFF))

    raw = b"".join(b"\x00" + data[r * w:(r + 1) * w] for r in range(h))
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0)  # 8-bit, colour type 0 (gray)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
            + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def split_image(path, k):
    im = Image.open(path)
    im.load()
    if im.mode != "L":
        im = im.convert("L")
    w, h = im.size
    want_w = DIGIT * k + GAP * (k - 1)
    if h != DIGIT or w != want_w:
        raise ValueError(f"{path}: size {w}x{h}, expected {want_w}x{DIGIT} for {k} digits")
    crops = []
    for j in range(k):
        x0 = j * (DIGIT + GAP)
        if j > 0:  # the separator column must be black
            sep = [im.getpixel((x0 - 1, y)) for y in range(DIGIT)]
            if any(sep):
                raise ValueError(f"{path}: separator column {x0 - 1} is not black")
        crops.append(im.crop((x0, 0, x0 + DIGIT, DIGIT)))
    return crops


def convert(src, out):
    img_dir = os.path.join(out, "images")
    os.makedirs(img_dir, exist_ok=True)
    counts = {}
    for split in SPLITS:
        in_path = os.path.join(src, f"{split}.jsonl")
        out_path = os.path.join(out, f"{split}.jsonl")
        n = 0
        with open(in_path, encoding="utf-8") as fin, \
                open(out_path + ".tmp", "w", encoding="utf-8") as fout:
            for line in fin:
                if not line.strip():
                    continue
                rec = json.loads(line)
                if len(rec["images"]) != 1:
                    raise ValueError(f"{rec['id']}: expected one image, got {len(rec['images'])}")
                k = len(rec["digits"])
                if rec.get("difficulty", k) != k:
                    raise ValueError(f"{rec['id']}: difficulty {rec['difficulty']} != {k} digits")
                crops = split_image(os.path.join(src, rec["images"][0]), k)
                stem = os.path.splitext(os.path.basename(rec["images"][0]))[0]
                names = []
                for j, crop in enumerate(crops):
                    name = f"images/{stem}-{j}.png"
                    with open(os.path.join(out, name), "wb") as f:
                        f.write(png_gray8(crop))
                    names.append(name)
                rec["images"] = names
                n_placeholders = 0
                for msg in rec["messages"]:
                    c = msg.get("content")
                    if isinstance(c, str) and "<image>" in c:
                        n_placeholders += c.count("<image>")
                        msg["content"] = c.replace("<image>", "<image>" * k)
                if n_placeholders != 1:
                    raise ValueError(f"{rec['id']}: expected one <image> placeholder, got {n_placeholders}")
                fout.write(json.dumps(rec) + "\n")
                n += 1
        os.replace(out_path + ".tmp", out_path)
        counts[split] = n
    return counts


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--src", default="data/digits-math")
    ap.add_argument("--out", default="runs/digits-math-split")
    args = ap.parse_args()
    counts = convert(args.src, args.out)
    print(json.dumps({"out": args.out, "records": counts}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
