"""Golden fixture for mmpost's preference losses (lib/mmpost/algo/dpo_loss.*) vs TRL
(tests/golden/test_dpo_golden.cpp).

The numbers come from TRL's own code, imported, not a transcription:
  - DPO family: `trl.DPOTrainer._compute_loss` (TRL 1.16 has no standalone `dpo_loss`; the loss
    loop is inline there). It is called unbound on a stand-in `self` whose policy and reference
    "models" return per-token log-probs chosen here (TRL's fused-LM-head output fields). A
    sys.settrace hook reads each loss type's `per_sequence_loss` (after WPO weighting) at the
    line `loss += per_sequence_loss.mean() * loss_weight`, and `chosen_rewards` /
    `rejected_rewards` when the function returns; the returned scalar `loss` is saved too.
  - SimPO: `trl.experimental.cpo.CPOTrainer.cpo_loss` (loss_type="simpo", alpha=0) on
    length-averaged log-probs, as CPOTrainer.concatenated_forward passes them.
  - ORPO: `trl.experimental.orpo.ORPOTrainer.odds_ratio_loss` on length-averaged log-probs.
    TRL returns beta * logsigmoid(log_odds) and its trainer minimizes nll - mean(that); mmpost's
    `orpo` loss is the term to minimize, so the fixture stores the negation (the NLL part is
    mmpost's `sft` loss type, which equals ORPO's chosen-token cross-entropy).

Inputs: B = 6 pairs, prompt of 3 tokens, completions of 1..8 tokens (chosen and rejected lengths
differ, so LD-DPO's shared/tail split and the length-normalized losses matter). Per-token
log-probs are -exp(N(mu_row, 0.8)) with row scales from ~0.05 to ~2 nats, so the policy-reference
log-ratios have both signs and magnitudes from ~0.01 to ~10. Everything is float64 (TRL runs
its code in the inputs' dtype), so a 1e-6 comparison tests the formulas, not float32 rounding.

Writes tests/golden/fixtures/dpo/:
  dpo_losses.safetensors  inputs (per-sequence sums the C++ API takes), all [B] float64:
                            policy.{chosen,rejected}, reference.{chosen,rejected}: summed logps
                            n_chosen, n_rejected: completion token counts
                            policy.{chosen,rejected}_tail, reference.{...}_tail: LD-DPO sums over
                              the tokens past min(n_chosen, n_rejected)
                            policy.{chosen,rejected}_log_sum_sq: WPO, sum over completion tokens
                              of log sum_v p_v^2 (the fused head's log_sum_sq_probs)
                          per case NAME: NAME.losses, NAME.rewards_chosen, NAME.rewards_rejected
                            [B], NAME.loss (0-d; TRL's scalar = mean of losses)
  cases.json              the cases in order with their configs

Deterministic (seed fixed). Run: .venv/bin/python scripts/golden/make_dpo_fixture.py
(needs trl==1.16.0 as pinned in scripts/requirements-dev.txt, torch 2.13.0 CPU, safetensors).
"""
import contextlib
import inspect
import json
import os
import sys
from collections import defaultdict
from types import SimpleNamespace

import torch
from safetensors.torch import save_file

import trl
from trl import DPOTrainer
from trl.experimental.cpo import CPOTrainer
from trl.experimental.orpo import ORPOTrainer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "golden", "fixtures", "dpo")
B, P, TMAX = 6, 3, 8
DT = torch.float64


def make_inputs():
    g = torch.Generator().manual_seed(1234)
    n_chosen = torch.tensor([1, 4, 8, 3, 6, 5])
    n_rejected = torch.tensor([2, 4, 5, 8, 1, 7])
    lens = torch.cat([n_chosen, n_rejected])  # [2B], batch is [chosen; rejected] as in TRL
    L = P + TMAX
    completion_mask = torch.zeros(2 * B, L, dtype=torch.long)
    for i, n in enumerate(lens.tolist()):
        completion_mask[i, P : P + n] = 1
    shift_mask = completion_mask[:, 1:].to(DT)  # [2B, L-1]
    row_mu = torch.tensor([-3.0, -1.5, -0.5, 0.0, 0.5, 0.7] * 2, dtype=DT).unsqueeze(1)

    policy = -torch.exp(row_mu + 0.8 * torch.randn(2 * B, L - 1, generator=g, dtype=DT)) * shift_mask
    # Reference = policy + per-token noise of row-dependent size, kept <= 0: log-ratios of both signs.
    noise = torch.randn(2 * B, L - 1, generator=g, dtype=DT) * torch.exp(row_mu) * 0.7
    reference = torch.clamp(policy + noise, max=-1e-3) * shift_mask
    # WPO's log sum_v p_v^2 per token: between 2*logp (one dominant token) and 0; any value <= 0.
    log_sum_sq = (2 * policy * torch.rand(2 * B, L - 1, generator=g, dtype=DT)) * shift_mask
    return dict(completion_mask=completion_mask, shift_mask=shift_mask, policy=policy,
                reference=reference, log_sum_sq=log_sum_sq, n_chosen=n_chosen, n_rejected=n_rejected)


class FakeModel:
    """Stands in for a model called with fused_lm_head=True: returns the given per-token fields."""

    training = True
    is_gradient_checkpointing = False

    def __init__(self, log_probs, log_sum_sq):
        self.log_probs, self.log_sum_sq = log_probs, log_sum_sq

    def __call__(self, **kwargs):
        n, t = self.log_probs.shape
        return SimpleNamespace(log_probs=self.log_probs.clone(), log_sum_sq_probs=self.log_sum_sq,
                               entropy=torch.zeros(n, t), mean_logits=torch.zeros(n, t),
                               is_top1=torch.zeros(n, t, dtype=torch.bool), aux_loss=None)


def fake_self(cfg, x):
    acc = SimpleNamespace(device=torch.device("cpu"), gather_for_metrics=lambda t: t, gather=lambda t: t)
    policy = FakeModel(x["policy"], x["log_sum_sq"])
    return SimpleNamespace(
        model=policy, ref_model=FakeModel(x["reference"], x["log_sum_sq"]), accelerator=acc,
        aux_loss_enabled=False, precompute_ref_logps=False, beta=cfg["beta"],
        loss_types=cfg["loss_types"], loss_weights=cfg.get("loss_weights") or [1.0] * len(cfg["loss_types"]),
        ld_alpha=cfg.get("ld_alpha"), f_divergence_type="reverse_kl", f_alpha_divergence_coef=1.0,
        label_smoothing=cfg.get("label_smoothing", 0.0), use_weighting=cfg.get("use_weighting", False),
        args=SimpleNamespace(discopop_tau=cfg.get("discopop_tau", 0.05), gradient_checkpointing_kwargs=None),
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)}, _total_train_tokens=0, _tp_size=1,
    ), policy


def trl_dpo(cfg, x):
    """Runs DPOTrainer._compute_loss; returns (per-type losses after weighting, rewards, scalar loss)."""
    fn = DPOTrainer._compute_loss
    src, first = inspect.getsourcelines(fn)
    acc_line = [first + i for i, s in enumerate(src) if "loss += per_sequence_loss.mean() * loss_weight" in s]
    assert len(acc_line) == 1, "TRL changed: cannot find the loss accumulation line"
    captured, final = [], {}

    def local_trace(frame, event, arg):
        if event == "line" and frame.f_lineno == acc_line[0]:
            captured.append(frame.f_locals["per_sequence_loss"].detach().clone())
        if event == "return":
            final.update(chosen=frame.f_locals["chosen_rewards"].clone(),
                         rejected=frame.f_locals["rejected_rewards"].clone())
        return local_trace

    def global_trace(frame, event, arg):
        return local_trace if frame.f_code is fn.__code__ else None

    me, model = fake_self(cfg, x)
    inputs = {"input_ids": torch.zeros_like(x["completion_mask"]), "completion_mask": x["completion_mask"],
              "attention_mask": torch.ones_like(x["completion_mask"])}
    sys.settrace(global_trace)
    try:
        loss = fn(me, model, inputs, False)
    finally:
        sys.settrace(None)
    assert len(captured) == len(cfg["loss_types"])
    weights = me.loss_weights
    losses = sum(w * l for w, l in zip(weights, captured))
    assert torch.allclose(losses.mean(), loss.detach().to(DT), atol=1e-12, rtol=0), (losses.mean(), loss)
    return losses, final["chosen"], final["rejected"], loss.detach()


def trl_simpo(cfg, pc, pr):
    me = SimpleNamespace(alpha=0.0, beta=cfg["beta"], simpo_gamma=cfg["simpo_gamma"],
                         label_smoothing=cfg.get("label_smoothing", 0.0), loss_type="simpo",
                         accelerator=SimpleNamespace(device=torch.device("cpu")))
    losses, rc, rr = CPOTrainer.cpo_loss(me, pc, pr)
    return losses, rc, rr, losses.mean()


def trl_orpo(cfg, pc, pr):
    me = SimpleNamespace(beta=cfg["beta"], accelerator=SimpleNamespace(device=torch.device("cpu")))
    losses, rc, rr, _, _ = ORPOTrainer.odds_ratio_loss(me, pc, pr)
    return -losses, rc, rr, -losses.mean()  # mmpost minimizes -beta*logsigmoid(log_odds)


CASES = [
    {"name": "sigmoid", "loss_types": ["sigmoid"], "beta": 0.1},
    {"name": "sigmoid_beta1", "loss_types": ["sigmoid"], "beta": 1.0},
    {"name": "hinge", "loss_types": ["hinge"], "beta": 0.5},
    {"name": "ipo", "loss_types": ["ipo"], "beta": 0.1},
    {"name": "exo_pair", "loss_types": ["exo_pair"], "beta": 0.1, "label_smoothing": 1e-3},
    {"name": "exo_pair_ls02", "loss_types": ["exo_pair"], "beta": 0.3, "label_smoothing": 0.2},
    {"name": "nca_pair", "loss_types": ["nca_pair"], "beta": 0.1},
    {"name": "robust", "loss_types": ["robust"], "beta": 0.1, "label_smoothing": 0.2},
    {"name": "bco_pair", "loss_types": ["bco_pair"], "beta": 0.1},
    {"name": "sppo_hard", "loss_types": ["sppo_hard"], "beta": 0.1},
    {"name": "aot", "loss_types": ["aot"], "beta": 0.1},
    {"name": "aot_ls", "loss_types": ["aot"], "beta": 0.1, "label_smoothing": 0.1},
    {"name": "aot_unpaired", "loss_types": ["aot_unpaired"], "beta": 0.1, "label_smoothing": 0.1},
    {"name": "apo_zero", "loss_types": ["apo_zero"], "beta": 0.1},
    {"name": "apo_down", "loss_types": ["apo_down"], "beta": 0.1},
    {"name": "discopop", "loss_types": ["discopop"], "beta": 0.1, "discopop_tau": 0.05},
    {"name": "discopop_tau05", "loss_types": ["discopop"], "beta": 0.5, "discopop_tau": 0.5},
    {"name": "sft", "loss_types": ["sft"], "beta": 0.1},
    {"name": "sigmoid_norm", "loss_types": ["sigmoid_norm"], "beta": 0.1},
    {"name": "mpo", "loss_types": ["sigmoid", "bco_pair", "sft"], "loss_weights": [0.8, 0.2, 1.0], "beta": 0.1},
    {"name": "rpo", "loss_types": ["sigmoid", "sft"], "loss_weights": [1.0, 0.5], "beta": 0.1},
    {"name": "ld_sigmoid", "loss_types": ["sigmoid"], "beta": 0.1, "ld_alpha": 0.5},
    {"name": "ld_sft_ipo", "loss_types": ["sft", "ipo"], "beta": 0.1, "ld_alpha": 0.3},
    {"name": "wpo_sigmoid", "loss_types": ["sigmoid"], "beta": 0.1, "use_weighting": True},
    # Not with "sft": TRL 1.16 multiplies the expanded (stride-0) sft tensor in place and raises.
    {"name": "wpo_ld_sigmoid_bco", "loss_types": ["sigmoid", "bco_pair"], "loss_weights": [0.8, 0.2],
     "beta": 0.1, "use_weighting": True, "ld_alpha": 0.5},
    {"name": "wpo_ipo", "loss_types": ["ipo"], "beta": 0.1, "use_weighting": True},
    {"name": "simpo", "loss_types": ["simpo"], "beta": 2.0, "simpo_gamma": 0.5},
    {"name": "simpo_ls", "loss_types": ["simpo"], "beta": 2.0, "simpo_gamma": 1.0, "label_smoothing": 0.1},
    {"name": "orpo", "loss_types": ["orpo"], "beta": 0.1},
]


def main():
    torch.manual_seed(0)
    x = make_inputs()
    sm = x["shift_mask"]
    cmask, rmask = sm.chunk(2)
    nc, nr = x["n_chosen"], x["n_rejected"]
    shared = torch.minimum(nc, nr).unsqueeze(1)
    pos = sm.cumsum(dim=1)
    tail = pos > torch.cat([shared, shared])

    def sums(t):
        c, r = t.sum(dim=1).chunk(2)
        tc, tr = (t * tail).sum(dim=1).chunk(2)
        return c, r, tc, tr

    pc, pr, pct, prt = sums(x["policy"])
    rc, rr, rct, rrt = sums(x["reference"])
    lsc, lsr, _, _ = sums(x["log_sum_sq"])
    out = {"policy.chosen": pc, "policy.rejected": pr, "reference.chosen": rc, "reference.rejected": rr,
           "n_chosen": nc.to(DT), "n_rejected": nr.to(DT),
           "policy.chosen_tail": pct, "policy.rejected_tail": prt,
           "reference.chosen_tail": rct, "reference.rejected_tail": rrt,
           "policy.chosen_log_sum_sq": lsc, "policy.rejected_log_sum_sq": lsr}
    print("logratios chosen  ", (pc - rc).tolist())
    print("logratios rejected", (pr - rr).tolist())
    for case in CASES:
        if case["loss_types"] == ["simpo"]:
            res = trl_simpo(case, pc / nc, pr / nr)
        elif case["loss_types"] == ["orpo"]:
            res = trl_orpo(case, pc / nc, pr / nr)
        else:
            res = trl_dpo(case, x)
        losses, rch, rrej, loss = res
        name = case["name"]
        out[f"{name}.losses"] = losses.to(DT).contiguous()
        out[f"{name}.rewards_chosen"] = rch.to(DT).contiguous()
        out[f"{name}.rewards_rejected"] = rrej.to(DT).contiguous()
        out[f"{name}.loss"] = loss.to(DT).reshape(())
        assert torch.isfinite(losses).all(), name
        print(f"{name:16s} loss {loss.item():+.6f}  losses {[round(v, 4) for v in losses.tolist()]}")
    os.makedirs(OUT, exist_ok=True)
    save_file({k: v.contiguous() for k, v in out.items()}, os.path.join(OUT, "dpo_losses.safetensors"),
              metadata={"trl": trl.__version__, "torch": torch.__version__})
    with open(os.path.join(OUT, "cases.json"), "w") as f:
        json.dump({"trl": trl.__version__, "batch_size": B, "cases": CASES}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
