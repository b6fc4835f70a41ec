// Bradley-Terry loss of a scalar reward model on preference pairs (Ouyang et al. 2022,
// arXiv:2203.02155, Eq. 1), with TRL RewardTrainer's optional per-pair margin (Llama 2,
// arXiv:2307.09288, Sec. 3.2.2) and reward-centering term (Eisenstein et al. 2023,
// arXiv:2312.09244). A pure function of tensors, tested against hand-computed values.
#pragma once

#include <torch/torch.h>

namespace mmpost::algo {

/// Scalar outputs of bradley_terry_loss (0-d float32 tensors on the rewards' device).
struct RewardLossOutput {
  torch::Tensor loss;      // differentiable
  torch::Tensor accuracy;  // mean(rewards_chosen > rewards_rejected), no grad
};

/// TRL RewardTrainer.compute_loss (TRL 1.16):
///   loss = mean_i -log sigmoid(r_c[i] - r_r[i] - margin[i])
///        + center_coef * mean_i (r_c[i] + r_r[i])^2
/// rewards_chosen / rewards_rejected [B] (any float dtype; computed in float32); margin [B] or
/// undefined (= 0); center_coef 0 disables the centering term (TRL: center_rewards_coefficient
/// None). TORCH_CHECKs matching shapes.
RewardLossOutput bradley_terry_loss(const torch::Tensor& rewards_chosen,
                                    const torch::Tensor& rewards_rejected,
                                    const torch::Tensor& margin = {}, double center_coef = 0.0);

}  // namespace mmpost::algo
