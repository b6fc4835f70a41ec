"""Writes a small mixed-size photo set in mmpost's SFT JSONL format (for the preprocessing bench).

scikit-image's bundled sample photos (astronaut, coffee, chelsea, rocket, ...; no download), each
saved at a few scales as JPEG or PNG, so sizes range from ~150 px to ~1400 px on a side and color,
grayscale and RGBA files are all present. Deterministic.
Usage: python make_photos.py OUT_DIR   ->  OUT_DIR/photos.jsonl + OUT_DIR/images/*
"""
import json
import os
import sys

import numpy as np
import skimage.data as sd
from PIL import Image

NAMES = ["astronaut", "coffee", "chelsea", "rocket", "camera", "cat", "immunohistochemistry",
         "hubble_deep_field", "retina", "page", "text", "moon", "clock", "coins", "colorwheel", "logo",
         "grass", "brick"]
SCALES = [1.0, 0.6, 1.4]
QUESTIONS = ["Describe the image.", "What is shown in this picture?", "What colors dominate this photo?"]


def main(out_dir):
    os.makedirs(os.path.join(out_dir, "images"), exist_ok=True)
    rows = []
    for i, name in enumerate(NAMES):
        arr = getattr(sd, name)()
        img = Image.fromarray(np.asarray(arr))
        for j, s in enumerate(SCALES):
            w, h = max(32, int(img.width * s)), max(32, int(img.height * s))
            im = img if s == 1.0 else img.resize((w, h), Image.BICUBIC)
            png = (i + j) % 2 == 1 or im.mode == "RGBA"
            fname = f"images/{name}_{j}.{'png' if png else 'jpg'}"
            im.save(os.path.join(out_dir, fname), **({} if png else {"quality": 90}))
            rows.append({"id": f"{name}-{j}", "images": [fname], "messages": [
                {"role": "user", "content": "<image>\n" + QUESTIONS[(i + j) % len(QUESTIONS)]},
                {"role": "assistant", "content": f"A photo called {name}."}]})
    with open(os.path.join(out_dir, "photos.jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print(f"{len(rows)} images in {out_dir}")


if __name__ == "__main__":
    main(sys.argv[1])
