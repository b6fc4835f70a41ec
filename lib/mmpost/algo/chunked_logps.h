// Token log-probabilities and the SFT loss straight from hidden states through the LM head, a
// chunk of rows at a time, so the [B, T, V] float32 logits are never materialised whole: at most
// [chunk_rows, V] exist at once, in the forward and in the backward, which recomputes each
// chunk's logits instead of keeping them (the technique of Liger-Kernel's fused linear
// cross-entropy and torchtune's chunked output loss; Wijmans et al. 2024, "Cut Your Losses in
// Large-Vocabulary Language Models", arXiv:2411.09009, without the custom kernel).
#pragma once

#include <torch/torch.h>

#include "mmpost/algo/logprobs.h"

namespace mmpost::algo {

/// log p(targets[i] | hidden[i]) = z_i[t_i] - logsumexp(z_i) with z_i = linear(hidden[i], weight)
/// upcast to float32 (as VlmImpl::logits + selective_log_softmax; under autocast the matmul runs
/// in the autocast dtype, as it does there). hidden [N, C] (any float dtype), weight [V, C] (the
/// LM head), targets [N] int64 in [0, V). Returns float32 [N]; gradients flow to hidden and
/// weight. chunk_rows >= 1 rows are projected at a time.
torch::Tensor linear_token_logps(const torch::Tensor& hidden, const torch::Tensor& weight,
                                 const torch::Tensor& targets, int64_t chunk_rows);

/// Rows per chunk so that one chunk's float32 logits stay within `budget_bytes`:
/// max(1, budget_bytes / (4 * vocab_size)). For `setting` > 0 returns `setting`.
int64_t logits_chunk_rows(int64_t setting, int64_t vocab_size,
                          int64_t budget_bytes = int64_t{128} << 20);

/// Summed next-token cross-entropy from final hidden states [B, T, C] and labels [B, T]
/// (unshifted, kIgnoreIndex = ignored): only the supervised positions go through the head, in
/// chunks of `chunk_rows`. Equals sft_loss_sum(linear(hidden, weight), labels) to float
/// rounding, with the same gradients. Returns a 0-d float32 tensor (0 when nothing is
/// supervised).
torch::Tensor sft_loss_sum_from_hidden(const torch::Tensor& hidden, const torch::Tensor& weight,
                                       const torch::Tensor& labels, int64_t chunk_rows);

/// TokenStats (logprobs.h) from final hidden states [R, T, C] and labels [R, T] (unshifted,
/// kIgnoreIndex = ignored) through the LM head `weight` [V, C] without bias, only the supervised
/// positions, `chunk_rows` at a time: logps [R, T-1] (0 where ignored, gradients to hidden and
/// weight), mask [R, T-1], logits_sum [R] (metric only, no gradient: sum_v z_v = h . sum_v W_v).
/// Equals token_stats(linear(hidden, weight), labels) to float rounding. WPO's log_sum_sq is
/// not computed (left undefined).
TokenStats token_stats_from_hidden(const torch::Tensor& hidden, const torch::Tensor& weight,
                                   const torch::Tensor& labels, int64_t chunk_rows);

/// Mean entropy -sum_v p_v log p_v of softmax(linear(hidden, weight)) over the positions where
/// mask [R, T] is set; hidden [R, T, C], weight [V, C]; chunk_rows positions at a time, so at
/// most [chunk_rows, V] float32 logits exist. No gradient. Returns 0 for an empty mask. Equals
/// mean_entropy (train/rollout.h) on whole logits to float rounding.
double mean_entropy_from_hidden(const torch::Tensor& hidden, const torch::Tensor& weight,
                                const torch::Tensor& mask, int64_t chunk_rows);

}  // namespace mmpost::algo
