"""Shared pieces of the Python reference loops for `mmpost dpo` (ref_dpo.py) and `mmpost rlhf`
GRPO (ref_grpo.py): read mmpost's resolved OUTPUT/recipe.json, load the same HF model folder with
transformers (LlavaForConditionalGeneration, sdpa attention, the recipe's dtype), tokenize with
mmpost's LLaVA template over the folder's sentencepiece model, preprocess images as the folder's
preprocessor_config.json says, and build the optimizer TRL / HF Trainer use by default
(`adamw_torch_fused` = torch.optim.AdamW(fused=True)) with the recipe's hyper-parameters, decay
groups and learning-rate schedule.

The tokenizer and image helpers of scripts/bench/ref_sft.py are reused (imported, not copied);
MmpostEncoder only adds what SFT on digits-vqa never needed: mmpost splits text at every
user-defined "<...>" piece of the sentencepiece model (<think>, <answer>, ...), not only at <image>.
"""
import json
import math
import os
import re
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ref_sft import Encoder, param_counts, pixel_values  # noqa: E402,F401  (re-exported)

# PIL resample codes (preprocessor_config.json "resample") -> ref_sft.pixel_values' names.
RESAMPLE_NAMES = {0: "nearest", 2: "bilinear", 3: "bicubic", 4: "area"}


def load_recipe(path):
    with open(path) as f:
        return json.load(f)


def resolve(root, p):
    """A recipe path as mmpost resolves it: relative to the directory mmpost ran in (the root)."""
    return p if os.path.isabs(p) else os.path.join(root, p)


def setup_torch(recipe):
    if recipe.get("num_threads", 0) > 0:
        torch.set_num_threads(recipe["num_threads"])
    torch.manual_seed(recipe["seed"])


def train_dtype(recipe):
    d = recipe.get("dtype", "float32")
    if recipe.get("mixed_precision", "no") == "bf16":
        return torch.float32  # master weights in float32, bf16 compute under autocast
    return torch.bfloat16 if d == "bfloat16" else torch.float32  # "auto" on CPU = float32


def autocast(recipe):
    """HF Trainer bf16=True (accelerate autocast) when the recipe asks for mixed_precision bf16."""
    return torch.autocast("cpu", dtype=torch.bfloat16,
                          enabled=recipe.get("mixed_precision", "no") == "bf16")


def load_model(recipe, root):
    """The HF model folder mmpost starts from (model.path), as transformers loads it."""
    from transformers import LlavaForConditionalGeneration
    path = recipe["model"].get("path", "")
    if not path:
        sys.exit("ref: model.path is empty; dpo and rlhf start from a model folder")
    folder = resolve(root, path)
    model = LlavaForConditionalGeneration.from_pretrained(folder, dtype=train_dtype(recipe),
                                                          attn_implementation="sdpa")
    for part in recipe["model"].get("freeze", []):
        mod = {"vision_tower": model.model.vision_tower, "projector": model.model.multi_modal_projector,
               "language_model": model.model.language_model}[part]
        for p in mod.parameters():
            p.requires_grad_(False)
    return model, folder


def n_image_tokens(config):
    vc = config.vision_config
    n = (vc.image_size // vc.patch_size) ** 2
    return n + 1 if config.vision_feature_select_strategy == "full" else n


class MmpostEncoder(Encoder):
    """ref_sft.Encoder (mmpost's Tokenizer::encode + encode_conversation, kLlava) with mmpost's
    special-token split: the text is cut at every atomic user-defined "<...>" piece (earliest
    match, longest on a tie), each piece becomes its id, and only the first chunk of a segment
    gets sentencepiece's dummy prefix (every chunk when the folder's tokenizer is "legacy")."""

    def __init__(self, path, image_token, n_image_tokens, legacy=False, add_bos=True):
        super().__init__(path, image_token, n_image_tokens)
        self.legacy, self.add_bos = legacy, add_bos
        sp = self.sp
        self.specials = {}
        for i in range(sp.get_piece_size()):
            if sp.is_control(i) or sp.is_unknown(i) or sp.is_byte(i):
                continue
            piece = sp.id_to_piece(i)
            if len(piece) > 2 and piece[0] == "<" and piece[-1] == ">":
                ids = sp.encode(piece)
                if ids and ids[-1] == i:
                    self.specials[piece] = i
        self.specials["<image>"] = image_token
        alts = sorted(self.specials, key=len, reverse=True)
        self.split_re = re.compile("|".join(re.escape(s) for s in alts))

    def text(self, text, prefix):
        ids, pos, first = [], 0, True
        for m in self.split_re.finditer(text):
            ids += self.plain(text[pos:m.start()], (first or self.legacy) and prefix)
            ids.append(self.specials[m.group(0)])
            pos, first = m.end(), False
        ids += self.plain(text[pos:], (first or self.legacy) and prefix)
        return ids

    def plain(self, text, prefix):
        """Tokenizer::encode_plain: the dummy prefix only when asked and the text does not start
        with a space; otherwise "<unk>" + text with the "<unk>" pieces dropped."""
        if not text:
            return []
        if prefix and text[0] != " ":
            return self.sp.encode(text)
        return self.sp.encode(self.sp.id_to_piece(self.sp.unk_id()) + text)[self.n_unk:]

    def conversation(self, messages):
        """encode_conversation, kLlava (chat_template.cpp segments()): (ids, labels)."""
        segs = []  # [text, supervised, is_eos]

        def masked(t):
            if segs and not segs[-1][1] and not segs[-1][2]:
                segs[-1][0] += t
            else:
                segs.append([t, False, False])

        for m in messages:
            content = m["content"]
            end = "" if re.fullmatch(r"(?:<image>\n?)+", content) else " "  # images alone: no " "
            if m["role"] == "system":
                masked(content + end)
            elif m["role"] == "user":
                masked("USER: " + content + end)
            else:
                masked("ASSISTANT:")
                segs.append([" " + content, True, False])
                segs.append(["", True, True])
        ids, labels = ([self.sp.bos_id()], [-100]) if self.add_bos else ([], [])
        first = True
        for text, sup, eos in segs:
            if eos:
                chunk = [self.sp.eos_id()]
            else:
                chunk, first = self.text(text, first), False
            self.extend(ids, labels, chunk, sup)
        return ids, labels

    def prompt(self, messages):
        """encode_conversation(messages, add_generation_prompt=True) for the LLaVA template: the
        masked prefix of the same conversation with an assistant turn appended ("... ASSISTANT:"
        is one masked chunk either way)."""
        ids, labels = self.conversation(list(messages) + [{"role": "assistant", "content": "x"}])
        k = next(i for i, l in enumerate(labels) if l != -100)
        return ids[:k]

    def decode(self, ids):
        """mmpost's Tokenizer::decode (= batch_decode(skip_special_tokens=True) here): BOS, EOS and
        PAD dropped, user-defined pieces written as their text."""
        out, run = [], []
        drop = {self.sp.bos_id(), self.sp.eos_id(), self.sp.pad_id()}
        by_id = {i: p for p, i in self.specials.items()}
        for t in ids:
            if t in drop:
                continue
            if t in by_id:
                out.append(self.sp.decode(run))
                run = []
                out.append(by_id[t])
            elif 0 <= t < self.sp.get_piece_size():
                run.append(t)
        out.append(self.sp.decode(run))
        return "".join(out)


def make_encoder(recipe, root, folder, model):
    tok = recipe["model"].get("tokenizer", "") or os.path.join(folder, "tokenizer.model")
    tok = resolve(root, tok)
    if not tok.endswith(".model") or not os.path.exists(tok):
        sys.exit(f"ref: {tok}: the reference handles sentencepiece tokenizer.model folders only")
    cfg = {}
    if os.path.exists(os.path.join(folder, "tokenizer_config.json")):
        cfg = json.load(open(os.path.join(folder, "tokenizer_config.json")))
    template = recipe["data"].get("chat_template", "auto")
    if template not in ("auto", "llava") or (template == "auto" and cfg.get("chat_template")
                                            and cfg.get("mmpost_chat_template", "llava") != "llava"):
        sys.exit("ref: only the LLaVA chat template is reproduced")
    return MmpostEncoder(tok, model.config.image_token_index, n_image_tokens(model.config),
                         legacy=bool(cfg.get("legacy", False)), add_bos=cfg.get("add_bos_token", True))


def image_settings(recipe, folder):
    """(image_size, img_cfg for ref_sft.pixel_values): the folder's preprocessor_config.json wins
    over the recipe's data.image, as in mmpost."""
    pre = os.path.join(folder, "preprocessor_config.json")
    img = dict(recipe["data"]["image"])
    if os.path.exists(pre):
        p = json.load(open(pre))
        img["image_mean"] = p.get("image_mean", img.get("image_mean"))
        img["image_std"] = p.get("image_std", img.get("image_std"))
        if "resample" in p:
            img["interpolation"] = RESAMPLE_NAMES.get(p["resample"], "bicubic")
    return img


def load_images(paths, base, size, img_cfg):
    if not paths:
        return None
    return torch.stack([pixel_values(os.path.join(base, p), size, img_cfg) for p in paths])


def pad_id_of(enc):
    return enc.sp.pad_id() if enc.sp.pad_id() >= 0 else enc.sp.eos_id()


def make_optimizer(model, recipe):
    """HF Trainer's default optimizer, adamw_torch_fused = torch.optim.AdamW(fused=True), with the
    recipe's lr/betas/eps/weight decay and mmpost's groups (decay on tensors with dim >= 2)."""
    o = recipe["optim"]
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": o.get("weight_decay", 0.0)},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=o["lr"], betas=tuple(o.get("betas", (0.9, 0.999))), eps=o.get("eps", 1e-8),
        fused=o.get("fused", True))
    return opt, params


def lr_at(recipe, step, total):
    """mmpost's train::lr_multiplier (warmup from 0, then cosine / linear / constant) x optim.lr."""
    s = recipe["scheduler"]
    warmup, name, floor = s.get("warmup_steps", 0), s.get("name", "cosine"), s.get("min_lr_ratio", 0.0)
    if step < warmup:
        m = step / max(1, warmup)
    else:
        prog = min(1.0, max(0.0, (step - warmup) / max(1, total - warmup)))
        m = {"cosine": floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * prog)),
             "linear": floor + (1 - floor) * (1 - prog), "constant": 1.0}[name]
    return recipe["optim"]["lr"] * m


def selective_log_softmax(logits, index):
    """trl.trainer.utils.selective_log_softmax, float32 path: gather the label logit, subtract a
    per-row logsumexp (rows looped to bound memory)."""
    selected = torch.gather(logits, dim=-1, index=index.unsqueeze(-1)).squeeze(-1)
    lse = torch.stack([torch.logsumexp(lg, dim=-1) for lg in logits])
    return selected - lse


def entropy_from_logits(logits):
    """trl.trainer.utils.entropy_from_logits (one row at a time)."""
    out = []
    for lg in logits:
        logp = torch.log_softmax(lg, dim=-1)
        out.append(-(logp.exp() * logp).sum(-1))
    return torch.stack(out)


def maxrss_kb():
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
