// Preference-optimization losses on per-sequence log-probs: TRL's DPOTrainer loss types (TRL
// 1.16.0, DPOTrainer._compute_loss) plus the reference-free SimPO (CPOTrainer.cpo_loss) and ORPO
// (ORPOTrainer.odds_ratio_loss). Pure functions of tensors: the stage driver sums token log-probs
// (algo::sequence_logps), this file turns them into per-pair losses and the logged rewards.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "mmpost/algo/logprobs.h"

namespace mmpost::algo {

/// One preference loss; names (parse/to_string) are TRL's `loss_type` strings.
enum class DpoLossType {
  kSigmoid, kHinge, kIpo, kExoPair, kNcaPair, kRobust, kBcoPair, kSppoHard, kAot, kAotUnpaired,
  kApoZero, kApoDown, kDiscopop, kSft, kSigmoidNorm,
  kSimpo, kOrpo,  // reference-free (TRL: CPOTrainer loss_type="simpo", ORPOTrainer)
};

/// "sigmoid" -> kSigmoid, ... Throws Error(kUsage) listing the valid names.
DpoLossType parse_dpo_loss_type(const std::string& name);
std::string to_string(DpoLossType type);
/// All valid names, comma-separated, in enum order (for errors and --help).
std::string dpo_loss_type_names();
/// SimPO and ORPO take no reference model.
bool is_reference_free(DpoLossType type);

/// Per-sequence quantities of one model on a preference batch; all [B], same float dtype.
/// `chosen`/`rejected` are summed log-probs over the completion tokens (no length normalization,
/// no LD-DPO weighting: dpo_loss applies those). Optional fields are undefined tensors when unused.
struct PreferenceLogps {
  torch::Tensor chosen, rejected;
  /// Completion token counts (needed by ipo, sigmoid_norm, sft, simpo, orpo, WPO, LD-DPO).
  torch::Tensor n_chosen, n_rejected;
  /// LD-DPO (ld_alpha): summed log-probs of the tokens past min(n_chosen, n_rejected).
  torch::Tensor chosen_tail, rejected_tail;
  /// WPO (use_weighting, policy only): sum over completion tokens of log sum_v p_v^2.
  torch::Tensor chosen_log_sum_sq, rejected_log_sum_sq;
};

/// Loss settings; names and defaults follow TRL's DPOConfig / CPOConfig.
struct DpoLossConfig {
  double beta = 0.1;                  // DPO temperature; IPO's tau; SimPO's beta; ORPO's lambda
  double label_smoothing = 0.0;       // read by exo_pair (epsilon > 0), robust, aot, aot_unpaired, simpo
  std::vector<DpoLossType> loss_types{DpoLossType::kSigmoid};
  std::vector<double> loss_weights;   // empty = 1 for each loss type, else one per loss type
  double simpo_gamma = 0.5;           // SimPO target reward margin gamma
  double discopop_tau = 0.05;         // DiscoPOP mixing temperature
  bool use_weighting = false;         // WPO, Zhou et al. 2024, arXiv:2406.11827, Eq. 2
  std::optional<double> ld_alpha;     // LD-DPO, Liu et al. 2024, arXiv:2409.06411, in [0, 1]
};

struct DpoLossOutput {
  torch::Tensor losses;            // [B] sum_k w_k * loss_k (mean over B = TRL's scalar loss)
  torch::Tensor rewards_chosen;    // [B] beta * (policy - reference) logps, detached
  torch::Tensor rewards_rejected;  // [B] (reference-free types: beta * average policy logps)
};

/// Throws Error(kUsage) for settings TRL rejects: weights of the wrong length, exo_pair without
/// label smoothing, WPO with aot/aot_unpaired, reference-free types mixed with the others or
/// combined with WPO / LD-DPO, ld_alpha outside [0, 1], beta <= 0.
void validate(const DpoLossConfig& cfg);

/// The combined per-pair loss and rewards. `reference` may be null only when every loss type is
/// reference-free. Throws Error(kUsage) as `validate` does, or when a field a loss type needs
/// is missing (TORCH_CHECK for shape mismatches).
DpoLossOutput dpo_loss(const PreferenceLogps& policy, const PreferenceLogps* reference,
                       const DpoLossConfig& cfg);

/// Sums token statistics of a concatenated batch into PreferenceLogps: rows [0, B) of `s` are the
/// chosen completions, rows [B, 2B) the rejected ones (further rows, e.g. mDPO's, are ignored).
/// Fills counts, LD-DPO tails (tokens past min(n_chosen, n_rejected) of each pair) and, when
/// s.log_sum_sq is defined, WPO's sums. All outputs [B] float32.
PreferenceLogps preference_logps(const TokenStats& s, int64_t B);

/// mDPO terms (Wang et al. 2024, arXiv:2406.11839, Eqs. 4-5), per pair [B]:
///   conditional = -log sigmoid(beta * [(pi_c - ref_c) - (pi_c' - ref_c')]) where ' is the chosen
///                 response scored with the corrupted image;
///   anchor      = -log sigmoid(beta * (pi_c - ref_c) - delta).
/// Inputs are summed completion log-probs [B] (policy and reference, true and corrupted image).
struct MdpoLosses {
  torch::Tensor conditional, anchor;
};
MdpoLosses mdpo_loss(const torch::Tensor& policy_chosen, const torch::Tensor& ref_chosen,
                     const torch::Tensor& policy_chosen_corrupted,
                     const torch::Tensor& ref_chosen_corrupted, double beta, double anchor_delta);

}  // namespace mmpost::algo
