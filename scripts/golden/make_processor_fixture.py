"""Golden fixture for mmpost's preprocessing vs transformers' LlavaProcessor
(tests/golden/test_processor_golden.cpp).

Writes tests/golden/fixtures/processor/:
  chelsea.png, astronaut.png   two real photos (scikit-image samples), pre-shrunk with PIL to
                               149x97 (landscape) and 101x157 (portrait) so the 32-px shortest-edge
                               resize truncates (int(size * long / short)) and the crop is off-center
  tokenizer.model              a tiny sentencepiece BPE model trained here (Llama settings: byte
                               fallback, split digits, dummy prefix, identity normalization)
  tokenizer.json, tokenizer_config.json, processor_config.json   LlavaProcessor.save_pretrained
  preprocessor_config.json     CLIPImageProcessorPil.save_pretrained (the v4-era file the hub has)
  case.json                    the conversations, image files and HF settings used
  expected.safetensors         per case c in {a, b}: c.input_ids [1, T] int64, c.attention_mask
                               [1, T] int64, c.labels [1, T] int64 (-100 off the answers),
                               c.pixel_values [1, 3, 32, 32] float32, c.image_uint8 [3, 32, 32]
                               uint8 (the image after PIL resize + center crop, before rescale)

HF side: transformers' LlamaTokenizer (in 5.x the tokenizers-backed class; there is no separate
slow class) loaded from tokenizer.model with legacy=False (Metaspace prepend_scheme "first": "▁" is
prepended only at the very start of the text, never after a special token) and add_bos_token=True
(5.24 adds no BOS for a bare tokenizer.model otherwise; llava-hf's tokenizer.json does add it).
<image> is an added special token with id = sentencepiece vocab size (like llava-hf's 32000),
<pad> the next one. The image processor is CLIPImageProcessorPil (the PIL backend, what
LlavaProcessor loads when torchvision is absent; with torchvision, transformers 5 defaults to a
torchvision resize whose output differs slightly). patch_size 8, strategy "default" and
num_additional_image_tokens 1 make each <image> expand to (32/8)^2 = 16 tokens, as llava-hf does.
Labels: HF has no label mask for LLaVA-1.5 prompts, so this script derives it by tokenizing the
conversation's prefixes (up to each "ASSISTANT:", then through each answer's "</s>") and checking
each is a prefix of the full ids. The script also checks that a pure-sentencepiece encoding (the
first text chunk with the dummy prefix, chunks after a special token without) equals HF's ids.

Deterministic: rerunning rewrites identical bytes (given the same package versions).
Run: .venv/bin/python scripts/golden/make_processor_fixture.py
     (needs transformers 5.24, sentencepiece, pillow, scikit-image, safetensors)
"""
import io
import json
import os
import re
import shutil

import numpy as np
import PIL
import sentencepiece as spm
import torch
import transformers
from PIL import Image
from safetensors.torch import save_file
from skimage import data as skdata
from transformers import CLIPImageProcessorPil, LlamaTokenizer, LlavaProcessor

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "golden",
                   "fixtures", "processor")
VOCAB_SIZE = 400
IMAGE_SIZE, PATCH = 32, 8
N_IMAGE_TOKENS = (IMAGE_SIZE // PATCH) ** 2  # 16: +1 class token, -1 for "default"

CORPUS = [
    "USER: <image>",
    "USER: What is shown in this image?",
    "USER: What color is it?",
    "USER: How many digits are there in the picture?",
    "ASSISTANT: A woman in a space suit.",
    "ASSISTANT: White.",
    "ASSISTANT: A cat is sitting on the floor and looking at the camera.",
    "SYSTEM: You are a helpful assistant that looks at images and answers questions.",
    "The astronaut wears a white space suit and holds a helmet.",
    "A small image of a number written by hand.",
    "The quick brown fox jumps over the lazy dog.",
    "Let me look at the image carefully, then answer in one sentence.",
    "There are 2 cats and 13 dogs; the answer is 7.",
]

CASES = [
    dict(name="a", image="chelsea.png",
         messages=[{"role": "user", "content": "<image>\nWhat is shown in this image?"}],
         add_generation_prompt=True,
         text="USER: <image>\nWhat is shown in this image? ASSISTANT:"),
    dict(name="b", image="astronaut.png",
         messages=[{"role": "user", "content": "<image>\nWhat is shown in this image?"},
                   {"role": "assistant", "content": "A woman in a space suit."},
                   {"role": "user", "content": "What color is it?"},
                   {"role": "assistant", "content": "White."}],
         add_generation_prompt=False,
         text="USER: <image>\nWhat is shown in this image? ASSISTANT: A woman in a space suit.</s>"
              "USER: What color is it? ASSISTANT: White.</s>"),
]


def write_images():
    """Two real photos, pre-shrunk (the fixture stays small); returns {file: PIL.Image}."""
    astronaut = Image.fromarray(skdata.astronaut()[:, 96:416])  # 320x512 portrait crop
    chelsea = Image.fromarray(skdata.chelsea())                 # 451x300 landscape
    images = {"chelsea.png": chelsea.resize((149, 97), Image.Resampling.LANCZOS),
              "astronaut.png": astronaut.resize((101, 157), Image.Resampling.LANCZOS)}
    for name, im in images.items():
        im.save(os.path.join(OUT, name))
    # Reload from disk so the processor sees exactly what mmpost decodes.
    return {name: Image.open(os.path.join(OUT, name)).convert("RGB") for name in images}


def write_sentencepiece():
    model = io.BytesIO()  # sentence_iterator + model_writer: no temp paths inside the model
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS), model_writer=model, model_type="bpe",
        vocab_size=VOCAB_SIZE, character_coverage=1.0, byte_fallback=True, split_digits=True,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, add_dummy_prefix=True,
        remove_extra_whitespaces=False, normalization_rule_name="identity",
        input_sentence_size=0, shuffle_input_sentence=False, num_threads=1, minloglevel=2)
    with open(os.path.join(OUT, "tokenizer.model"), "wb") as f:
        f.write(model.getvalue())


def sentencepiece_ids(text, specials):
    """mmpost's algorithm in Python: split out specials; first chunk with the dummy prefix
    (unless it starts with a space), later chunks without (encode "<unk>" + chunk, drop the
    "<unk>" pieces, as transformers' legacy=False slow tokenizer did)."""
    sp = spm.SentencePieceProcessor(model_file=os.path.join(OUT, "tokenizer.model"))
    n_unk = len(sp.encode("<unk>"))
    ids, first = [sp.bos_id()], True
    for part in re.split("(" + "|".join(map(re.escape, specials)) + ")", text):
        if part in specials:
            ids.append(specials[part])
        elif part:
            ids += sp.encode(part) if first and not part.startswith(" ") else \
                sp.encode("<unk>" + part)[n_unk:]
        first = False
    return ids


def label_mask(processor, image, case, ids):
    """labels = ids on each answer and its </s>, -100 elsewhere, from prefix tokenizations."""
    labels = torch.full_like(ids, -100)
    if case["add_generation_prompt"]:
        return labels
    text = case["text"]
    prefix_len = lambda t: processor(images=[image], text=[t], return_tensors="pt").input_ids
    pos = 0
    while True:
        start = text.find("ASSISTANT:", pos)
        if start < 0:
            break
        start += len("ASSISTANT:")
        end = text.index("</s>", start) + len("</s>")
        a, b = prefix_len(text[:start]), prefix_len(text[:end])
        for p in (a, b):
            assert torch.equal(ids[:, : p.shape[1]], p), "prefix tokenization is not a prefix"
        labels[:, a.shape[1]: b.shape[1]] = ids[:, a.shape[1]: b.shape[1]]
        pos = end
    return labels


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    images = write_images()
    write_sentencepiece()

    # The folder holds only tokenizer.model here, so this converts it (sentencepiece -> tokenizers).
    tok = LlamaTokenizer.from_pretrained(OUT, legacy=False, add_bos_token=True, add_eos_token=False)
    tok.add_special_tokens({"additional_special_tokens": ["<image>"]})
    tok.add_special_tokens({"pad_token": "<pad>"})
    image_token_id = tok.convert_tokens_to_ids("<image>")
    assert image_token_id == VOCAB_SIZE and tok.pad_token_id == VOCAB_SIZE + 1
    ip = CLIPImageProcessorPil(size={"shortest_edge": IMAGE_SIZE},
                               crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
                               resample=Image.Resampling.BICUBIC)
    processor = LlavaProcessor(image_processor=ip, tokenizer=tok, patch_size=PATCH,
                               vision_feature_select_strategy="default",
                               num_additional_image_tokens=1)
    processor.save_pretrained(OUT)
    ip.save_pretrained(OUT)

    tensors = {}
    specials = {"<image>": image_token_id, "</s>": tok.eos_token_id}
    for case in CASES:
        image = images[case["image"]]
        enc = processor(images=[image], text=[case["text"]], return_tensors="pt")
        ids = enc.input_ids
        assert (ids == image_token_id).sum().item() == N_IMAGE_TOKENS
        assert ids[0, 0].item() == tok.bos_token_id
        spm_ids = sentencepiece_ids(case["text"], specials)
        spm_ids = [i for j in spm_ids for i in ([j] * N_IMAGE_TOKENS if j == image_token_id else [j])]
        case["sentencepiece_matches_hf"] = spm_ids == ids[0].tolist()
        assert case["sentencepiece_matches_hf"], (tok.convert_ids_to_tokens(spm_ids),
                                                  tok.convert_ids_to_tokens(ids[0]))
        # The uint8 image the PIL backend normalizes: resize + center crop, channels first.
        chw = np.moveaxis(np.array(image), -1, 0)
        resized = ip.center_crop(ip.resize(chw, size=ip.size, resample=ip.resample), ip.crop_size)
        n = case["name"]
        tensors[f"{n}.input_ids"] = ids.to(torch.int64)
        tensors[f"{n}.attention_mask"] = enc.attention_mask.to(torch.int64)
        tensors[f"{n}.labels"] = label_mask(processor, image, case, ids)
        tensors[f"{n}.pixel_values"] = enc.pixel_values.to(torch.float32).contiguous()
        tensors[f"{n}.image_uint8"] = torch.from_numpy(np.ascontiguousarray(resized))
        case["tokens"] = tok.convert_ids_to_tokens(ids[0])
        print(n, ids.shape[1], "tokens,", int((tensors[f"{n}.labels"] != -100).sum()), "supervised")
    save_file(tensors, os.path.join(OUT, "expected.safetensors"))
    os.chmod(os.path.join(OUT, "expected.safetensors"), 0o644)  # save_file writes 0600

    meta = {
        "generator": "scripts/golden/make_processor_fixture.py",
        "versions": {"transformers": transformers.__version__, "pillow": PIL.__version__,
                     "sentencepiece": spm.__version__, "torch": torch.__version__},
        "tokenizer": {"class": type(tok).__name__, "backend": "tokenizers", "legacy": False,
                      "add_bos_token": True, "image_token": "<image>",
                      "image_token_id": image_token_id, "pad_token_id": tok.pad_token_id},
        "image_processor": {"class": type(ip).__name__, "resample": "bicubic (3)",
                            "shortest_edge": IMAGE_SIZE, "crop_size": IMAGE_SIZE},
        "n_image_tokens": N_IMAGE_TOKENS,
        "cases": CASES,
    }
    with open(os.path.join(OUT, "case.json"), "w") as f:
        json.dump(meta, f, indent=2, ensure_ascii=False)
        f.write("\n")
    total = sum(os.path.getsize(os.path.join(OUT, p)) for p in os.listdir(OUT))
    print(f"wrote {OUT} ({total} bytes)")


if __name__ == "__main__":
    main()
