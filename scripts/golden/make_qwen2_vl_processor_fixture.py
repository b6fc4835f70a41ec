"""Golden fixture for mmpost's Qwen2-VL / Qwen2.5-VL image processor vs transformers'
Qwen2VLImageProcessorPil (tests/golden/test_qwen2_vl_processor.cpp).

Writes tests/golden/fixtures/qwen2_vl_processor/:
  chelsea.png, astronaut.png, coffee.png, rocket.png, camera.png
                               real photos (scikit-image samples) pre-shrunk with PIL to odd sizes
                               (w x h) 43x29, 29x45, 20x20, 60x13 and 11x9 (camera stays
                               grayscale: the loader replicates it as PIL's convert("RGB") does)
  preprocessor_config.json     Qwen2VLImageProcessorPil.save_pretrained with patch_size 4,
                               merge_size 2 (resize factor 8), temporal_patch_size 2,
                               min_pixels 16*16 and max_pixels 8*8*20 (the transformers 5 layout:
                               size {shortest_edge, longest_edge})
  hub/preprocessor_config.json the Qwen2.5-VL hub layout (top-level min_pixels / max_pixels,
                               processor_class) at the real geometry: patch_size 14, merge_size 2,
                               min_pixels 28*28, max_pixels 28*28*2 (one small image: 28x56)
  expected.safetensors         per image I (main config): I.pixel_values [grid_h*grid_w, 96]
                               float32, I.image_grid_thw [1, 3] int64, I.image_uint8 [3, H, W]
                               uint8 (the image after smart_resize + PIL resize, before rescale);
                               batch.pixel_values [sum, 96] and batch.image_grid_thw [5, 3] (all
                               images in one call); hub.chelsea.pixel_values [8, 1176] and
                               hub.chelsea.image_grid_thw [1, 3] under hub/preprocessor_config.json
  case.json                    versions, images with their smart_resize branch, and a table of
                               transformers' smart_resize(h, w, factor, min_pixels, max_pixels)
                               outputs ([h, w], or "error" for an aspect ratio over 200)

The factor-8 geometry keeps the fixture small (pixel_values hold 24 bytes per resized pixel:
3 channels x 2 temporal copies x float32) while the image sizes still hit every smart_resize
branch: rounding half to even (20 / 8 = 2.5 -> 2, 60 / 8 = 7.5 -> 8), the max_pixels downscale
(astronaut) and the min_pixels upscale (camera). The hub case checks the real patch size 14.

Deterministic: rerunning rewrites identical bytes (given the same package versions).
Run: .venv/bin/python scripts/golden/make_qwen2_vl_processor_fixture.py
     (needs transformers 5.24, pillow, scikit-image, safetensors)
"""
import json
import os
import random
import shutil

import numpy as np
import PIL
import skimage
import torch
import transformers
from PIL import Image
from safetensors.torch import save_file
from skimage import data as skdata
from transformers import Qwen2VLImageProcessorPil
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "golden",
                   "fixtures", "qwen2_vl_processor")
PATCH, MERGE, TEMPORAL = 4, 2, 2
MIN_PIXELS, MAX_PIXELS = 16 * 16, 8 * 8 * 20
HUB = {  # Qwen/Qwen2.5-VL-*-Instruct's file, with a smaller pixel budget
    "min_pixels": 28 * 28,
    "max_pixels": 28 * 28 * 2,
    "patch_size": 14,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "image_processor_type": "Qwen2VLImageProcessor",
    "processor_class": "Qwen2_5_VLProcessor",
}


def write_images():
    """Five real photos, pre-shrunk; returns [(file, PIL RGB image as the processor sees it)]."""
    lanczos = Image.Resampling.LANCZOS
    images = {
        "chelsea.png": Image.fromarray(skdata.chelsea()).resize((43, 29), lanczos),
        "astronaut.png": Image.fromarray(skdata.astronaut()[:, 96:416]).resize((29, 45), lanczos),
        "coffee.png": Image.fromarray(skdata.coffee()[:, 100:500]).resize((20, 20), lanczos),
        "rocket.png": Image.fromarray(skdata.rocket()[150:280]).resize((60, 13), lanczos),
        "camera.png": Image.fromarray(skdata.camera()[40:459]).resize((11, 9), lanczos),  # "L"
    }
    for name, im in images.items():
        im.save(os.path.join(OUT, name))
    # Reload from disk so the processor sees exactly what mmpost decodes.
    return [(name, Image.open(os.path.join(OUT, name)).convert("RGB")) for name in images]


def branch(h, w, factor, min_pixels, max_pixels):
    """Which smart_resize branch (h, w) takes (for case.json's readers)."""
    hb, wb = round(h / factor) * factor, round(w / factor) * factor
    if hb * wb > max_pixels:
        return "max_pixels"
    return "min_pixels" if hb * wb < min_pixels else "round"


def smart_resize_table():
    """(h, w, factor, min, max) -> transformers' smart_resize, hand-picked edges plus random."""
    qwen = (28, 56 * 56, 28 * 28 * 1280)       # the processor class defaults
    hub = (28, 3136, 12845056)                 # Qwen2-VL / Qwen2.5-VL hub files
    small = (PATCH * MERGE, MIN_PIXELS, MAX_PIXELS)
    rows = [(70, 70, *qwen), (42, 42, *qwen), (98, 98, *qwen), (126, 126, *qwen), (14, 100, *qwen),
            (14, 14, *qwen), (1, 200, *qwen), (1, 201, *qwen), (3, 601, *qwen), (5600, 28, *qwen),
            (30, 5000, *small), (4032, 3024, *hub), (3024, 4032, *qwen), (1080, 1920, *qwen),
            (28, 28, *qwen), (1, 1, *qwen), (8191, 8191, *hub), (20, 20, *small), (13, 60, *small),
            (45, 29, *small), (9, 11, *small), (29, 43, *small)]
    rng = random.Random(1234)
    for _ in range(30):
        cfg = rng.choice([qwen, hub, small, (32, 32 * 32, 32 * 32 * 64)])
        rows.append((rng.randint(1, 4000), rng.randint(1, 4000), *cfg))
    table = []
    for h, w, factor, lo, hi in rows:
        try:
            out = list(smart_resize(h, w, factor=factor, min_pixels=lo, max_pixels=hi))
        except ValueError:
            out = "error"
        table.append({"height": h, "width": w, "factor": factor, "min_pixels": lo,
                      "max_pixels": hi, "expected": out})
    return table


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(os.path.join(OUT, "hub"))
    images = write_images()

    ip = Qwen2VLImageProcessorPil(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS, patch_size=PATCH,
                                  merge_size=MERGE, temporal_patch_size=TEMPORAL)
    ip.save_pretrained(OUT)
    ip = Qwen2VLImageProcessorPil.from_pretrained(OUT)  # what a reader of the file gets
    assert (ip.size["shortest_edge"], ip.size["longest_edge"]) == (MIN_PIXELS, MAX_PIXELS)

    tensors, cases = {}, []
    factor = PATCH * MERGE
    for name, image in images:
        key = os.path.splitext(name)[0]
        out = ip(images=[image], return_tensors="pt")
        chw = np.moveaxis(np.array(image), -1, 0)
        resized = ip.resize(chw, size=ip.size, resample=ip.resample, factor=factor)
        tensors[f"{key}.pixel_values"] = out.pixel_values.to(torch.float32).contiguous()
        tensors[f"{key}.image_grid_thw"] = out.image_grid_thw.to(torch.int64).contiguous()
        tensors[f"{key}.image_uint8"] = torch.from_numpy(np.ascontiguousarray(resized))
        h, w = image.height, image.width
        cases.append({"image": name, "height": h, "width": w,
                      "resized": list(resized.shape[1:]),
                      "branch": branch(h, w, factor, MIN_PIXELS, MAX_PIXELS),
                      "image_grid_thw": out.image_grid_thw[0].tolist()})
        print(name, f"{w}x{h} ->", cases[-1]["resized"], cases[-1]["branch"],
              tuple(out.pixel_values.shape))
    batch = ip(images=[im for _, im in images], return_tensors="pt")
    tensors["batch.pixel_values"] = batch.pixel_values.to(torch.float32).contiguous()
    tensors["batch.image_grid_thw"] = batch.image_grid_thw.to(torch.int64).contiguous()
    assert torch.equal(batch.pixel_values,
                       torch.cat([tensors[f"{os.path.splitext(n)[0]}.pixel_values"]
                                  for n, _ in images]))

    with open(os.path.join(OUT, "hub", "preprocessor_config.json"), "w") as f:
        json.dump(HUB, f, indent=2)
        f.write("\n")
    hub = Qwen2VLImageProcessorPil.from_pretrained(os.path.join(OUT, "hub"))
    assert (hub.size["shortest_edge"], hub.size["longest_edge"]) == (HUB["min_pixels"],
                                                                    HUB["max_pixels"])
    out = hub(images=[images[0][1]], return_tensors="pt")
    tensors["hub.chelsea.pixel_values"] = out.pixel_values.to(torch.float32).contiguous()
    tensors["hub.chelsea.image_grid_thw"] = out.image_grid_thw.to(torch.int64).contiguous()
    print("hub chelsea", tuple(out.pixel_values.shape), out.image_grid_thw.tolist())

    save_file(tensors, os.path.join(OUT, "expected.safetensors"))
    os.chmod(os.path.join(OUT, "expected.safetensors"), 0o644)  # save_file writes 0600

    meta = {
        "generator": "scripts/golden/make_qwen2_vl_processor_fixture.py",
        "versions": {"transformers": transformers.__version__, "pillow": PIL.__version__,
                     "numpy": np.__version__, "scikit-image": skimage.__version__,
                     "torch": torch.__version__},
        "image_processor": {"class": type(ip).__name__, "resample": "bicubic (3)",
                            "patch_size": PATCH, "merge_size": MERGE,
                            "temporal_patch_size": TEMPORAL, "min_pixels": MIN_PIXELS,
                            "max_pixels": MAX_PIXELS},
        "cases": cases,
        "hub_case": {"config": "hub/preprocessor_config.json", "image": images[0][0],
                     "image_grid_thw": out.image_grid_thw[0].tolist()},
        "smart_resize": smart_resize_table(),
    }
    with open(os.path.join(OUT, "case.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    total = sum(os.path.getsize(os.path.join(d, p)) for d, _, ps in os.walk(OUT) for p in ps)
    print(f"wrote {OUT} ({total} bytes)")


if __name__ == "__main__":
    main()
