// Policy-gradient math for `mmpost rlhf`: group advantages (GRPO, RLOO, REINFORCE++), the clipped
// surrogate losses of TRL 1.16's GRPOTrainer._compute_loss (grpo, bnpo, dr_grpo, dapo, cispo, sapo,
// luspo; token or sequence importance sampling; the k3 KL term), and PPO's GAE, clipped value loss,
// whitening and KL-penalized rewards. Pure functions of tensors; tests/golden/test_grpo_golden.cpp
// checks them against numbers TRL's own code computed.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "mmpost/algo/kl.h"

namespace mmpost::algo {

// ---- Advantages. Rewards are [N] = [n_prompts * G], the G completions of one prompt adjacent
// (rows g*G .. g*G+G-1), as TRL lays them out. NaN marks an unscorable completion (every reward
// function returned None in TRL): it is left out of means and stds and gets advantage 0.

/// The advantage estimator of `mmpost rlhf` (recipe key rlhf.algorithm).
enum class RlAlgorithm {
  kGrpo,                 // group-normalized rewards (DeepSeekMath, arXiv:2402.03300, Eq. 3)
  kRloo,                 // leave-one-out baseline (Ahmadian et al., arXiv:2402.14740, Eq. 6)
  kReinforcePp,          // REINFORCE++: discounted token returns, batch-whitened (arXiv:2501.03262)
  kReinforcePpBaseline,  // REINFORCE++ with the group mean as baseline
  kPpo,                  // PPO with GAE on a value head (Schulman et al. 2017; arXiv:1506.02438)
};
/// "grpo" | "rloo" | "reinforce_pp" | "reinforce_pp_baseline" | "ppo". Throws Error(kUsage)
/// naming rlhf.algorithm and listing them.
RlAlgorithm parse_rl_algorithm(const std::string& name);
std::string to_string(RlAlgorithm algorithm);
/// The valid names, "grpo | rloo | ..." (help text).
std::string rl_algorithm_names();

/// GRPO reward scaling; names are TRL's `scale_rewards` strings.
enum class ScaleRewards { kGroup, kBatch, kNone };
/// "group" | "batch" | "none". Throws Error(kUsage) listing them.
ScaleRewards parse_scale_rewards(const std::string& name);
std::string to_string(ScaleRewards scale);

struct GroupAdvantages {
  torch::Tensor advantages;   // [N], rewards' dtype
  torch::Tensor std_rewards;  // [N] the std of each row's group ("batch": the batch std), Bessel-corrected
  torch::Tensor is_std_zero;  // [N] bool, isclose(std_rewards, 0); TRL logs its mean as frac_reward_zero_std
};

/// GRPO, Shao et al. 2024, arXiv:2402.03300, Sec. 4.1.2: A_i = (r_i - mean_group) / (std + eps).
/// As TRL 1.16 GRPOTrainer (multi_objective_aggregation="sum_then_normalize"): the mean is always
/// the group's; "group" divides by the group's unbiased (n-1) std + eps, "batch" by the unbiased
/// std of all N rewards + eps (PPO-Lite, arXiv:2508.08221), "none" does not divide (Dr. GRPO,
/// arXiv:2503.20783). G == 1 gives std 0. One deviation: rows of a group whose scorable rewards are
/// all identical get exactly 0 (TRL gives (r - mean) / (std + eps), which is ~ulp(r)/eps instead of
/// 0 when the float mean rounds). Throws Error(kUsage) unless G >= 1 divides N.
GroupAdvantages grpo_advantages(const torch::Tensor& rewards, int64_t G,
                                ScaleRewards scale_rewards = ScaleRewards::kGroup,
                                double eps = 1e-4);

/// RLOO, Ahmadian et al. 2024, arXiv:2402.14740, Eq. 6: A_i = r_i - mean of the other scorable
/// rewards of the group, as TRL 1.16 RLOOTrainer; with `normalize_advantages`, then
/// (A - mean(A)) / (std(A) + 1e-4) over the batch. G == 1 gives 0. std_rewards/is_std_zero as above.
GroupAdvantages rloo_advantages(const torch::Tensor& rewards, int64_t G,
                                bool normalize_advantages = false);

/// Sums a few doubles over every process that holds a shard of the batch (data parallel: an
/// all-reduce; the values come back summed in the same order). An empty BatchSum means the whole
/// batch is in this process. Used by the batch-level statistics below (masked_whiten), so N ranks
/// whiten with the statistics of the union of their rows, as one process with the whole batch.
using BatchSum = std::function<std::vector<double>(std::vector<double>)>;

/// REINFORCE++, Hu 2025, arXiv:2501.03262, Sec. 3 (verl compute_reinforce_plus_plus_outcome_advantage):
/// discounted returns G_t = r_t + gamma G_{t+1} (reset past the mask), whitened over all masked
/// tokens of the batch (masked_whiten, unbiased var, + 1e-8), times the mask; `batch_sum` spans
/// the batch over ranks (see BatchSum).
/// token_rewards, completion_mask [B, T]; returns (advantages [B, T], returns [B, T]).
std::pair<torch::Tensor, torch::Tensor> reinforce_pp_advantages(const torch::Tensor& token_rewards,
                                                                const torch::Tensor& completion_mask,
                                                                double gamma = 1.0,
                                                                const BatchSum& batch_sum = {});

/// REINFORCE++-baseline (same paper; verl compute_reinforce_plus_plus_baseline_outcome_advantage):
/// subtract the group mean from the scalar score (G == 1: no baseline), then whiten over the
/// masked tokens of the batch, so longer completions weigh more in the mean and variance, exactly
/// as verl. A group's rows must all be here; the whitening spans ranks through `batch_sum`.
/// rewards [N], completion_mask [N, T]; returns advantages [N, T] (constant along T).
torch::Tensor reinforce_pp_baseline_advantages(const torch::Tensor& rewards, int64_t G,
                                               const torch::Tensor& completion_mask,
                                               const BatchSum& batch_sum = {});

/// DAPO dynamic sampling, Yu et al. 2025, arXiv:2503.14476, Eq. 11: the row indices (int64 [K],
/// ascending) of the groups whose scorable rewards are not all equal; the rest carry no gradient.
torch::Tensor filter_zero_std_groups(const torch::Tensor& rewards, int64_t G);

// ---- Clipped surrogate loss (TRL 1.16 GRPOTrainer._compute_loss).

/// Names are TRL's `loss_type` strings.
enum class PolicyLossType { kGrpo, kBnpo, kDrGrpo, kDapo, kCispo, kSapo, kLuspo };
PolicyLossType parse_policy_loss_type(const std::string& name);
std::string to_string(PolicyLossType type);
std::string policy_loss_type_names();

/// "token" (PPO/GRPO) or "sequence" (GSPO, Zheng et al. 2025, arXiv:2507.18071, Eq. 7).
enum class ImportanceSamplingLevel { kToken, kSequence };
ImportanceSamplingLevel parse_importance_sampling_level(const std::string& name);
std::string to_string(ImportanceSamplingLevel level);

/// Loss settings; names and defaults follow TRL's GRPOConfig.
struct PolicyLossConfig {
  PolicyLossType loss_type = PolicyLossType::kDapo;
  ImportanceSamplingLevel importance_sampling_level = ImportanceSamplingLevel::kToken;
  double epsilon = 0.2;                 // lower clip: ratio >= 1 - epsilon
  std::optional<double> epsilon_high;   // upper clip 1 + eps_high (cispo: cap eps_high); unset = epsilon
  std::optional<double> delta;          // INTELLECT-2 (arXiv:2505.07291) cap on the unclipped ratio
  double beta = 0.0;                    // KL coefficient; 0 = no reference model
  KlEstimator kl_estimator = KlEstimator::kK3;  // TRL: k3 only; kFull is not accepted here
  bool use_bias_correction_kl = true;   // KL times the ratio (DeepSeek-V3.2, arXiv:2512.02556)
  int64_t max_completion_length = 512;  // dr_grpo's constant normalizer
  double sapo_temperature_pos = 1.0;    // SAPO gate temperature for advantage > 0
  double sapo_temperature_neg = 1.05;   // ... for advantage <= 0
  double epsilon_high_or_default() const { return epsilon_high.value_or(epsilon); }
};

/// Loss and TRL's logged metrics (0-d, detached, this rank only; a metric a loss type does not
/// log is undefined). "Mean" is over masked tokens at token level, over sequences at sequence level.
struct PolicyLossOutput {
  torch::Tensor loss;               // the scalar to minimize (before ÷ gradient_accumulation_steps)
  torch::Tensor kl;                 // TRL "kl": mean per-token KL (times the ratio if corrected); beta > 0
  torch::Tensor clip_ratio_low;     // TRL "clip_ratio/low_mean": ratio < 1 - eps and A < 0
  torch::Tensor clip_ratio_high;    // "clip_ratio/high_mean": ratio > 1 + eps_high and A > 0
  torch::Tensor clip_ratio_region;  // "clip_ratio/region_mean": either
  torch::Tensor clip_ratio_low_min, clip_ratio_high_max;  // min / max over sequences of the per-sequence fractions
  torch::Tensor cispo_clip_ratio;   // cispo: ratio > eps_high and A > 0
  torch::Tensor ratio_mean;         // mean importance ratio (not in TRL; ~1 on policy)
};

/// Throws Error(kUsage) for epsilon < 0, epsilon_high <= 0, beta < 0, dr_grpo without a positive
/// max_completion_length, sapo temperatures <= 0, delta <= 1, or kl_estimator == full.
void validate(const PolicyLossConfig& cfg);

/// logps, old_logps [B, T] per completion token (old_logps = logps.detach() when on policy),
/// advantages [B] or [B, T], completion_mask [B, T] (0/1), ref_logps [B, T] when beta > 0.
/// Aggregation as TRL: grpo/sapo mean over sequences of per-sequence token means; bnpo token mean
/// of this batch; dr_grpo sum / (B * max_completion_length); luspo mean over sequences of token
/// sums; dapo/cispo sum / n_loss_tokens, where n_loss_tokens is the completion tokens of the whole
/// optimizer step across all ranks divided by (world_size * gradient_accumulation_steps) (TRL:
/// num_items_in_batch / num_processes / steps_per_generation), unset = this batch's token count.
/// Throws Error(kUsage) as `validate`, or when beta > 0 without ref_logps.
PolicyLossOutput policy_loss(const torch::Tensor& logps, const torch::Tensor& old_logps,
                             const torch::Tensor& advantages, const torch::Tensor& completion_mask,
                             const PolicyLossConfig& cfg, const torch::Tensor& ref_logps = {},
                             std::optional<double> n_loss_tokens = std::nullopt);

// ---- PPO (TRL's PPOTrainer up to 0.x, verl core_algos).

/// Generalized advantage estimation, Schulman et al. 2016, arXiv:1506.02438, Eq. 16, as verl's
/// compute_gae_advantage_return: reverse scan, delta_t = r_t + gamma V_{t+1} - V_t, A_t = delta_t +
/// gamma lam A_{t+1}, where masked-out positions are skipped (they pass the next value and
/// advantage through). rewards, values, mask [B, T]. Returns (advantages, returns = advantages +
/// values), both [B, T], no gradient, not whitened (verl and TRL then call masked_whiten(advantages)).
std::pair<torch::Tensor, torch::Tensor> gae(const torch::Tensor& rewards, const torch::Tensor& values,
                                            const torch::Tensor& mask, double gamma, double lam);

/// PPO clipped value loss (TRL PPOTrainer, verl compute_value_loss): 0.5 * masked mean of
/// max((v - R)^2, (clip(v, v_old - c, v_old + c) - R)^2). Returns (loss 0-d, clipfrac 0-d detached:
/// masked mean of [clipped loss > unclipped loss]). All inputs [B, T].
std::pair<torch::Tensor, torch::Tensor> value_loss(const torch::Tensor& values,
                                                   const torch::Tensor& old_values,
                                                   const torch::Tensor& returns,
                                                   const torch::Tensor& mask, double cliprange_value);

/// TRL's masked_whiten: (x - mean) * rsqrt(var + 1e-8) over the masked elements, unbiased var;
/// shift_mean = false adds the mean back. With `batch_sum`, mean and var are those of the masked
/// elements of every rank's x (two small all-reduces: counts and sum, then squared deviations);
/// without, the same float ops as TRL on this x alone. Throws (TORCH_CHECK) unless at least two
/// elements are masked in the whole batch. x, mask [B, T] (any equal shapes).
torch::Tensor masked_whiten(const torch::Tensor& x, const torch::Tensor& mask, bool shift_mean = true,
                            const BatchSum& batch_sum = {});

/// TRL PPOTrainer's rewards: -kl_coef * KL per token (estimator of logps vs ref_logps), masked,
/// plus the scalar score [B] at each row's last completion token (the EOS token when the mask
/// includes it; TRL puts it at the first pad position after the last non-pad token, which is the
/// EOS when pad == EOS). Rows without completion tokens get no score. Returns [B, T].
torch::Tensor kl_penalized_rewards(const torch::Tensor& logps, const torch::Tensor& ref_logps,
                                   const torch::Tensor& scores, const torch::Tensor& mask,
                                   double kl_coef, KlEstimator estimator = KlEstimator::kK1);

}  // namespace mmpost::algo
