// SFT cross-entropy (see sft_loss.h).
#include "mmpost/algo/sft_loss.h"

#include "mmpost/algo/ignore_index.h"
#include "mmpost/algo/logprobs.h"
#include "mmpost/core/check.h"

namespace mmpost::algo {

torch::Tensor sft_loss_sum(const torch::Tensor& logits, const torch::Tensor& labels) {
  auto [lg, lb] = shift_for_causal_lm(logits, labels);
  auto v = lg.size(-1);
  return torch::nn::functional::cross_entropy(
      lg.reshape({-1, v}).to(torch::kFloat32), lb.reshape({-1}),
      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(kIgnoreIndex).reduction(
          torch::kSum));
}

int64_t n_supervised_targets(const torch::Tensor& labels) {
  return labels.narrow(1, 1, labels.size(1) - 1).ne(kIgnoreIndex).sum().item<int64_t>();
}

torch::Tensor sft_loss_mean(const torch::Tensor& logits, const torch::Tensor& labels) {
  int64_t n = n_supervised_targets(labels);
  MMPOST_CHECK_DATA(n > 0, "batch has no supervised token (all labels are -100)",
                    "check the chat template and data.max_length truncation");
  return sft_loss_sum(logits, labels) / static_cast<double>(n);
}

}  // namespace mmpost::algo
