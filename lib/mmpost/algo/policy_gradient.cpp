// Policy-gradient math (see policy_gradient.h). Advantages and the GRPO-family loss are transcribed
// from TRL 1.16.0 (trl/trainer/grpo_trainer.py: _generate_and_score_completions for the advantages,
// _compute_loss for the loss and its metrics; rloo_trainer.py for RLOO), REINFORCE++ and GAE from
// verl (trainer/ppo/core_algos.py), value loss and whitening from TRL's former PPOTrainer.
// tests/golden/test_grpo_golden.cpp checks the TRL parts against TRL's own numbers.
#include "mmpost/algo/policy_gradient.h"

#include <cmath>
#include <limits>
#include <utility>

#include "mmpost/core/check.h"
#include "mmpost/core/names.h"

namespace mmpost::algo {
namespace {

const std::pair<ScaleRewards, const char*> kScaleNames[] = {
    {ScaleRewards::kGroup, "group"}, {ScaleRewards::kBatch, "batch"}, {ScaleRewards::kNone, "none"}};

const std::pair<PolicyLossType, const char*> kLossNames[] = {
    {PolicyLossType::kGrpo, "grpo"},   {PolicyLossType::kBnpo, "bnpo"},
    {PolicyLossType::kDrGrpo, "dr_grpo"}, {PolicyLossType::kDapo, "dapo"},
    {PolicyLossType::kCispo, "cispo"}, {PolicyLossType::kSapo, "sapo"},
    {PolicyLossType::kLuspo, "luspo"},
};

const std::pair<ImportanceSamplingLevel, const char*> kLevelNames[] = {
    {ImportanceSamplingLevel::kToken, "token"}, {ImportanceSamplingLevel::kSequence, "sequence"}};

const std::pair<RlAlgorithm, const char*> kAlgorithmNames[] = {
    {RlAlgorithm::kGrpo, "grpo"},
    {RlAlgorithm::kRloo, "rloo"},
    {RlAlgorithm::kReinforcePp, "reinforce_pp"},
    {RlAlgorithm::kReinforcePpBaseline, "reinforce_pp_baseline"},
    {RlAlgorithm::kPpo, "ppo"}};

/// TRL's nanstd over `dim` (or all elements when dim < 0): sqrt(nanmean((x - nanmean x)^2) *
/// n / (n - 1)), NaN when n <= 1. TRL forms the Bessel factor from integer counts, i.e. in the
/// default float32 dtype; kept so float64 inputs match it to the last bit.
torch::Tensor nanstd(const torch::Tensor& x, int64_t dim = -1) {
  const bool all = dim < 0;
  auto mean = all ? torch::nanmean(x) : torch::nanmean(x, {dim}, /*keepdim=*/true);
  auto centered = (x - mean).square();
  auto var = all ? torch::nanmean(centered) : torch::nanmean(centered, {dim}, /*keepdim=*/true);
  auto valid = torch::logical_not(torch::isnan(x));
  auto count = (all ? valid.sum() : valid.sum({dim}, /*keepdim=*/true)).to(torch::kFloat32);
  auto bessel = torch::where(count > 1, count / (count - 1),
                             torch::full_like(count, std::numeric_limits<float>::quiet_NaN()));
  auto std = torch::sqrt(var * bessel.to(x.scalar_type()));
  return all ? std : std.squeeze(dim);
}

/// [n_groups] bool: the scorable (non-NaN) rewards of each group are all equal (or all NaN).
torch::Tensor group_all_equal(const torch::Tensor& grouped) {
  const double inf = std::numeric_limits<double>::infinity();
  auto nan = torch::isnan(grouped);
  auto hi = torch::where(nan, torch::full_like(grouped, -inf), grouped).amax(/*dim=*/1);
  auto lo = torch::where(nan, torch::full_like(grouped, inf), grouped).amin(/*dim=*/1);
  return hi <= lo;
}

torch::Tensor grouped_view(const torch::Tensor& rewards, int64_t G, const char* who) {
  TORCH_CHECK(rewards.dim() == 1 && rewards.is_floating_point(), who,
              ": rewards must be a float [N] tensor, got ", rewards.sizes());
  MMPOST_CHECK_USAGE(G >= 1 && rewards.size(0) % G == 0, who, ": ", rewards.size(0),
                     " rewards do not split into groups of num_generations = ", G);
  return rewards.view({-1, G});
}

/// TRL's masked_mean over all elements.
torch::Tensor masked_mean(const torch::Tensor& x, const torch::Tensor& mask) {
  return (x * mask).sum() / mask.sum();
}

/// TRL's metric helpers: x is [B, T] (token values, masked mean) or [B, 1] (one value per
/// sequence, plain mean over sequences).
torch::Tensor global_masked_mean(const torch::Tensor& x, const torch::Tensor& mask) {
  if (x.size(1) == 1) return x.sum() / std::max<int64_t>(x.size(0), 1);
  return (x * mask).sum() / mask.sum().clamp_min(1.0);
}
torch::Tensor masked_seq_mean(const torch::Tensor& x, const torch::Tensor& mask) {
  if (x.size(1) == 1) return x.squeeze(1);
  return (x * mask).sum(/*dim=*/-1) / mask.sum(/*dim=*/-1);  // NaN for empty rows, as TRL
}
torch::Tensor nan_extreme(const torch::Tensor& x, bool max) {
  const double inf = std::numeric_limits<double>::infinity();
  auto nan = torch::isnan(x);
  auto filled = torch::where(nan, torch::full_like(x, max ? -inf : inf), x);
  auto extreme = max ? filled.max() : filled.min();
  return torch::where(nan.all(), torch::full_like(extreme, NAN), extreme);  // all NaN -> NaN, as TRL
}

}  // namespace

RlAlgorithm parse_rl_algorithm(const std::string& name) {
  return parse_name(kAlgorithmNames, name, "rlhf.algorithm");
}
std::string to_string(RlAlgorithm a) { return name_of(kAlgorithmNames, a); }
std::string rl_algorithm_names() { return names_of(kAlgorithmNames, " | "); }

ScaleRewards parse_scale_rewards(const std::string& name) {
  return parse_name(kScaleNames, name, "rlhf.scale_rewards");
}
std::string to_string(ScaleRewards scale) { return name_of(kScaleNames, scale); }

PolicyLossType parse_policy_loss_type(const std::string& name) {
  return parse_name(kLossNames, name, "rlhf.loss_type");
}
std::string to_string(PolicyLossType type) { return name_of(kLossNames, type); }
std::string policy_loss_type_names() { return names_of(kLossNames); }

ImportanceSamplingLevel parse_importance_sampling_level(const std::string& name) {
  return parse_name(kLevelNames, name, "rlhf.importance_sampling_level");
}
std::string to_string(ImportanceSamplingLevel level) { return name_of(kLevelNames, level); }

// ---- Advantages

GroupAdvantages grpo_advantages(const torch::Tensor& rewards, int64_t G, ScaleRewards scale_rewards,
                                double eps) {
  auto grouped = grouped_view(rewards, G, "grpo_advantages");
  auto mean = torch::nanmean(grouped, {1}, /*keepdim=*/true);  // [n, 1]
  torch::Tensor std_rewards;
  switch (scale_rewards) {
    // "none" still computes the group std: TRL logs frac_reward_zero_std from it.
    case ScaleRewards::kGroup:
    case ScaleRewards::kNone:
      std_rewards = G > 1 ? nanstd(grouped, /*dim=*/1).repeat_interleave(G) : torch::zeros_like(rewards);
      break;
    // PPO-Lite: group mean, batch std.
    case ScaleRewards::kBatch:
      std_rewards = rewards.numel() > 1 ? nanstd(rewards).expand_as(rewards) : torch::zeros_like(rewards);
      break;
  }
  auto adv = (grouped - mean).view(-1);
  if (scale_rewards != ScaleRewards::kNone) adv = adv / (std_rewards + eps);
  // All-equal groups: exactly 0, never (r - rounded mean) / eps.
  auto equal = group_all_equal(grouped).repeat_interleave(G);
  adv = torch::where(equal, torch::zeros_like(adv), adv);
  GroupAdvantages out;
  out.advantages = torch::nan_to_num(adv, /*nan=*/0.0);  // unscorable rows carry no signal
  out.std_rewards = std_rewards;
  out.is_std_zero = torch::isclose(std_rewards, torch::zeros_like(std_rewards));
  return out;
}

GroupAdvantages rloo_advantages(const torch::Tensor& rewards, int64_t G, bool normalize_advantages) {
  auto grouped = grouped_view(rewards, G, "rloo_advantages");
  auto group_std = G > 1 ? nanstd(grouped, /*dim=*/1) : torch::zeros({grouped.size(0)}, rewards.options());
  torch::Tensor adv;
  if (G > 1) {
    // Baseline: mean of the other scorable rewards; a group with one scorable row gives 0/0 = NaN -> 0.
    auto count = torch::logical_not(torch::isnan(grouped)).sum(/*dim=*/1, /*keepdim=*/true).to(rewards.scalar_type());
    auto sum = torch::nansum(grouped, /*dim=*/1, /*keepdim=*/true);
    adv = rewards - ((sum - grouped) / (count - 1)).view(-1);
  } else {
    adv = torch::zeros_like(rewards);
  }
  if (normalize_advantages) adv = (adv - torch::nanmean(adv)) / (nanstd(adv) + 1e-4);
  GroupAdvantages out;
  out.advantages = torch::nan_to_num(adv, /*nan=*/0.0);
  out.std_rewards = group_std.repeat_interleave(G);
  out.is_std_zero = torch::isclose(out.std_rewards, torch::zeros_like(out.std_rewards));
  return out;
}

std::pair<torch::Tensor, torch::Tensor> reinforce_pp_advantages(const torch::Tensor& token_rewards,
                                                                const torch::Tensor& completion_mask,
                                                                double gamma,
                                                                const BatchSum& batch_sum) {
  TORCH_CHECK(token_rewards.dim() == 2 && token_rewards.sizes() == completion_mask.sizes(),
              "reinforce_pp_advantages: token_rewards and completion_mask must both be [B, T]");
  torch::NoGradGuard no_grad;
  auto mask = completion_mask.to(token_rewards.scalar_type());
  auto returns = torch::zeros_like(token_rewards);
  auto running = torch::zeros({token_rewards.size(0)}, token_rewards.options());
  for (int64_t t = token_rewards.size(1) - 1; t >= 0; --t) {
    running = token_rewards.select(1, t) + gamma * running;
    returns.select(1, t).copy_(running);
    running = running * mask.select(1, t);  // a masked position starts a new return
  }
  return {masked_whiten(returns, mask, true, batch_sum) * mask, returns};
}

torch::Tensor reinforce_pp_baseline_advantages(const torch::Tensor& rewards, int64_t G,
                                               const torch::Tensor& completion_mask,
                                               const BatchSum& batch_sum) {
  auto grouped = grouped_view(rewards, G, "reinforce_pp_baseline_advantages");
  TORCH_CHECK(completion_mask.dim() == 2 && completion_mask.size(0) == rewards.size(0),
              "reinforce_pp_baseline_advantages: completion_mask must be [N, T]");
  torch::NoGradGuard no_grad;
  auto centered = G > 1 ? (grouped - grouped.mean(/*dim=*/1, /*keepdim=*/true)).view(-1) : rewards;
  auto mask = completion_mask.to(rewards.scalar_type());
  auto tiled = centered.unsqueeze(1) * mask;  // [N, T]: the score on every completion token
  return masked_whiten(tiled, mask, true, batch_sum) * mask;
}

torch::Tensor filter_zero_std_groups(const torch::Tensor& rewards, int64_t G) {
  auto grouped = grouped_view(rewards, G, "filter_zero_std_groups");
  auto keep = torch::logical_not(group_all_equal(grouped)).repeat_interleave(G);
  return keep.nonzero().squeeze(1);
}

// ---- Clipped surrogate loss

void validate(const PolicyLossConfig& cfg) {
  MMPOST_CHECK_USAGE(cfg.epsilon >= 0, "rlhf: epsilon must be >= 0, got ", cfg.epsilon);
  MMPOST_CHECK_USAGE(!cfg.epsilon_high || *cfg.epsilon_high > 0, "rlhf: epsilon_high must be > 0, got ",
                     cfg.epsilon_high.value_or(0));
  MMPOST_CHECK_USAGE(cfg.beta >= 0, "rlhf: beta must be >= 0, got ", cfg.beta);
  MMPOST_CHECK_USAGE(!cfg.delta || *cfg.delta > 1, "rlhf: delta (two-sided clip) must be > 1, got ",
                     cfg.delta.value_or(0), "; INTELLECT-2 recommends > 1 + epsilon");
  MMPOST_CHECK_USAGE(cfg.loss_type != PolicyLossType::kDrGrpo || cfg.max_completion_length > 0,
                     "rlhf: dr_grpo needs max_completion_length > 0 (its constant normalizer)");
  MMPOST_CHECK_USAGE(cfg.sapo_temperature_pos > 0 && cfg.sapo_temperature_neg > 0,
                     "rlhf: sapo temperatures must be > 0");
  MMPOST_CHECK_USAGE(cfg.kl_estimator != KlEstimator::kFull,
                     "rlhf: kl_estimator 'full' needs logits; compute algo::full_kl in the driver",
                     " or pick one of k1, k2, k3, low_var_kl, abs");
}

PolicyLossOutput policy_loss(const torch::Tensor& logps, const torch::Tensor& old_logps,
                             const torch::Tensor& advantages, const torch::Tensor& completion_mask,
                             const PolicyLossConfig& cfg, const torch::Tensor& ref_logps,
                             std::optional<double> n_loss_tokens) {
  validate(cfg);
  TORCH_CHECK(logps.dim() == 2 && old_logps.sizes() == logps.sizes() &&
                  completion_mask.sizes() == logps.sizes(),
              "policy_loss: logps, old_logps and completion_mask must all be [B, T]");
  TORCH_CHECK(advantages.size(0) == logps.size(0) &&
                  (advantages.dim() == 1 || advantages.sizes() == logps.sizes()),
              "policy_loss: advantages must be [B] or [B, T]");
  const auto mask = completion_mask.to(logps.scalar_type());
  const auto adv = advantages.dim() == 1 ? advantages.unsqueeze(1) : advantages;  // [B, 1] or [B, T]
  const double eps_low = cfg.epsilon, eps_high = cfg.epsilon_high_or_default();

  // Importance ratio: per token, or GSPO's length-normalized sequence ratio [B, 1].
  const auto log_ratio = logps - old_logps;
  torch::Tensor log_w;
  switch (cfg.importance_sampling_level) {
    case ImportanceSamplingLevel::kToken:
      log_w = log_ratio;
      break;
    // GSPO, arXiv:2507.18071, Eq. 7: s = exp(mean_t log(pi / pi_old)).
    case ImportanceSamplingLevel::kSequence:
      log_w = ((log_ratio * mask).sum(/*dim=*/-1) / mask.sum(/*dim=*/-1).clamp_min(1.0)).unsqueeze(-1);
      break;
  }
  auto coef_1 = torch::exp(log_w);

  torch::Tensor kl;  // [B, T]
  if (cfg.beta != 0.0) {
    MMPOST_CHECK_USAGE(ref_logps.defined(), "rlhf: beta = ", cfg.beta,
                       " needs reference log-probs; set beta = 0 to train without a reference model");
    kl = per_token_kl(logps, ref_logps, cfg.kl_estimator);
    if (cfg.use_bias_correction_kl) kl = kl * coef_1;  // DeepSeek-V3.2: unbiased reverse-KL gradient
  }

  torch::Tensor per_token_loss;
  switch (cfg.loss_type) {
    // CISPO, MiniMax-M1, arXiv:2506.13585, Eq. 4: -sg(min(ratio, eps_max)) * A * log pi; the
    // clipped ratio only weights the REINFORCE gradient, so no token's gradient is dropped.
    case PolicyLossType::kCispo:
      per_token_loss = -torch::clamp_max(coef_1, eps_high).detach() * adv * logps;
      break;
    // PPO clipped surrogate, Schulman et al. 2017, arXiv:1707.06347, Eq. 7, with DAPO's decoupled
    // eps_low / eps_high (arXiv:2503.14476, Eq. 10) and INTELLECT-2's cap delta on the unclipped ratio.
    // GRPO (arXiv:2402.03300, Eq. 3), BNPO, Dr. GRPO, DAPO and LUSPO share it and differ in aggregation.
    case PolicyLossType::kGrpo:
    case PolicyLossType::kBnpo:
    case PolicyLossType::kDrGrpo:
    case PolicyLossType::kDapo:
    case PolicyLossType::kLuspo: {
      auto coef_2 = torch::clamp(coef_1, 1 - eps_low, 1 + eps_high);
      if (cfg.delta) coef_1 = torch::clamp_max(coef_1, *cfg.delta);  // TRL logs clipping on this too
      per_token_loss = -torch::min(coef_1 * adv, coef_2 * adv);
      break;
    }
    // SAPO, arXiv:2511.20347: a soft gate sigma(tau (ratio - 1)) * 4 / tau replaces the hard clip
    // (slope 1 at ratio 1), tau by the sign of A. TRL builds tau as a float32 tensor; kept.
    case PolicyLossType::kSapo: {
      auto pos = torch::scalar_tensor(cfg.sapo_temperature_pos, adv.options().dtype(torch::kFloat32));
      auto neg = torch::scalar_tensor(cfg.sapo_temperature_neg, adv.options().dtype(torch::kFloat32));
      auto tau = torch::where(adv > 0, pos, neg);
      per_token_loss = -(torch::sigmoid(tau * (coef_1 - 1)) * 4 / tau) * adv;
      break;
    }
  }
  if (kl.defined()) per_token_loss = per_token_loss + cfg.beta * kl;  // [B, T] from here when beta > 0

  const auto masked = per_token_loss * mask;  // [B, T]
  PolicyLossOutput out;
  switch (cfg.loss_type) {
    // Per-sequence token mean, then mean over sequences (GRPO's 1/|o_i| length bias).
    case PolicyLossType::kGrpo:
    case PolicyLossType::kSapo:
      out.loss = (masked.sum(/*dim=*/-1) / mask.sum(/*dim=*/-1).clamp_min(1.0)).mean();
      break;
    // Token mean over this batch.
    case PolicyLossType::kBnpo:
      out.loss = masked.sum() / mask.sum().clamp_min(1.0);
      break;
    // Dr. GRPO, arXiv:2503.20783, Eq. 3: a constant normalizer, B * max_completion_length.
    case PolicyLossType::kDrGrpo:
      out.loss = masked.sum() / static_cast<double>(logps.size(0) * cfg.max_completion_length);
      break;
    // DAPO token-level loss (arXiv:2503.14476, Eq. 8): token sum over the tokens of the whole step.
    case PolicyLossType::kDapo:
    case PolicyLossType::kCispo: {
      const double n = n_loss_tokens ? *n_loss_tokens : -1.0;
      out.loss = n_loss_tokens ? masked.sum() / std::max(n, 1.0) : masked.sum() / mask.sum().clamp_min(1.0);
      break;
    }
    // LUSPO: token sum per sequence, mean over sequences (no length normalization).
    case PolicyLossType::kLuspo:
      out.loss = masked.sum(/*dim=*/-1).mean();
      break;
  }

  // Metrics, as TRL logs them.
  torch::NoGradGuard no_grad;
  const auto c1 = coef_1.detach();
  const auto a = adv.detach();
  if (kl.defined()) out.kl = global_masked_mean(kl.detach(), mask);
  out.ratio_mean = global_masked_mean(c1, mask);
  if (cfg.loss_type == PolicyLossType::kCispo) {
    auto clipped = torch::logical_and(c1 > eps_high, a > 0).to(logps.scalar_type());
    out.cispo_clip_ratio = global_masked_mean(clipped, mask);
  } else if (cfg.loss_type != PolicyLossType::kSapo) {
    auto low = torch::logical_and(c1 < 1 - eps_low, a < 0);
    auto high = torch::logical_and(c1 > 1 + eps_high, a > 0);
    auto region = torch::logical_or(low, high).to(logps.scalar_type());
    auto lowf = low.to(logps.scalar_type()), highf = high.to(logps.scalar_type());
    out.clip_ratio_low = global_masked_mean(lowf, mask);
    out.clip_ratio_high = global_masked_mean(highf, mask);
    out.clip_ratio_region = global_masked_mean(region, mask);
    out.clip_ratio_low_min = nan_extreme(masked_seq_mean(lowf, mask), /*max=*/false);
    out.clip_ratio_high_max = nan_extreme(masked_seq_mean(highf, mask), /*max=*/true);
  }
  return out;
}

// ---- PPO

std::pair<torch::Tensor, torch::Tensor> gae(const torch::Tensor& rewards, const torch::Tensor& values,
                                            const torch::Tensor& mask, double gamma, double lam) {
  TORCH_CHECK(rewards.dim() == 2 && values.sizes() == rewards.sizes() && mask.sizes() == rewards.sizes(),
              "gae: rewards, values and mask must all be [B, T]");
  torch::NoGradGuard no_grad;
  const auto m = mask.to(rewards.scalar_type());
  const auto v = values.detach();
  auto advantages = torch::zeros_like(rewards);
  auto next_value = torch::zeros({rewards.size(0)}, rewards.options());
  auto last_gae = torch::zeros({rewards.size(0)}, rewards.options());
  for (int64_t t = rewards.size(1) - 1; t >= 0; --t) {
    auto mt = m.select(1, t), vt = v.select(1, t);
    auto delta = rewards.select(1, t) + gamma * next_value - vt;
    auto gae_t = delta + gamma * lam * last_gae;
    // A masked-out position (e.g. a tool-output token) is skipped: it passes V and A through.
    next_value = vt * mt + (1 - mt) * next_value;
    last_gae = gae_t * mt + (1 - mt) * last_gae;
    advantages.select(1, t).copy_(last_gae);
  }
  return {advantages, advantages + v};
}

std::pair<torch::Tensor, torch::Tensor> value_loss(const torch::Tensor& values,
                                                   const torch::Tensor& old_values,
                                                   const torch::Tensor& returns,
                                                   const torch::Tensor& mask, double cliprange_value) {
  TORCH_CHECK(values.sizes() == old_values.sizes() && values.sizes() == returns.sizes() &&
                  values.sizes() == mask.sizes(),
              "value_loss: values, old_values, returns and mask must have one shape");
  const auto m = mask.to(values.scalar_type());
  auto clipped = torch::max(torch::min(values, old_values + cliprange_value), old_values - cliprange_value);
  auto l1 = (values - returns).square();
  auto l2 = (clipped - returns).square();
  auto loss = 0.5 * masked_mean(torch::max(l1, l2), m);
  auto clipfrac = masked_mean((l2 > l1).to(values.scalar_type()), m).detach();
  return {loss, clipfrac};
}

torch::Tensor masked_whiten(const torch::Tensor& x, const torch::Tensor& mask, bool shift_mean,
                            const BatchSum& batch_sum) {
  TORCH_CHECK(x.sizes() == mask.sizes(), "masked_whiten: x and mask must have one shape");
  const auto m = mask.to(x.scalar_type());
  // Sums over the whole batch: this x alone, or every rank's through batch_sum (as doubles).
  auto over_batch = [&](const torch::Tensor& sums) {  // [k] -> [k], x's dtype and device
    if (!batch_sum) return sums;
    auto local = sums.detach().to(torch::kCPU, torch::kFloat64).contiguous();
    std::vector<double> v(local.data_ptr<double>(), local.data_ptr<double>() + local.numel());
    v = batch_sum(std::move(v));
    TORCH_CHECK(static_cast<int64_t>(v.size()) == sums.numel(), "masked_whiten: batch_sum returned ",
                v.size(), " values for ", sums.numel());
    return torch::tensor(v, torch::kFloat64).to(sums.options());
  };
  const auto first = over_batch(torch::stack({(x * m).sum(), m.sum()}));
  const auto n = first[1];
  TORCH_CHECK(n.item<double>() >= 2, "masked_whiten: needs at least two masked elements");
  auto mean = first[0] / n;
  const auto sq = over_batch(((x - mean).square() * m).sum().unsqueeze(0))[0];
  auto var = sq / n * (n / (n - 1));  // Bessel's correction
  auto white = (x - mean) * torch::rsqrt(var + 1e-8);
  return shift_mean ? white : white + mean;
}

torch::Tensor kl_penalized_rewards(const torch::Tensor& logps, const torch::Tensor& ref_logps,
                                   const torch::Tensor& scores, const torch::Tensor& mask,
                                   double kl_coef, KlEstimator estimator) {
  TORCH_CHECK(logps.dim() == 2 && mask.sizes() == logps.sizes() && scores.dim() == 1 &&
                  scores.size(0) == logps.size(0),
              "kl_penalized_rewards: logps, ref_logps, mask [B, T] and scores [B]");
  torch::NoGradGuard no_grad;
  const auto m = mask.to(logps.scalar_type());
  auto rewards = -kl_coef * per_token_kl(logps.detach(), ref_logps.detach(), estimator) * m;
  const auto T = logps.size(1);
  auto last = (T - 1) - m.flip({1}).argmax(/*dim=*/1);  // first max = last 1 of the row
  auto score = (scores.to(rewards.scalar_type()) * (m.sum(/*dim=*/1) > 0)).unsqueeze(1);
  return rewards.scatter_add(1, last.unsqueeze(1), score);
}

}  // namespace mmpost::algo
