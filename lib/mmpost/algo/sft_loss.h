// SFT loss: next-token cross-entropy over supervised positions (labels != kIgnoreIndex), the same
// quantity as transformers' ForCausalLMLoss; normalized by a token count the caller passes so
// gradient accumulation averages over all tokens of the optimizer step.
#pragma once

#include <torch/torch.h>

namespace mmpost::algo {

/// Summed (not averaged) cross-entropy of shifted logits [B, T, V] against labels [B, T]
/// (kIgnoreIndex ignored), computed in float32. Returns a 0-d float32 tensor.
torch::Tensor sft_loss_sum(const torch::Tensor& logits, const torch::Tensor& labels);

/// Number of supervised targets after the causal shift (labels[:, 1:] != kIgnoreIndex).
int64_t n_supervised_targets(const torch::Tensor& labels);

/// Mean cross-entropy = sft_loss_sum / n_supervised_targets; throws Error(kData) when no target
/// is supervised (a batch with nothing to learn is an error, never a loss of 0 or NaN).
torch::Tensor sft_loss_mean(const torch::Tensor& logits, const torch::Tensor& labels);

}  // namespace mmpost::algo
