"""Reference for `mmpost bench-preprocess`: HF LlavaProcessor (CLIPImageProcessor + LlamaTokenizer
from the same sentencepiece model, <image> = the model's image token) over the same JSONL.

Per record: json.loads, PIL open + convert("RGB"), the LLaVA-1.5 prompt rendered as text
("USER: <image>\\n{q} ASSISTANT: {a}</s>"), processor(images=..., text=...) -> input_ids with the
image token expanded + pixel_values. One untimed warm-up pass, then --epochs timed passes.
--num-workers 1: in-process loop; K > 1: torch DataLoader(num_workers=K, persistent_workers),
each worker with torch.set_num_threads(--num-threads). Prints one JSON line like mmpost's.
"""
import argparse
import json
import os
import shutil
import tempfile
import time

import torch
from PIL import Image
from transformers import LlamaTokenizer, LlavaProcessor
try:  # the PIL backend is what CLIPImageProcessor falls back to without torchvision
    from transformers import CLIPImageProcessorPil as CLIPImageProcessor
except ImportError:
    from transformers import CLIPImageProcessor
from transformers.utils import logging as hf_logging


def build_processor(a):
    tok_dir = tempfile.mkdtemp(prefix="bench_tok_")
    shutil.copy(a.tokenizer, os.path.join(tok_dir, "tokenizer.model"))
    tok = LlamaTokenizer.from_pretrained(tok_dir, legacy=False)
    if "<image>" not in tok.get_vocab():
        tok.add_special_tokens({"additional_special_tokens": ["<image>"]})
    resample = {"bicubic": 3, "bilinear": 2, "nearest": 0, "area": 4}[a.interpolation]  # 4 = PIL BOX
    ip = CLIPImageProcessor(size={"shortest_edge": a.image_size},
                            crop_size={"height": a.image_size, "width": a.image_size},
                            resample=resample, image_mean=a.image_mean, image_std=a.image_std)
    return LlavaProcessor(image_processor=ip, tokenizer=tok, patch_size=a.patch_size,
                          vision_feature_select_strategy="default", image_token="<image>",
                          num_additional_image_tokens=1)


def render(messages):
    text = ""
    for m in messages:
        if m["role"] == "system":
            text += m["content"] + " "
        elif m["role"] == "user":
            text += "USER: " + m["content"] + " "
        else:
            text += "ASSISTANT: " + m["content"] + "</s>"
    return text


class Records(torch.utils.data.Dataset):
    def __init__(self, path, processor, threads):
        self.lines = [l for l in open(path) if l.strip()]
        self.base = os.path.dirname(path)
        self.processor, self.threads = processor, threads

    def __len__(self):
        return len(self.lines)

    def __getitem__(self, i):
        rec = json.loads(self.lines[i])
        imgs = [Image.open(os.path.join(self.base, p)).convert("RGB") for p in rec["images"]]
        out = self.processor(images=imgs or None, text="<s>" + render(rec["messages"]),
                             return_tensors="pt", add_special_tokens=False)
        return out["input_ids"].shape[1], out["pixel_values"].shape[0] if imgs else 0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--tokenizer", default="data/tokenizer/tokenizer.model")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--patch-size", type=int, default=14)
    p.add_argument("--interpolation", default="bicubic")
    p.add_argument("--image-mean", type=float, nargs=3, default=[0.48145466, 0.4578275, 0.40821073])
    p.add_argument("--image-std", type=float, nargs=3, default=[0.26862954, 0.26130258, 0.27577711])
    p.add_argument("--num-workers", type=int, default=1)
    p.add_argument("--num-threads", type=int, default=1)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=8)
    a = p.parse_args()
    hf_logging.set_verbosity_error()
    torch.set_num_threads(a.num_threads)
    ds = Records(a.data, build_processor(a), a.num_threads)
    if a.num_workers <= 1:
        def one_pass():
            return [ds[i] for i in range(len(ds))]
    else:
        dl = torch.utils.data.DataLoader(
            ds, batch_size=a.batch_size, num_workers=a.num_workers, persistent_workers=True,
            collate_fn=list, worker_init_fn=lambda _: torch.set_num_threads(a.num_threads))

        def one_pass():
            return [s for b in dl for s in b]
    one_pass()  # warm-up (also starts the persistent workers)
    t0 = time.perf_counter()
    n = n_images = n_tokens = 0
    for _ in range(a.epochs):
        res = one_pass()
        n += len(res)
        n_images += sum(r[1] for r in res)
        n_tokens += sum(r[0] for r in res)
    dt = time.perf_counter() - t0
    print(json.dumps({"images_per_s": n_images / dt, "samples_per_s": n / dt, "n": n,
                      "n_images": n_images, "n_tokens": n_tokens, "seconds": dt, "num_workers": a.num_workers,
                      "num_threads": a.num_threads, "image_processor": type(ds.processor.image_processor).__name__}))


if __name__ == "__main__":
    main()
