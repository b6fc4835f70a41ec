"""Reference for `mmpost rlhf` (algorithm grpo) throughput: the step TRL's GRPOTrainer runs
without vLLM, written out as a plain PyTorch loop over transformers'
LlavaForConditionalGeneration, built from the resolved recipe mmpost wrote (OUTPUT/recipe.json).

One step (train.batch_size prompts x rlhf.num_generations completions, as mmpost counts it; in
TRL terms per_device_train_batch_size = batch_size * G rows, steps_per_generation = 1):
  - prompts: the same ones in the same order as mmpost (its counter-based curriculum permutation,
    modes none and staged-by-step, ported below), tokenized with mmpost's LLaVA template,
    left-padded, each repeated G times with its own copy of the images (TRL's RepeatSampler +
    processor: the vision tower runs once per row, mmpost once per prompt);
  - generation: GRPOTrainer._generate_single_turn, regular-generation branch:
    model.generate(do_sample=True, temperature, top_p, top_k, max_new_tokens =
    max_completion_length, pad/bos/eos ids, disable_compile=True) with the KV cache, then
    everything after the first EOS masked; plus suppress_tokens=[image token] (mmpost masks the
    placeholder's logit; transformers would otherwise crash on a sampled one);
  - rewards: mmpost's rule-based verifiers re-implemented (exact_match, numeric_match, format,
    length_penalty; lib/mmpost/algo/rewards.cpp) on the decoded completions, weighted sum
    (GRPOTrainer._calculate_rewards + reward_weights, multi_objective_aggregation
    "sum_then_normalize");
  - advantages: _generate_and_score_completions: (r - group mean) / (group std + 1e-4) for
    scale_rewards group (batch: batch std; none: no division); all-equal groups 0 as mmpost;
  - reference log-probs (beta > 0 only): the frozen start model, no grad
    (_get_per_token_logps_and_entropies on ref_model), KL k3 in the loss as TRL;
  - loss: GRPOTrainer._compute_loss: one forward with logits_to_keep = completion length + 1,
    logits / temperature, selective_log_softmax, entropies (no grad), old log-probs =
    per_token_logps.detach() (num_iterations 1), the clipped surrogate with epsilon /
    epsilon_high and the loss_type's aggregation (grpo, bnpo, dr_grpo, dapo, cispo, luspo, sapo);
  - optimizer: adamw_torch_fused (torch.optim.AdamW(fused=True)), clip train.clip_grad_norm,
    the recipe's lr schedule; fp32, sdpa attention, torch.set_num_threads(num_threads).
Timing per step: rollout (prompt prep, generation, decode, rewards, advantages, reference pass)
and update (forward, loss, backward, clip, AdamW) separately, and the whole step; windows of
train.log_every_n_steps steps as mmpost's metrics.jsonl (its step_time_s, rollout_tokens_per_s,
update_tokens_per_s); one JSON line on stdout.
At rlhf.temperature 0 it decodes greedily and scores untempered logits (mmpost's convention; TRL
needs a temperature > 0): then both sides sample the same completions, which checks prompts,
images, decoding and rewards end to end.
"""
import argparse
import copy
import json
import math
import os
import re
import sys
import time

import torch
from transformers import GenerationConfig
from transformers.utils import logging as hf_logging

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ref_common as rc  # noqa: E402

# ---- mmpost's curriculum order (lib/mmpost/data/curriculum.cpp: splitmix64, counter based) ----
M64 = (1 << 64) - 1


def mix(x):
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def hsh(seed, a, b, c=0):
    return mix(seed ^ mix(a ^ mix(b ^ mix(c))))


def permute(items, seed, stream, epoch):
    out, state = list(items), hsh(seed, stream, epoch)
    for i in range(len(out), 1, -1):
        state = mix(state)
        j = (state * i) >> 64
        out[i - 1], out[j] = out[j], out[i - 1]
    return out


class Curriculum:
    """Curriculum::next_batch for mode none and staged with until_step stages."""

    def __init__(self, cfg, difficulties, seed):
        self.mode = cfg.get("mode", "none")
        self.stages = cfg.get("stages", [])
        if self.mode not in ("none", "staged") or any(s.get("min_pass_rate", -1) >= 0 for s in self.stages):
            sys.exit("ref_grpo: only curriculum modes none and staged (until_step) are reproduced")
        self.seed = seed & M64
        self.by_d = {}
        for i, d in enumerate(difficulties):
            self.by_d.setdefault(d, []).append(i)
        self.stage, self.step = 0, 0
        self.reset()

    def reset(self):
        items = []
        for d in sorted(self.by_d):
            if self.mode != "staged" or d in self.stages[self.stage]["difficulties"]:
                items += self.by_d[d]
        self.items = sorted(items)
        self.epoch, self.cursor = 0, 0
        self.order = permute(self.items, self.seed, 1 + self.stage, 0)

    def next_batch(self, n):
        if self.mode == "staged":
            while (self.stage + 1 < len(self.stages) and self.stages[self.stage].get("until_step", 0) > 0
                   and self.step >= self.stages[self.stage]["until_step"]):
                self.stage += 1
                self.reset()
        out = []
        for _ in range(n):
            if self.cursor >= len(self.order):
                self.epoch, self.cursor = self.epoch + 1, 0
                self.order = permute(self.items, self.seed, 1 + self.stage, self.epoch)
            out.append(self.order[self.cursor])
            self.cursor += 1
        self.step += 1
        return out


# ---- mmpost's rule-based rewards (lib/mmpost/algo/rewards.cpp) ---------------------------------
DIGIT_ZEROS = [0x0660, 0x06F0, 0x07C0, 0x0966, 0x09E6, 0x0A66, 0x0AE6, 0x0B66, 0x0BE6, 0x0C66, 0x0CE6,
               0x0D66, 0x0DE6, 0x0E50, 0x0ED0, 0x0F20, 0x1040, 0x1090, 0x17E0, 0x1810, 0x1946, 0x19D0,
               0x1A80, 0x1A90, 0x1B50, 0x1BB0, 0x1C40, 0x1C50, 0xA620, 0xA8D0, 0xA900, 0xA9D0, 0xA9F0,
               0xAA50, 0xABF0, 0xFF10, 0x104A0, 0x1D7CE, 0x1D7D8, 0x1D7E2, 0x1D7EC, 0x1D7F6]
PUNCT = {0x2212: "-", 0xFF0D: "-", 0xFF0E: ".", 0xFF0C: ",", 0x066B: ".", 0x066C: ","}
WS = re.compile(r"[ \t\n\v\f\r]+")


def ascii_for(ch):
    cp = ord(ch)
    for z in DIGIT_ZEROS:
        if z <= cp < z + 10:
            return chr(ord("0") + cp - z)
    return PUNCT.get(cp)


def normalize_digits(text):
    return "".join((ascii_for(c) or c) if ord(c) > 0x7F else c for c in text)


def normalize_whitespace(text):
    return " ".join(p for p in WS.split(text) if p)


def extract_answer(text):
    last, frm = None, 0
    while True:
        b = text.find("<answer>", frm)
        if b < 0:
            break
        e = text.find("</answer>", b + 8)
        if e < 0:
            break
        last, frm = text[b + 8:e], e + 9
    return last


def isdig(c):
    return "0" <= c <= "9"


def isalnum_ascii(c):
    return c.isascii() and c.isalnum()


def scan_number(s, i):
    j, n = i, len(s)
    while j < n and isdig(s[j]):
        j += 1
    if j > i and j - i <= 3:
        while (j + 3 < n and s[j] == "," and isdig(s[j + 1]) and isdig(s[j + 2]) and isdig(s[j + 3])
               and (j + 4 >= n or not isdig(s[j + 4]))):
            j += 4
    if j + 1 < n and s[j] == "." and isdig(s[j + 1]):
        j += 1
        while j < n and isdig(s[j]):
            j += 1
    if j < n and s[j] in "eE":
        k = j + 1
        if k < n and s[k] in "+-":
            k += 1
        if k < n and isdig(s[k]):
            while k < n and isdig(s[k]):
                k += 1
            j = k
    return j - i


def parse_last_number(text):
    s, last, i = normalize_digits(text), None, 0
    while i < len(s):
        if not (isdig(s[i]) or (s[i] == "." and i + 1 < len(s) and isdig(s[i + 1]))):
            i += 1
            continue
        ln, b = scan_number(s, i), i
        if i > 0 and s[i - 1] in "-+" and (i == 1 or not (isalnum_ascii(s[i - 2]) or s[i - 2] in ").")):
            b = i - 1
        try:
            v = float(s[b:i + ln].replace(",", ""))
            if math.isfinite(v):
                last = v
        except ValueError:
            pass
        i += ln
    return last


def matches_default_format(s):
    if not s.startswith("<think>") or not s.endswith("</answer>"):
        return False
    last = len(s) - len("</answer>")
    p = s.find("</think>", len("<think>"))
    while p >= 0:
        q = p + len("</think>")
        while q < len(s) and s[q] in " \t\n\v\f\r":
            q += 1
        if s.startswith("<answer>", q) and q + len("<answer>") <= last:
            return True
        p = s.find("</think>", p + 1)
    return False


DEFAULT_FORMAT = r"^<think>[\s\S]*?</think>\s*<answer>[\s\S]*?</answer>$"


def reward_fn(spec):
    name, p = spec["name"], spec.get("params", {})
    if name == "exact_match":
        return lambda c, ref, n: float(normalize_whitespace(extract_answer(c) if extract_answer(c) is not None else c)
                                       == normalize_whitespace(ref))
    if name == "numeric_match":
        abs_tol, rel_tol = p.get("abs_tol", 1e-6), p.get("rel_tol", 0.0)

        def numeric(c, ref, n):
            r = parse_last_number(ref)
            ans = extract_answer(c)
            pred = parse_last_number(ans if ans is not None else c)
            return 0.0 if pred is None else float(abs(pred - r) <= max(abs_tol, rel_tol * abs(r)))
        return numeric
    if name == "format":
        pat = p.get("pattern", DEFAULT_FORMAT)
        if pat == DEFAULT_FORMAT:
            return lambda c, ref, n: float(matches_default_format(c))
        rx = re.compile(pat)
        return lambda c, ref, n: float(len(c) <= 8192 and rx.fullmatch(c) is not None)
    if name == "length_penalty":
        max_len, cache_len = p["max_len"], p["cache_len"]

        def overlong(c, ref, n):
            soft = max_len - cache_len
            return 0.0 if n <= soft else (soft - n) / cache_len if n <= max_len else -1.0
        return overlong
    sys.exit(f"ref_grpo: reward {name!r} is not reproduced")


# ---- GRPO math (TRL GRPOTrainer; mmpost algo/policy_gradient.cpp) ------------------------------
def nanstd(x, dim=None):
    mean = torch.nanmean(x) if dim is None else torch.nanmean(x, dim=dim, keepdim=True)
    var = torch.nanmean((x - mean) ** 2) if dim is None else torch.nanmean((x - mean) ** 2, dim=dim, keepdim=True)
    count = (~torch.isnan(x)).sum() if dim is None else (~torch.isnan(x)).sum(dim=dim, keepdim=True)
    std = torch.sqrt(var * (count.float() / (count.float() - 1)))
    return std if dim is None else std.squeeze(dim)


def grpo_advantages(rewards, G, scale):
    grouped = rewards.view(-1, G)
    mean = torch.nanmean(grouped, dim=1, keepdim=True)
    if scale == "batch":
        std = nanstd(rewards).expand_as(rewards)
    else:
        std = nanstd(grouped, dim=1).repeat_interleave(G)
    adv = (grouped - mean).view(-1)
    if scale != "none":
        adv = adv / (std + 1e-4)
    equal = (grouped.amax(1) <= grouped.amin(1)).repeat_interleave(G)
    return torch.nan_to_num(torch.where(equal, torch.zeros_like(adv), adv), nan=0.0)


def per_token_logps(model, ids, mask, pix, Tc, temperature, dtype):
    """GRPOTrainer._get_per_token_logps_and_entropies (one chunk): logits of the last Tc + 1
    positions, drop the last, / temperature, selective_log_softmax; entropies without grad."""
    kw = {"pixel_values": pix.to(dtype)} if pix is not None else {}
    logits = model(input_ids=ids, attention_mask=mask, logits_to_keep=Tc + 1, use_cache=False, **kw).logits
    logits = logits[:, :-1, :][:, -Tc:, :].float()
    if temperature > 0:
        logits = logits / temperature
    logps = rc.selective_log_softmax(logits, ids[:, -Tc:])
    with torch.no_grad():
        ent = rc.entropy_from_logits(logits.detach())
    return logps, ent


def policy_loss(logps, old, adv, mask, rl, ref_logps, beta, n_items, n_micro):
    """GRPOTrainer._compute_loss: clipped surrogate + beta * k3 KL, aggregated by loss_type."""
    eps_low = rl.get("epsilon", 0.2)
    eps_high = rl.get("epsilon_high") if rl.get("epsilon_high") is not None else eps_low
    lt = rl.get("loss_type", "dapo")
    log_ratio = logps - old
    if rl.get("importance_sampling_level", "token") == "sequence":
        log_ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    coef_1 = torch.exp(log_ratio)
    a = adv.unsqueeze(1)
    if lt == "cispo":
        ptl = -torch.clamp(coef_1, max=eps_high).detach() * a * logps
    elif lt == "sapo":
        t = torch.where(a > 0, rl.get("sapo_temperature_pos", 1.0), rl.get("sapo_temperature_neg", 1.05))
        ptl = -(torch.sigmoid(t * (coef_1 - 1)) * 4 / t) * a
    else:
        coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
        ptl = -torch.min(coef_1 * a, coef_2 * a)
    if beta != 0.0:
        ptl = ptl + beta * (torch.exp(ref_logps - logps) - (ref_logps - logps) - 1)
    if lt in ("grpo", "sapo"):
        loss = ((ptl * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean() / n_micro
    elif lt == "bnpo":
        loss = (ptl * mask).sum() / mask.sum().clamp(min=1.0) / n_micro
    elif lt == "dr_grpo":
        loss = (ptl * mask).sum() / (ptl.size(0) * rl["max_completion_length"]) / n_micro
    elif lt in ("dapo", "cispo"):
        loss = (ptl * mask).sum() / max(n_items, 1.0)
    elif lt == "luspo":
        loss = (ptl * mask.sum(1, keepdim=True)).mean() / n_micro
    else:
        sys.exit(f"ref_grpo: loss_type {lt!r} unknown")
    return loss


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipe", required=True, help="mmpost's resolved OUTPUT/recipe.json")
    ap.add_argument("--root", default=".", help="directory mmpost ran in (recipe paths are relative to it)")
    ap.add_argument("--steps", type=int, default=0, help="override train.max_steps")
    ap.add_argument("--dump", help="write every completion (step, prompt index, text, reward) to this JSONL")
    a = ap.parse_args()
    hf_logging.set_verbosity_error()
    recipe = rc.load_recipe(a.recipe)
    tr, rl = recipe["train"], recipe["rlhf"]
    if rl.get("algorithm", "grpo") != "grpo":
        sys.exit("ref_grpo: only rlhf.algorithm grpo is reproduced")
    if rl.get("stop") or rl.get("reward_model") or rl.get("filter_zero_std_groups") or rl.get("kl_in_reward") \
            or rl.get("num_iterations", 1) != 1 or (rl.get("beta", 0) > 0 and rl.get("kl_estimator", "k3") != "k3"):
        sys.exit("ref_grpo: stop strings, reward models, filter_zero_std_groups, kl_in_reward, "
                 "num_iterations > 1 and KL estimators other than k3 are not reproduced")
    rc.setup_torch(recipe)
    rss_before_model = rc.maxrss_kb()
    G, B, n_micro = rl["num_generations"], tr["batch_size"], tr.get("gradient_accumulation_steps", 1)
    temperature, beta = rl.get("temperature", 1.0), rl.get("beta", 0.0)

    model, folder = rc.load_model(recipe, a.root)
    model.train()
    dtype = rc.train_dtype(recipe)
    ref = None
    if beta > 0:  # beta = 0 loads no reference model (TRL, mmpost)
        ref = copy.deepcopy(model).eval()
        for p in ref.parameters():
            p.requires_grad_(False)
    enc = rc.make_encoder(recipe, a.root, folder, model)
    img_cfg = rc.image_settings(recipe, folder)
    size = model.config.vision_config.image_size
    pad_id, eos_id = rc.pad_id_of(enc), enc.sp.eos_id()
    specs = rl.get("rewards", [{"name": "exact_match"}])
    fns = [(s.get("name"), s.get("weight", 1.0), reward_fn(s)) for s in specs]
    names, seen = [], {}
    for n, _, _ in fns:  # score_all's names: a repeated reward gets _2, _3, ...
        seen[n] = seen.get(n, 0) + 1
        names.append(n if seen[n] == 1 else f"{n}_{seen[n]}")

    # Prompt pool (data::load_prompts): prompt = messages without the final assistant turn.
    path = rc.resolve(a.root, recipe["data"]["train"])
    base = os.path.dirname(path)
    pool = []
    for line in open(path):
        if not line.strip():
            continue
        r = json.loads(line)
        msgs = list(r["messages"])
        last = msgs.pop() if msgs and msgs[-1]["role"] == "assistant" else {"content": ""}
        if "answer" in r:
            refr = r["answer"] if isinstance(r["answer"], str) else json.dumps(r["answer"])
        else:
            refr = extract_answer(last["content"])
            refr = last["content"] if refr is None else refr
        ids = enc.prompt(msgs)
        assert len(ids) <= recipe["data"]["max_length"], "prompt exceeds data.max_length"
        pool.append({"ids": ids, "images": r.get("images", []), "ref": refr, "d": r.get("difficulty", 0)})
    cur = Curriculum(rl.get("curriculum", {}), [p["d"] for p in pool], recipe["seed"])
    steps = a.steps or tr["max_steps"] or math.ceil(tr.get("epochs", 1.0) * len(pool) / B)

    gen_cfg = GenerationConfig(
        max_new_tokens=rl["max_completion_length"], do_sample=temperature > 0,
        temperature=temperature if temperature > 0 else None,
        top_p=rl.get("top_p", 1.0) if temperature > 0 else None,
        top_k=rl.get("top_k", 0) if temperature > 0 else None, pad_token_id=pad_id, bos_token_id=enc.sp.bos_id(), eos_token_id=eos_id,
        suppress_tokens=[model.config.image_token_index], disable_compile=True)
    optimizer, params = rc.make_optimizer(model, recipe)
    dump = open(a.dump, "w") if a.dump else None

    windows, first_steps = [], []
    acc = {}
    t_last = time.perf_counter()
    for step in range(1, steps + 1):
        t0 = time.perf_counter()
        # -- rollout --
        picked = cur.next_batch(B)
        prompts = [pool[i] for i in picked]
        Tp = max(len(p["ids"]) for p in prompts)
        rows = [p for p in prompts for _ in range(G)]  # RepeatSampler: each prompt G times in a row
        ids = torch.full((len(rows), Tp), pad_id, dtype=torch.long)
        pmask = torch.zeros((len(rows), Tp), dtype=torch.long)
        for i, p in enumerate(rows):  # left padding
            ids[i, Tp - len(p["ids"]):] = torch.tensor(p["ids"])
            pmask[i, Tp - len(p["ids"]):] = 1
        per_prompt = [rc.load_images(p["images"], base, size, img_cfg) for p in prompts]
        pix = [x for x in per_prompt for _ in range(G) if x is not None]
        pix = torch.cat(pix).to(dtype) if pix else None
        model.eval()
        with torch.no_grad(), rc.autocast(recipe):
            kw = {"pixel_values": pix} if pix is not None else {}
            out = model.generate(input_ids=ids, attention_mask=pmask, generation_config=gen_cfg, **kw)
        model.train()
        t_gen = time.perf_counter() - t0
        comp = out[:, Tp:]
        is_eos = comp == eos_id
        eos_idx = torch.full((comp.size(0),), comp.size(1), dtype=torch.long)
        eos_idx[is_eos.any(1)] = is_eos.int().argmax(1)[is_eos.any(1)]
        cmask = (torch.arange(comp.size(1)).expand(comp.size(0), -1) <= eos_idx.unsqueeze(1)).long()
        lens = cmask.sum(1)
        truncated = ~is_eos.any(1)
        texts = [enc.decode(comp[i, :lens[i]].tolist()) for i in range(comp.size(0))]
        per_fn = torch.tensor([[fn(t, rows[i]["ref"], int(lens[i])) for (_, _, fn) in fns] for i, t in enumerate(texts)],
                              dtype=torch.float32)
        weights = torch.tensor([w for _, w, _ in fns], dtype=torch.float32)
        rewards = (per_fn * weights).sum(1)
        adv = grpo_advantages(rewards, G, rl.get("scale_rewards", "group"))
        if rl.get("mask_truncated_completions"):
            cmask = cmask * (~truncated).unsqueeze(1).long()
        full_ids = torch.cat([ids, comp], 1)
        full_mask = torch.cat([pmask, cmask], 1)
        Tc = comp.size(1)
        ref_logps = None
        if ref is not None:
            with torch.no_grad(), rc.autocast(recipe):
                ref_logps = per_token_logps(ref, full_ids, full_mask, pix, Tc, temperature, dtype)[0]
        if dump:
            for i, t in enumerate(texts):
                dump.write(json.dumps({"step": step, "prompt": picked[i // G], "completion": t,
                                       "n_tokens": int(lens[i]), "reward": float(rewards[i])}) + "\n")
        t1 = time.perf_counter()
        # -- update --
        optimizer.zero_grad(set_to_none=True)
        for g in optimizer.param_groups:
            g["lr"] = rc.lr_at(recipe, step - 1, steps)
        n_items = float(cmask.sum())
        img_off = [0]
        for p in rows:
            img_off.append(img_off[-1] + len(p["images"]))
        loss_sum, ent_sum, upd_tokens = 0.0, 0.0, 0.0
        for k in range(n_micro):
            p0, p1 = len(prompts) * k // n_micro, len(prompts) * (k + 1) // n_micro
            if p1 == p0:
                continue
            r0, r1 = p0 * G, p1 * G
            mpix = None if pix is None else pix[img_off[r0]:img_off[r1]]
            with rc.autocast(recipe):
                logps, ent = per_token_logps(model, full_ids[r0:r1], full_mask[r0:r1], mpix, Tc, temperature, dtype)
            m = cmask[r0:r1].float()
            loss = policy_loss(logps, logps.detach(), adv[r0:r1], m, rl,
                               None if ref_logps is None else ref_logps[r0:r1], beta, n_items, n_micro)
            loss.backward()
            loss_sum += loss.item()
            ent_sum += float((ent * m).sum())
            upd_tokens += float(m.sum())
        grad_norm = torch.nn.utils.clip_grad_norm_(params, tr.get("clip_grad_norm", 1.0))
        optimizer.step()
        t2 = time.perf_counter()
        sm = {"loss": loss_sum, "grad_norm": float(grad_norm), "reward": float(rewards.mean()),
              "completions/mean_length": float(lens.float().mean()),
              "completions/max_length": float(lens.max()),
              "completions/clipped_ratio": float(truncated.float().mean()),
              "entropy": ent_sum / max(upd_tokens, 1.0),
              "frac_reward_zero_std": float((rewards.view(-1, G).amax(1) <= rewards.view(-1, G).amin(1)).float().mean()),
              "rollout_s": t1 - t0, "generate_s": t_gen, "update_s": t2 - t1, "step_s": t2 - t0,
              "completion_tokens": float(lens.sum()),
              "rollout_tokens_per_s": float(lens.sum()) / (t1 - t0),
              "update_tokens_per_s": upd_tokens / (t2 - t1)}
        for j, n in enumerate(names):
            sm[f"rewards/{n}/mean"] = float(per_fn[:, j].mean())
        if step <= 3:
            first_steps.append({"step": step, **sm})
        for key, v in sm.items():
            acc.setdefault(key, []).append(v)
        if step % tr["log_every_n_steps"] == 0 or step == steps:
            now = time.perf_counter()
            n = len(acc["loss"])
            w = {"step": step, "step_time_s": (now - t_last) / n,
                 "prompts_per_s": B * n / (now - t_last),
                 "completion_tokens_per_s": sum(acc["completion_tokens"]) / (now - t_last)}
            for key in ("rollout_s", "generate_s", "update_s", "rollout_tokens_per_s", "update_tokens_per_s",
                        "completions/mean_length", "reward", "entropy"):
                w[key] = sum(acc[key]) / n
            windows.append(w)
            acc, t_last = {}, now
    print(json.dumps({"windows": windows, "first_steps": first_steps, "params": rc.param_counts(model),
                      "attn_implementation": model.config._attn_implementation,
                      "torch_threads": torch.get_num_threads(), "prompts_per_step": B, "num_generations": G,
                      "vision_passes_per_image": G,
                      "maxrss_before_model_kb": rss_before_model, "maxrss_kb": rc.maxrss_kb()}))


if __name__ == "__main__":
    main()
