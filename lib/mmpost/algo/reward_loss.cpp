// Bradley-Terry reward-model loss (see reward_loss.h).
#include "mmpost/algo/reward_loss.h"

namespace mmpost::algo {

RewardLossOutput bradley_terry_loss(const torch::Tensor& rewards_chosen,
                                    const torch::Tensor& rewards_rejected,
                                    const torch::Tensor& margin, double center_coef) {
  TORCH_CHECK(rewards_chosen.dim() == 1 && rewards_chosen.sizes() == rewards_rejected.sizes(),
              "bradley_terry_loss: rewards must be [B] and match, got ", rewards_chosen.sizes(),
              " and ", rewards_rejected.sizes());
  auto rc = rewards_chosen.to(torch::kFloat32), rr = rewards_rejected.to(torch::kFloat32);
  auto diff = rc - rr;  // [B]
  if (margin.defined()) {
    TORCH_CHECK(margin.sizes() == rewards_chosen.sizes(), "bradley_terry_loss: margin must be [B]");
    diff = diff - margin.to(diff.device(), torch::kFloat32);
  }
  RewardLossOutput out;
  out.loss = -torch::nn::functional::logsigmoid(diff).mean();
  if (center_coef != 0.0) out.loss = out.loss + center_coef * (rc + rr).pow(2).mean();
  torch::NoGradGuard no_grad;
  out.accuracy = (rc > rr).to(torch::kFloat32).mean();  // TRL: ignores the margin
  return out;
}

}  // namespace mmpost::algo
