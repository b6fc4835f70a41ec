// Token log-probabilities from logits without materializing a float32 log_softmax of the whole
// [B, T, V] tensor: log p(y) = logit_y - logsumexp(logits), computed per row (TRL's
// selective_log_softmax does the same).
#pragma once

#include <torch/torch.h>

#include "mmpost/algo/ignore_index.h"

namespace mmpost::algo {

/// Causal shift: logits [B, T, V] predict labels [B, T] one step ahead. Returns
/// (shifted_logits [B, T-1, V] view, shifted_labels [B, T-1]).
std::pair<torch::Tensor, torch::Tensor> shift_for_causal_lm(const torch::Tensor& logits,
                                                            const torch::Tensor& labels);

/// log p(labels) under logits: logits [..., V] (any float dtype; reduced in float32 one slice at
/// a time), labels [...] int64 with kIgnoreIndex = ignored (gathers index 0, result 0 there).
/// Returns float32 [...].
torch::Tensor selective_log_softmax(const torch::Tensor& logits, const torch::Tensor& labels);

/// Per-sequence summed log-probs of the supervised tokens: logits [B, T, V], labels [B, T]
/// (unshifted, kIgnoreIndex = ignored). Returns (sum_logps [B], n_tokens [B]) in float32.
std::pair<torch::Tensor, torch::Tensor> sequence_logps(const torch::Tensor& logits,
                                                       const torch::Tensor& labels);

/// Per-token quantities of the supervised tokens of R sequences, after the causal shift.
struct TokenStats {
  torch::Tensor logps;       // [R, T-1] float32 log p(label), 0 where ignored
  torch::Tensor mask;        // [R, T-1] bool, label != kIgnoreIndex
  torch::Tensor log_sum_sq;  // [R, T-1] float32 log sum_v p_v^2 (WPO), 0 where ignored; or undefined
  torch::Tensor logits_sum;  // [R] float32 sum of logits over supervised positions and the vocab
};

/// token_stats(logits [R, T, V], labels [R, T] unshifted, kIgnoreIndex = ignored): one row's
/// float32 log_softmax at a time (never a second [R, T, V] float32 copy). `with_log_sum_sq` adds
/// WPO's log sum_v p_v^2 (TRL DPOTrainer, use_weighting). logits_sum / (n_tokens * V) is TRL's
/// logits/chosen metric.
TokenStats token_stats(const torch::Tensor& logits, const torch::Tensor& labels,
                       bool with_log_sum_sq = false);

}  // namespace mmpost::algo
