"""Golden fixtures for mmpost's image processor settings and tokenizer normalizers vs transformers
(tests/golden/test_processor_matrix.cpp).

Writes tests/golden/fixtures/processor_matrix/:
  <setting>/preprocessor_config.json   saved by the transformers image processor class (PIL
                                       backend) built with that setting's arguments
  <setting>/processor_config.json      (setting "llava_pad_v5" only) LlavaProcessor.save_pretrained
  images/*.png                         real photos (scikit-image): a landscape and a portrait shrunk
                                       with PIL, a 2x3 "tiny" crop and a 161x3 "strip" (extreme
                                       aspect ratio)
  expected.safetensors                 "<setting>/<image>" -> pixel_values [3, 32, 32] float32, as
                                       the processor returns them for that image
  normalizers/<rule>_<rew|keep>/tokenizer.model   sentencepiece models trained with normalization
                                       rule <rule>, removing extra whitespace (rew) or not (keep)
  normalizers/expected.json            per model and text: the ids transformers' LlamaTokenizer
                                       (legacy=False, no BOS) gives, and what sentencepiece itself
                                       gives (they differ whenever its normalizer changes the text:
                                       transformers' conversion does not apply it)
  case.json                            settings, their arguments, images, versions

Deterministic given the package versions. Run: .venv/bin/python scripts/golden/make_processor_matrix.py
"""
import io
import json
import os
import shutil

import numpy as np
import PIL
import sentencepiece as spm
import torch
import transformers
from PIL import Image
from safetensors.torch import save_file
from skimage import data as skdata
from transformers import (CLIPImageProcessorPil, LlamaTokenizer, LlavaImageProcessorPil,
                          LlavaProcessor)

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
OUT = os.path.join(ROOT, "tests", "golden", "fixtures", "processor_matrix")
S = 32  # the vision tower's image_size in every setting
R = Image.Resampling

BASE = dict(size={"shortest_edge": S}, crop_size={"height": S, "width": S}, resample=R.BICUBIC)
SETTINGS = {
    "clip_default": (CLIPImageProcessorPil, BASE),
    "resize_40_crop_32": (CLIPImageProcessorPil, {**BASE, "size": {"shortest_edge": 40}}),
    "resize_24_crop_32": (CLIPImageProcessorPil, {**BASE, "size": {"shortest_edge": 24}}),
    "resample_nearest": (CLIPImageProcessorPil, {**BASE, "resample": R.NEAREST}),
    "resample_lanczos": (CLIPImageProcessorPil, {**BASE, "resample": R.LANCZOS}),
    "resample_bilinear": (CLIPImageProcessorPil, {**BASE, "resample": R.BILINEAR}),
    "resample_box": (CLIPImageProcessorPil, {**BASE, "resample": R.BOX}),
    "resample_hamming": (CLIPImageProcessorPil, {**BASE, "resample": R.HAMMING}),
    "center_crop_off": (CLIPImageProcessorPil,
                        {**BASE, "size": {"height": S, "width": S}, "do_center_crop": False}),
    "normalize_off": (CLIPImageProcessorPil, {**BASE, "do_normalize": False}),
    "rescale_off": (CLIPImageProcessorPil, {**BASE, "do_rescale": False}),
    "mean_std_rescale": (CLIPImageProcessorPil,
                         {**BASE, "image_mean": [0.5, 0.4, 0.3], "image_std": [0.2, 0.3, 0.25],
                          "rescale_factor": 1 / 127.5}),
    "llava_pad": (LlavaImageProcessorPil, {**BASE, "do_pad": True}),
    # int(0.5 * 255) = 127: the pad colour a rounding rule would put at 128.
    "llava_pad_mean_half": (LlavaImageProcessorPil,
                            {**BASE, "do_pad": True, "resample": R.BILINEAR,
                             "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}),
    "llava_pad_v5": (LlavaImageProcessorPil, {**BASE, "do_pad": True, "resample": R.LANCZOS}),
}

# (rule, remove_extra_whitespaces); a non-identity model carries a ~240 KB precompiled charsmap,
# so the matrix keeps sentencepiece's default (nmt_nfkc + whitespace removal) and plain NFKC.
NORMALIZERS = [("identity", False), ("identity", True), ("nmt_nfkc", True), ("nfkc", False)]
CORPUS = ["USER: What is shown in this image? ASSISTANT: A cat on the mat.",
          "The quick brown fox jumps over the lazy dog.",
          "ｆｕｌｌ width letters and ligatures ﬁ ﬂ, Ａ Ｂ Ｃ, ① ② ③",
          "Café déjà vu; naïve façade. Straße, ÆSIR, Ωmega"] * 3
TEXTS = ["Hello   world", "  leading and trailing  ", "ｆｕｌｌ ﬁ Ａ①", "Café\u0301 Straße",
         "USER: What is shown in this image? ASSISTANT:", "tab\tand\nnewline"]
LEGACY_TEXTS = ["USER: <image>\nWhat is shown in this image? ASSISTANT:", "a<image> b<image>c",
                "<image>Hello  world"]


def write_images():
    os.makedirs(os.path.join(OUT, "images"))
    astronaut = Image.fromarray(skdata.astronaut()[:, 96:416])
    chelsea = Image.fromarray(skdata.chelsea())
    coffee = skdata.coffee()
    images = {
        "landscape.png": chelsea.resize((149, 97), R.LANCZOS),
        "portrait.png": astronaut.resize((101, 157), R.LANCZOS),
        "tiny.png": Image.fromarray(np.ascontiguousarray(coffee[200:203, 300:302])),
        "strip.png": Image.fromarray(np.ascontiguousarray(coffee[150:153, 100:261])),
    }
    for name, im in images.items():
        im.save(os.path.join(OUT, "images", name))
    return {n: Image.open(os.path.join(OUT, "images", n)).convert("RGB") for n in images}


def write_normalizers():
    base = os.path.join(OUT, "normalizers")
    expected = {"texts": TEXTS, "models": {}}
    for rule, rew in NORMALIZERS:
        if True:
            name = f"{rule}_{'rew' if rew else 'keep'}"
            d = os.path.join(base, name)
            os.makedirs(d)
            model = io.BytesIO()
            spm.SentencePieceTrainer.train(
                sentence_iterator=iter(CORPUS), model_writer=model, model_type="bpe",
                vocab_size=420, character_coverage=1.0, byte_fallback=True, unk_id=0, bos_id=1,
                eos_id=2, pad_id=-1, add_dummy_prefix=True, remove_extra_whitespaces=rew,
                normalization_rule_name=rule, input_sentence_size=0,
                shuffle_input_sentence=False, num_threads=1, minloglevel=2)
            with open(os.path.join(d, "tokenizer.model"), "wb") as f:
                f.write(model.getvalue())
            tok = LlamaTokenizer.from_pretrained(d, legacy=False, add_bos_token=False)
            sp = spm.SentencePieceProcessor(model_file=os.path.join(d, "tokenizer.model"))
            expected["models"][name] = {
                "rule": rule, "remove_extra_whitespaces": rew,
                "hf_normalizer": str(tok.backend_tokenizer.normalizer),
                "hf_ids": [tok(t, add_special_tokens=False)["input_ids"] for t in TEXTS],
                "sentencepiece_ids": [sp.encode(t) for t in TEXTS],
            }
            for extra in os.listdir(d):  # keep only the model
                if extra != "tokenizer.model":
                    os.remove(os.path.join(d, extra))
    # tokenizer_config.json "legacy": true (transformers 5 reads it, not tokenizer.json's
    # pre_tokenizer): every text chunk after a special token gets the "▁" prefix too.
    legacy_dir = os.path.join(base, "legacy")
    tok = LlamaTokenizer.from_pretrained(os.path.join(base, "identity_keep"), legacy=True)
    tok.add_special_tokens({"additional_special_tokens": ["<image>"]})
    tok.save_pretrained(legacy_dir)
    shutil.copy(os.path.join(base, "identity_keep", "tokenizer.model"), legacy_dir)
    cfg_path = os.path.join(legacy_dir, "tokenizer_config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["legacy"] = True  # as transformers 4.x wrote it (save_pretrained in 5.x omits it)
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=1)
    reloaded = transformers.AutoTokenizer.from_pretrained(legacy_dir)
    expected["legacy"] = {
        "texts": LEGACY_TEXTS,
        "hf_ids": [reloaded(t, add_special_tokens=False)["input_ids"] for t in LEGACY_TEXTS]}
    for extra in os.listdir(legacy_dir):
        if extra not in ("tokenizer.model", "tokenizer_config.json", "tokenizer.json"):
            os.remove(os.path.join(legacy_dir, extra))
    with open(os.path.join(base, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1, ensure_ascii=False)
        f.write("\n")


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    images = write_images()
    tensors, meta = {}, {}
    for name, (cls, kwargs) in SETTINGS.items():
        ip = cls(**kwargs)
        d = os.path.join(OUT, name)
        ip.save_pretrained(d)
        if name == "llava_pad_v5":  # transformers 5's single processor_config.json
            os.remove(os.path.join(d, "preprocessor_config.json"))
            tok_dir = os.path.join(OUT, "normalizers", "identity_keep")
            if not os.path.isdir(tok_dir):
                write_normalizers()
            tok = LlamaTokenizer.from_pretrained(tok_dir, legacy=False)
            tok.add_special_tokens({"additional_special_tokens": ["<image>"]})
            proc = LlavaProcessor(image_processor=ip, tokenizer=tok, patch_size=8,
                                  vision_feature_select_strategy="default",
                                  num_additional_image_tokens=1)
            proc.save_pretrained(d)
            for extra in os.listdir(d):
                if extra != "processor_config.json":
                    os.remove(os.path.join(d, extra))
        for img_name, im in images.items():
            px = ip(images=[im], return_tensors="pt").pixel_values[0]
            assert tuple(px.shape) == (3, S, S), (name, img_name, px.shape)
            tensors[f"{name}/{img_name}"] = px.to(torch.float32).contiguous()
        meta[name] = {"class": cls.__name__,
                      "kwargs": {k: (int(v) if isinstance(v, R) else v) for k, v in kwargs.items()}}
    if not os.path.isdir(os.path.join(OUT, "normalizers")):
        write_normalizers()
    save_file(tensors, os.path.join(OUT, "expected.safetensors"))
    os.chmod(os.path.join(OUT, "expected.safetensors"), 0o644)
    with open(os.path.join(OUT, "case.json"), "w") as f:
        json.dump({"generator": "scripts/golden/make_processor_matrix.py",
                   "versions": {"transformers": transformers.__version__,
                                "pillow": PIL.__version__, "sentencepiece": spm.__version__},
                   "image_size": S, "images": sorted(images), "settings": meta}, f, indent=1)
        f.write("\n")
    total = sum(os.path.getsize(os.path.join(dp, fn)) for dp, _, fns in os.walk(OUT) for fn in fns)
    print(f"wrote {OUT} ({total} bytes, {len(tensors)} pixel_values)")


if __name__ == "__main__":
    main()
