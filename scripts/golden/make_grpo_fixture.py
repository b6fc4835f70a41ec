"""Golden fixture for mmpost's policy-gradient math (lib/mmpost/algo/policy_gradient.*) vs TRL
(tests/golden/test_grpo_golden.cpp).

The numbers come from TRL's own code, imported, not a transcription:
  - Loss: `trl.GRPOTrainer._compute_loss`, called unbound on a stand-in `self` whose
    `_get_per_token_logps_and_entropies` returns per-token log-probs chosen here (a float64 leaf, so
    the fixture also holds TRL's gradient d loss / d logps). The metrics are read back from the
    stand-in's `_metrics` (kl, clip_ratio/*, cispo_clip_ratio). Gradient accumulation 1, one
    process, steps_per_generation 1, so TRL's returned loss is the un-normalized loss mmpost returns;
    dapo/cispo get `num_items_in_batch` (= mmpost's n_loss_tokens) set explicitly.
  - GRPO advantages: the advantage block of `GRPOTrainer._generate_and_score_completions` (from
    `if self.multi_objective_aggregation == "sum_then_normalize":` through
    `advantages = torch.nan_to_num(...)`), cut out of TRL's source with `inspect` and exec'd on a
    stand-in namespace, for scale_rewards group / batch / none. Same for RLOO's block of
    `RLOOTrainer._generate_and_score_completions` (normalize_advantages False / True).

Inputs: B = 8 completions of T = 7 tokens, lengths 7, 5, 1, 3, 6, 0, 4, 2 (an empty row tests the
clamp(min=1) guards and TRL's NaN-ignoring min/max). logps = -exp(N(-1, 0.7)); old = logps + N(0,
0.35) (ratios ~0.5..2, so low, high and region clipping all occur); ref = logps + N(0, 0.5).
Advantages mix signs and include 0. Rewards for the advantages: 6 groups of G = 4 with an all-equal
group, a binary group, a group with one unscorable (NaN) completion, a constant group with a NaN,
and two continuous groups; values are dyadic so group means are exact. Everything is float64.

Writes tests/golden/fixtures/grpo/:
  grpo.safetensors  inputs: logps, old_logps, ref_logps [B, T], advantages [B], completion_mask
                      [B, T], rewards [24]
                    per loss case NAME: NAME.loss (0-d), NAME.grad [B, T] (d loss / d logps),
                      NAME.<metric> (0-d) for each metric TRL logged
                    per advantage case NAME: NAME.advantages, NAME.std_rewards [24] float64,
                      NAME.is_std_zero [24] (0/1 float64)
  cases.json        the cases with their configs and the metric names stored

Deterministic (seed fixed). Run: .venv/bin/python scripts/golden/make_grpo_fixture.py
(needs trl==1.16.0 as pinned in scripts/requirements-dev.txt, torch 2.13.0 CPU, safetensors).
"""
import inspect
import json
import os
import textwrap
from collections import defaultdict
from types import SimpleNamespace

import torch
from safetensors.torch import save_file

import trl
from trl import GRPOTrainer, RLOOTrainer
from trl.trainer.utils import nanstd

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "golden", "fixtures", "grpo")
B, T, P = 8, 7, 2
DT = torch.float64
G = 4

# TRL metric key -> fixture suffix (the C++ PolicyLossOutput field of the same name).
METRICS = {
    "kl": "kl",
    "clip_ratio/low_mean": "clip_ratio_low",
    "clip_ratio/high_mean": "clip_ratio_high",
    "clip_ratio/region_mean": "clip_ratio_region",
    "clip_ratio/low_min": "clip_ratio_low_min",
    "clip_ratio/high_max": "clip_ratio_high_max",
    "cispo_clip_ratio": "cispo_clip_ratio",
}


def make_inputs():
    g = torch.Generator().manual_seed(2025)
    lengths = [7, 5, 1, 3, 6, 0, 4, 2]
    mask = torch.zeros(B, T, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    logps = -torch.exp(-1.0 + 0.7 * torch.randn(B, T, generator=g, dtype=DT))
    old = logps + 0.35 * torch.randn(B, T, generator=g, dtype=DT)
    ref = logps + 0.5 * torch.randn(B, T, generator=g, dtype=DT)
    advantages = torch.tensor([1.2, -0.7, 0.4, -1.5, 0.0, 0.9, -0.3, 2.0], dtype=DT)
    nan = float("nan")
    rewards = torch.tensor([
        1.0, 1.0, 1.0, 1.0,        # all equal: advantage 0, std 0
        1.0, 0.0, 0.0, 1.0,        # binary accuracy
        0.5, nan, 0.25, 1.0,       # one unscorable completion
        0.75, 0.75, nan, 0.75,     # constant among the scorable ones
        2.0, -1.0, 0.5, 3.25,      # continuous
        -0.5, -0.375, 1.5, 0.125,  # continuous
    ], dtype=DT)
    return dict(logps=logps, old_logps=old, ref_logps=ref, advantages=advantages,
                completion_mask=mask, rewards=rewards)


def fake_self(case, logps):
    args = SimpleNamespace(
        use_bias_correction_kl=case.get("use_bias_correction_kl", True), delta=case.get("delta"),
        sapo_temperature_pos=case.get("sapo_temperature_pos", 1.0),
        sapo_temperature_neg=case.get("sapo_temperature_neg", 1.05), steps_per_generation=1)
    acc = SimpleNamespace(num_processes=1, gather=lambda t: t, gather_for_metrics=lambda t: t,
                          reduce=lambda t, reduction="sum": t, sync_gradients=True)
    entropies = torch.zeros(B, T, dtype=DT)
    return SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (logps, entropies, None),
        top_entropy_quantile=1.0, off_policy_mask_threshold=None,
        importance_sampling_level=case["importance_sampling_level"], beta=case["beta"], args=args,
        loss_type=case["loss_type"], epsilon_low=case["epsilon"],
        epsilon_high=case.get("epsilon_high", case["epsilon"]), use_vllm=False,
        vllm_importance_sampling_correction=False, model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1, max_completion_length=case.get("max_completion_length", 512),
        accelerator=acc, _entropy_bonus_enabled=False, aux_loss_enabled=False,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)})


def trl_loss(case, x):
    logps = x["logps"].clone().requires_grad_(True)
    me = fake_self(case, logps)
    cm = x["completion_mask"]
    inputs = {"prompt_ids": torch.zeros(B, P, dtype=torch.long), "prompt_mask": torch.ones(B, P, dtype=torch.long),
              "completion_ids": torch.zeros(B, T, dtype=torch.long), "completion_mask": cm,
              "advantages": x["advantages"], "old_per_token_logps": x["old_logps"],
              "num_items_in_batch": torch.tensor(float(case.get("num_items_in_batch", cm.sum().item())))}
    if case["beta"] != 0.0:
        inputs["ref_per_token_logps"] = x["ref_logps"]
    loss = GRPOTrainer._compute_loss(me, None, inputs)
    loss.backward()
    metrics = {METRICS[k]: v[-1] for k, v in me._metrics["train"].items() if k in METRICS}
    return loss.detach(), logps.grad.detach(), metrics


def code_block(fn, first, last):
    """The dedented source lines of `fn` from the line containing `first` to the one containing `last`."""
    lines = inspect.getsource(fn).splitlines()
    i = next(k for k, s in enumerate(lines) if first in s)
    j = next(k for k, s in enumerate(lines) if k > i and last in s)
    return textwrap.dedent("\n".join(lines[i : j + 1]))


GRPO_ADV = code_block(GRPOTrainer._generate_and_score_completions,
                      'if self.multi_objective_aggregation == "sum_then_normalize":',
                      "advantages = torch.nan_to_num(advantages, nan=0.0)")
RLOO_ADV = code_block(RLOOTrainer._generate_and_score_completions,
                      "grouped_rewards = rewards.view(-1, num_generations)",
                      "is_std_zero = torch.isclose(std_rewards, torch.zeros_like(std_rewards))")


def trl_grpo_advantages(rewards, scale_rewards):
    me = SimpleNamespace(multi_objective_aggregation="sum_then_normalize", scale_rewards=scale_rewards,
                         reward_weights=torch.ones(1, dtype=DT))
    rewards_per_func = rewards.unsqueeze(1)
    ns = dict(self=me, torch=torch, nanstd=nanstd, rewards_per_func=rewards_per_func, num_generations=G,
              device="cpu", unscorable_mask=torch.isnan(rewards_per_func).all(dim=1))
    exec(GRPO_ADV, ns)
    return ns["advantages"], ns["std_rewards"], ns["is_std_zero"]


def trl_rloo_advantages(rewards, normalize):
    me = SimpleNamespace(normalize_advantages=normalize)
    ns = dict(self=me, torch=torch, nanstd=nanstd, rewards=rewards.clone(), num_generations=G)
    exec(RLOO_ADV, ns)
    # RLOO's std is per group; the C++ API repeats it per row.
    return ns["advantages"], ns["std_rewards"].repeat_interleave(G), ns["is_std_zero"].repeat_interleave(G)


def loss_cases():
    cases = []
    for loss_type in ["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo"]:
        for level in ["token", "sequence"]:
            for beta in [0.0, 0.04]:
                c = {"loss_type": loss_type, "importance_sampling_level": level, "beta": beta, "epsilon": 0.2}
                if loss_type == "cispo":
                    c["epsilon_high"] = 1.3  # ScaleRL's eps_max is 5; 1.3 makes some ratios clip here
                elif loss_type in ("dapo", "bnpo"):
                    c["epsilon_high"] = 0.28  # DAPO's clip-higher
                if loss_type == "dr_grpo":
                    c["max_completion_length"] = 10
                c["name"] = f"{loss_type}_{level}_beta{beta:g}"
                cases.append(c)
    cases += [
        {"name": "dapo_global_tokens", "loss_type": "dapo", "importance_sampling_level": "token", "beta": 0.04,
         "epsilon": 0.2, "epsilon_high": 0.28, "num_items_in_batch": 83},
        {"name": "grpo_delta", "loss_type": "grpo", "importance_sampling_level": "token", "beta": 0.0,
         "epsilon": 0.2, "delta": 1.5},
        {"name": "grpo_no_bias_correction", "loss_type": "grpo", "importance_sampling_level": "token",
         "beta": 0.1, "epsilon": 0.2, "use_bias_correction_kl": False},
        {"name": "sapo_temps", "loss_type": "sapo", "importance_sampling_level": "token", "beta": 0.0,
         "epsilon": 0.2, "sapo_temperature_pos": 2.0, "sapo_temperature_neg": 0.5},
    ]
    return cases


def main():
    torch.manual_seed(0)
    x = make_inputs()
    out = {k: v.to(DT).contiguous() for k, v in x.items()}
    cases = loss_cases()
    for case in cases:
        loss, grad, metrics = trl_loss(case, x)
        name = case["name"]
        assert torch.isfinite(loss), name
        out[f"{name}.loss"] = loss.to(DT).reshape(())
        out[f"{name}.grad"] = grad.to(DT).contiguous()
        case["metrics"] = sorted(metrics)
        for k, v in metrics.items():
            out[f"{name}.{k}"] = torch.tensor(v, dtype=DT)
        print(f"{name:28s} loss {loss.item():+.6f}  " + " ".join(f"{k}={v:.4f}" for k, v in sorted(metrics.items())))
    adv_cases = []
    for scale in ["group", "batch", "none"]:
        adv_cases.append({"name": f"grpo_adv_{scale}", "estimator": "grpo", "scale_rewards": scale})
    for norm in [False, True]:
        adv_cases.append({"name": f"rloo_adv{'_norm' if norm else ''}", "estimator": "rloo", "normalize_advantages": norm})
    for case in adv_cases:
        if case["estimator"] == "grpo":
            adv, std, zero = trl_grpo_advantages(x["rewards"], case["scale_rewards"])
        else:
            adv, std, zero = trl_rloo_advantages(x["rewards"], case["normalize_advantages"])
        assert not torch.isnan(adv).any(), case
        out[f"{case['name']}.advantages"] = adv.to(DT).contiguous()
        out[f"{case['name']}.std_rewards"] = std.to(DT).contiguous()
        out[f"{case['name']}.is_std_zero"] = zero.to(DT).contiguous()
        print(f"{case['name']:28s} advantages {[round(v, 4) for v in adv.tolist()]}")
    os.makedirs(OUT, exist_ok=True)
    save_file(out, os.path.join(OUT, "grpo.safetensors"),
              metadata={"trl": trl.__version__, "torch": torch.__version__})
    with open(os.path.join(OUT, "cases.json"), "w") as f:
        json.dump({"trl": trl.__version__, "batch_size": B, "num_generations": G, "loss_cases": cases,
                   "advantage_cases": adv_cases}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
