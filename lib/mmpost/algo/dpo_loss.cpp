// Preference losses (see dpo_loss.h). Each loss type is one `case` transcribed from TRL 1.16.0
// (trl/trainer/dpo_trainer.py, DPOTrainer._compute_loss; experimental/cpo CPOTrainer.cpo_loss;
// experimental/orpo ORPOTrainer.odds_ratio_loss) with its paper; tests/golden/test_dpo_golden.cpp
// checks every case against numbers TRL itself computed.
#include "mmpost/algo/dpo_loss.h"

#include <cmath>
#include <utility>

#include "mmpost/core/check.h"

namespace mmpost::algo {
namespace {

namespace F = torch::nn::functional;

const std::pair<DpoLossType, const char*> kNames[] = {
    {DpoLossType::kSigmoid, "sigmoid"},       {DpoLossType::kHinge, "hinge"},
    {DpoLossType::kIpo, "ipo"},               {DpoLossType::kExoPair, "exo_pair"},
    {DpoLossType::kNcaPair, "nca_pair"},      {DpoLossType::kRobust, "robust"},
    {DpoLossType::kBcoPair, "bco_pair"},      {DpoLossType::kSppoHard, "sppo_hard"},
    {DpoLossType::kAot, "aot"},               {DpoLossType::kAotUnpaired, "aot_unpaired"},
    {DpoLossType::kApoZero, "apo_zero"},      {DpoLossType::kApoDown, "apo_down"},
    {DpoLossType::kDiscopop, "discopop"},     {DpoLossType::kSft, "sft"},
    {DpoLossType::kSigmoidNorm, "sigmoid_norm"}, {DpoLossType::kSimpo, "simpo"},
    {DpoLossType::kOrpo, "orpo"},
};

/// The per-sequence terms every loss type reads, built once per call.
struct Terms {
  torch::Tensor chosen, rejected;          // policy logps [B] (LD-DPO weighted when ld_alpha is set)
  torch::Tensor ref_chosen, ref_rejected;  // reference logps [B] (same weighting); undefined if ref-free
  torch::Tensor chosen_logratios, rejected_logratios;  // policy - reference [B]
  torch::Tensor raw_chosen;                // unweighted policy chosen sum, for sft (TRL uses raw tokens)
  torch::Tensor n_chosen, n_rejected;      // token counts [B], in the logps dtype
};

const torch::Tensor& need(const torch::Tensor& t, const char* field, DpoLossType type) {
  MMPOST_CHECK_USAGE(t.defined(), "dpo loss type '", to_string(type), "' needs PreferenceLogps::",
                     field, ", which the caller did not set");
  return t;
}

/// -logsigmoid(beta x) (1 - eps) - logsigmoid(-beta x) eps: the label-smoothed (conservative)
/// sigmoid loss shared by aot, aot_unpaired and simpo.
torch::Tensor smoothed_sigmoid(const torch::Tensor& x, double beta, double eps) {
  return -F::logsigmoid(beta * x) * (1 - eps) - F::logsigmoid(-beta * x) * eps;
}

/// log(1 - exp(x)) for x < 0, branching at -ln 2 to avoid cancellation (TRL's orpo log1mexp).
torch::Tensor log1mexp(const torch::Tensor& x) {
  return torch::where(x < -0.6931471805599453, torch::log1p(-torch::exp(x)),
                      torch::log(-torch::expm1(x)));
}

/// One loss type's per-pair loss [B] (before WPO weighting and loss_weights).
torch::Tensor per_pair_loss(DpoLossType type, const Terms& t, const DpoLossConfig& cfg) {
  const double beta = cfg.beta, eps = cfg.label_smoothing;
  const auto delta = t.chosen_logratios.defined() ? t.chosen_logratios - t.rejected_logratios
                                                  : torch::Tensor();
  switch (type) {
    // DPO, Rafailov et al. 2023, arXiv:2305.18290, Eq. 7: -log sigma(beta * delta).
    case DpoLossType::kSigmoid:
      return -F::logsigmoid(beta * delta);
    // SLiC-HF hinge, Zhao et al. 2023, arXiv:2305.10425: max(0, 1 - beta * delta).
    case DpoLossType::kHinge:
      return torch::relu(1 - beta * delta);
    // IPO, Azar et al. 2023, arXiv:2310.12036, Eq. 17 with tau = beta, on per-token averaged
    // log-ratios (TRL's normalization, confirmed with the IPO authors): (d/n - 1/(2 beta))^2.
    case DpoLossType::kIpo: {
      auto d = t.chosen_logratios / t.n_chosen.clamp_min(1) -
               t.rejected_logratios / t.n_rejected.clamp_min(1);
      return (d - 1 / (2 * beta)).pow(2);
    }
    // EXO-pref, Ji et al. 2024, arXiv:2402.00856, Eq. 16: KL(softmax(beta * logratios) || [1-eps, eps])
    // over {chosen, rejected}, expanded into the logsigmoid form.
    case DpoLossType::kExoPair: {
      auto qw = torch::sigmoid(beta * delta), ql = torch::sigmoid(-beta * delta);
      return qw * (F::logsigmoid(beta * delta) - std::log1p(-eps)) +
             ql * (F::logsigmoid(-beta * delta) - std::log(eps));
    }
    // NCA, Chen et al. 2024, arXiv:2402.05369 (pairwise): -log sigma(r_w) - 1/2 log sigma(-r_w)
    // - 1/2 log sigma(-r_l), r = beta * logratio.
    case DpoLossType::kNcaPair: {
      auto rw = beta * t.chosen_logratios, rl = beta * t.rejected_logratios;
      return -F::logsigmoid(rw) - 0.5 * F::logsigmoid(-rw) - 0.5 * F::logsigmoid(-rl);
    }
    // Robust DPO, Chowdhury et al. 2024, arXiv:2403.00409: unbiased loss under flip rate eps,
    // ((1-eps) l(delta) - eps l(-delta)) / (1 - 2 eps), l(x) = -log sigma(beta x).
    case DpoLossType::kRobust:
      return (-(1 - eps) * F::logsigmoid(beta * delta) + eps * F::logsigmoid(-beta * delta)) /
             (1 - 2 * eps);
    // BCO (pairwise), Jung et al. 2024, arXiv:2404.04656: -log sigma(r_w) - log sigma(-r_l).
    case DpoLossType::kBcoPair:
      return -F::logsigmoid(beta * t.chosen_logratios) - F::logsigmoid(-beta * t.rejected_logratios);
    // SPPO (hard labels), Wu et al. 2024, arXiv:2405.00675, Eq. 4.7 with P = 1 for the winner, 0
    // for the loser: (logratio_w - 1/(2 beta))^2 + (logratio_l + 1/(2 beta))^2.
    case DpoLossType::kSppoHard:
      return (t.chosen_logratios - 0.5 / beta).pow(2) + (t.rejected_logratios + 0.5 / beta).pow(2);
    // AOT (paired), Melnyk et al. 2024, arXiv:2406.05882: sort the policy and the reference
    // chosen-minus-rejected log-ratios over the batch, then a smoothed sigmoid on their difference.
    case DpoLossType::kAot: {
      auto policy = std::get<0>(torch::sort(t.chosen - t.rejected, /*dim=*/0));
      auto ref = std::get<0>(torch::sort(t.ref_chosen - t.ref_rejected, /*dim=*/0));
      return smoothed_sigmoid(policy - ref, beta, eps);
    }
    // AOT (unpaired), same paper: sort chosen and rejected policy-reference log-ratios separately.
    case DpoLossType::kAotUnpaired: {
      auto c = std::get<0>(torch::sort(t.chosen_logratios, /*dim=*/0));
      auto r = std::get<0>(torch::sort(t.rejected_logratios, /*dim=*/0));
      return smoothed_sigmoid(c - r, beta, eps);
    }
    // APO-zero, D'Oosterlinck et al. 2024, arXiv:2408.06266, Eq. 7:
    // 1 - sigma(r_w) + sigma(r_l), r = beta * logratio.
    case DpoLossType::kApoZero:
      return 1 - torch::sigmoid(beta * t.chosen_logratios) + torch::sigmoid(beta * t.rejected_logratios);
    // APO-down, same paper, Eq. 8: sigma(r_w) + 1 - sigma(r_w - r_l).
    case DpoLossType::kApoDown:
      return torch::sigmoid(beta * t.chosen_logratios) + 1 - torch::sigmoid(beta * delta);
    // DiscoPOP (log-ratio modulated), Chris Lu et al. 2024, arXiv:2406.08414, Eq. 5, with
    // x = beta * delta: -log sigma(x) (1 - sigma(x/tau)) + exp(-x) sigma(x/tau).
    case DpoLossType::kDiscopop: {
      auto x = beta * delta;
      auto m = torch::sigmoid(x / cfg.discopop_tau);
      return -F::logsigmoid(x) * (1 - m) + torch::exp(-x) * m;
    }
    // SFT (the NLL term of RPO, Pang et al. 2024, arXiv:2404.19733, and of MPO, Wang et al. 2024,
    // arXiv:2411.10442): mean NLL over all chosen tokens of the batch, the same value in each row.
    case DpoLossType::kSft: {
      auto nll = -t.raw_chosen.sum() / t.n_chosen.sum();
      return nll.expand({t.raw_chosen.size(0)});
    }
    // Length-normalized DPO (Tulu 3, Lambert et al. 2024, arXiv:2411.15124):
    // -log sigma(beta * (logratio_w / n_w - logratio_l / n_l)).
    case DpoLossType::kSigmoidNorm: {
      auto d = t.chosen_logratios / t.n_chosen.clamp_min(1) -
               t.rejected_logratios / t.n_rejected.clamp_min(1);
      return -F::logsigmoid(beta * d);
    }
    // SimPO, Meng et al. 2024, arXiv:2405.14734, Eq. 6 (+ CPO's label smoothing):
    // -log sigma(beta (logp_w / n_w - logp_l / n_l) - gamma), reference-free.
    case DpoLossType::kSimpo: {
      auto x = t.chosen / t.n_chosen - t.rejected / t.n_rejected - cfg.simpo_gamma / beta;
      return smoothed_sigmoid(x, beta, eps);
    }
    // ORPO, Hong et al. 2024, arXiv:2403.07691, Eqs. 4 and 7: -lambda log sigma(log odds_w -
    // log odds_l), odds = p / (1 - p) of the per-token averaged logps, lambda = beta. TRL computes
    // it in float32 at least. The NLL term of ORPO is the separate `sft` loss type.
    case DpoLossType::kOrpo: {
      auto dt = torch::promote_types(t.chosen.scalar_type(), torch::kFloat32);
      auto ac = (t.chosen / t.n_chosen).to(dt), ar = (t.rejected / t.n_rejected).to(dt);
      auto log_odds = (ac - ar) - (log1mexp(ac) - log1mexp(ar));
      return (-beta * F::logsigmoid(log_odds)).to(t.chosen.scalar_type());
    }
  }
  TORCH_CHECK(false, "unhandled DpoLossType");
}

}  // namespace

DpoLossType parse_dpo_loss_type(const std::string& name) {
  for (const auto& [type, n] : kNames)
    if (name == n) return type;
  throw Error(ErrorKind::kUsage, "unknown dpo loss type '" + name + "'",
              "valid loss types: " + dpo_loss_type_names());
}

std::string to_string(DpoLossType type) {
  for (const auto& [t, n] : kNames)
    if (t == type) return n;
  TORCH_CHECK(false, "unhandled DpoLossType");
}

std::string dpo_loss_type_names() {
  std::string s;
  for (const auto& [t, n] : kNames) s += (s.empty() ? "" : ", ") + std::string(n);
  return s;
}

bool is_reference_free(DpoLossType type) {
  return type == DpoLossType::kSimpo || type == DpoLossType::kOrpo;
}

void validate(const DpoLossConfig& cfg) {
  MMPOST_CHECK_USAGE(!cfg.loss_types.empty(), "dpo: loss_types is empty; valid loss types: ",
                     dpo_loss_type_names());
  MMPOST_CHECK_USAGE(cfg.beta > 0, "dpo: beta must be > 0, got ", cfg.beta);
  MMPOST_CHECK_USAGE(cfg.loss_weights.empty() || cfg.loss_weights.size() == cfg.loss_types.size(),
                     "dpo: loss_weights has ", cfg.loss_weights.size(), " values for ",
                     cfg.loss_types.size(), " loss types; give one weight per loss type");
  size_t n_free = 0;
  for (auto type : cfg.loss_types) {
    n_free += is_reference_free(type);
    MMPOST_CHECK_USAGE(type != DpoLossType::kExoPair || cfg.label_smoothing > 0,
                       "dpo: exo_pair needs label_smoothing > 0 (the EXO paper recommends 1e-3)");
    MMPOST_CHECK_USAGE(!cfg.use_weighting || (type != DpoLossType::kAot &&
                                              type != DpoLossType::kAotUnpaired),
                       "dpo: use_weighting (WPO) is not defined for aot/aot_unpaired, which sort "
                       "the batch and so misalign per-pair weights");
  }
  MMPOST_CHECK_USAGE(n_free == 0 || n_free == cfg.loss_types.size(),
                     "dpo: reference-free loss types (simpo, orpo) cannot be combined with "
                     "reference-based ones");
  MMPOST_CHECK_USAGE(n_free == 0 || (!cfg.use_weighting && !cfg.ld_alpha),
                     "dpo: use_weighting and ld_alpha apply only to reference-based loss types");
  MMPOST_CHECK_USAGE(!cfg.ld_alpha || (*cfg.ld_alpha >= 0 && *cfg.ld_alpha <= 1),
                     "dpo: ld_alpha must be in [0, 1], got ", cfg.ld_alpha.value_or(0));
}

DpoLossOutput dpo_loss(const PreferenceLogps& policy, const PreferenceLogps* reference,
                       const DpoLossConfig& cfg) {
  validate(cfg);
  const auto first = cfg.loss_types.front();
  const bool ref_free = is_reference_free(first);
  MMPOST_CHECK_USAGE(ref_free || reference != nullptr, "dpo loss type '", to_string(first),
                     "' needs reference log-probs");
  TORCH_CHECK(policy.chosen.dim() == 1 && policy.chosen.sizes() == policy.rejected.sizes(),
              "dpo_loss: chosen/rejected logps must both be [B]");

  Terms t;
  t.raw_chosen = policy.chosen;
  bool need_counts = cfg.use_weighting || cfg.ld_alpha.has_value();
  for (auto type : cfg.loss_types)
    need_counts |= type == DpoLossType::kIpo || type == DpoLossType::kSigmoidNorm ||
                   type == DpoLossType::kSft || ref_free;
  if (need_counts) {
    t.n_chosen = need(policy.n_chosen, "n_chosen", first).to(policy.chosen.scalar_type());
    t.n_rejected = need(policy.n_rejected, "n_rejected", first).to(policy.chosen.scalar_type());
  }
  // LD-DPO, Liu et al. 2024, arXiv:2409.06411: logp = shared + alpha * tail, where the tail is
  // the tokens past the shorter completion's length; applied to policy and reference alike.
  auto weigh = [&](const torch::Tensor& sum, const torch::Tensor& tail, const char* field) {
    if (!cfg.ld_alpha) return sum;
    need(tail, field, first);
    return (sum - tail) + *cfg.ld_alpha * tail;
  };
  t.chosen = weigh(policy.chosen, policy.chosen_tail, "chosen_tail");
  t.rejected = weigh(policy.rejected, policy.rejected_tail, "rejected_tail");
  if (!ref_free) {
    t.ref_chosen = weigh(reference->chosen, reference->chosen_tail, "chosen_tail (reference)");
    t.ref_rejected = weigh(reference->rejected, reference->rejected_tail, "rejected_tail (reference)");
    t.chosen_logratios = t.chosen - t.ref_chosen;
    t.rejected_logratios = t.rejected - t.ref_rejected;
  }

  // WPO, Zhou et al. 2024, arXiv:2406.11827, Eq. 2: weight each pair by the product of the
  // policy's length-normalized probabilities, aligned by log sum_v p_v^2; no gradient.
  torch::Tensor pair_weight;
  if (cfg.use_weighting) {
    torch::NoGradGuard no_grad;
    auto wc = torch::exp((policy.chosen - need(policy.chosen_log_sum_sq, "chosen_log_sum_sq", first)) /
                         t.n_chosen.clamp_min(1));
    auto wr = torch::exp((policy.rejected -
                          need(policy.rejected_log_sum_sq, "rejected_log_sum_sq", first)) /
                         t.n_rejected.clamp_min(1));
    pair_weight = wc * wr;
  }

  torch::Tensor losses;
  for (size_t k = 0; k < cfg.loss_types.size(); ++k) {
    auto l = per_pair_loss(cfg.loss_types[k], t, cfg);
    if (pair_weight.defined()) l = l * pair_weight;
    const double w = cfg.loss_weights.empty() ? 1.0 : cfg.loss_weights[k];
    losses = losses.defined() ? losses + w * l : w * l;
  }

  DpoLossOutput out;
  out.losses = losses;
  if (ref_free) {  // CPO/ORPO log beta * (averaged) policy logps
    out.rewards_chosen = cfg.beta * (t.chosen / t.n_chosen).detach();
    out.rewards_rejected = cfg.beta * (t.rejected / t.n_rejected).detach();
  } else {
    out.rewards_chosen = cfg.beta * t.chosen_logratios.detach();
    out.rewards_rejected = cfg.beta * t.rejected_logratios.detach();
  }
  return out;
}

PreferenceLogps preference_logps(const TokenStats& s, int64_t B) {
  TORCH_CHECK(s.logps.dim() == 2 && s.logps.size(0) >= 2 * B, "preference_logps: need 2B rows");
  auto logps = s.logps.narrow(0, 0, 2 * B);
  auto mask = s.mask.narrow(0, 0, 2 * B);
  auto sums = logps.sum(/*dim=*/-1);                    // [2B]
  auto n = mask.sum(/*dim=*/-1).to(torch::kFloat32);    // [2B]
  // Position of each token within its completion (1-based) for the LD-DPO tail.
  auto pos = mask.to(torch::kInt64).cumsum(/*dim=*/-1);  // [2B, T-1]
  auto n_c = n.narrow(0, 0, B), n_r = n.narrow(0, B, B);
  auto shared = torch::minimum(n_c, n_r).repeat({2}).to(torch::kInt64).unsqueeze(-1);  // [2B, 1]
  auto tails = (logps * (mask & pos.gt(shared)).to(logps.scalar_type())).sum(/*dim=*/-1);
  PreferenceLogps p;
  p.chosen = sums.narrow(0, 0, B);
  p.rejected = sums.narrow(0, B, B);
  p.n_chosen = n_c;
  p.n_rejected = n_r;
  p.chosen_tail = tails.narrow(0, 0, B);
  p.rejected_tail = tails.narrow(0, B, B);
  if (s.log_sum_sq.defined()) {
    auto sq = s.log_sum_sq.narrow(0, 0, 2 * B).sum(/*dim=*/-1);
    p.chosen_log_sum_sq = sq.narrow(0, 0, B);
    p.rejected_log_sum_sq = sq.narrow(0, B, B);
  }
  return p;
}

MdpoLosses mdpo_loss(const torch::Tensor& policy_chosen, const torch::Tensor& ref_chosen,
                     const torch::Tensor& policy_chosen_corrupted,
                     const torch::Tensor& ref_chosen_corrupted, double beta, double anchor_delta) {
  auto ratio = policy_chosen - ref_chosen;                                // [B]
  auto ratio_corrupted = policy_chosen_corrupted - ref_chosen_corrupted;  // [B]
  MdpoLosses out;
  out.conditional = -torch::nn::functional::logsigmoid(beta * (ratio - ratio_corrupted));
  out.anchor = -torch::nn::functional::logsigmoid(beta * ratio - anchor_delta);
  return out;
}

}  // namespace mmpost::algo
