// Per-token KL estimators between the policy and the reference model, from log-probs of the
// sampled tokens (k1/k2/k3/abs, Schulman's "Approximating KL divergence", 2020) or from the full
// logits of both models (`full`). Names follow verl's `kl_penalty` (core_algos.py); `k3` is the
// estimator TRL's GRPOTrainer adds to its loss.
#pragma once

#include <string>

#include <torch/torch.h>

namespace mmpost::algo {

/// One estimator of KL(pi || ref) per sampled token y ~ pi, with log r = ref_logp - logp.
enum class KlEstimator {
  kK1,        // "k1" (verl alias "kl"): logp - ref_logp; unbiased, can be negative
  kK2,        // "k2" (verl alias "mse"): 0.5 (logp - ref_logp)^2
  kK3,        // "k3": exp(log r) - log r - 1 >= 0, unclamped (TRL GRPOTrainer's per_token_kl)
  kLowVarKl,  // "low_var_kl": k3 with verl's clamps: log r to [-20, 20], result to [-10, 10]
  kAbs,       // "abs": |logp - ref_logp|
  kFull,      // "full": exact sum_v p_v (log p_v - log ref_v) from full logits (full_kl)
};

/// "k1"/"kl", "k2"/"mse", "k3", "low_var_kl", "abs", "full". Throws Error(kUsage) listing them.
KlEstimator parse_kl_estimator(const std::string& name);
std::string to_string(KlEstimator estimator);
/// All valid names (aliases included), comma-separated.
std::string kl_estimator_names();

/// Per-token KL estimate from the log-probs of the sampled tokens: logps, ref_logps [B, T] (same
/// shape and float dtype; padding positions give finite garbage, mask them). Returns [B, T] in
/// that dtype; differentiable in both inputs. TORCH_CHECK for kFull (use full_kl) and shapes.
///
/// verl (kl_penalty) treats "k3" and "low_var_kl" alike and clamps both; mmpost keeps `k3`
/// unclamped so the GRPO loss matches TRL, and `low_var_kl` clamped as verl does. The clamps
/// only act when |ref_logp - logp| > 20 or the estimate exceeds 10 (and then stop its gradient).
torch::Tensor per_token_kl(const torch::Tensor& logps, const torch::Tensor& ref_logps,
                           KlEstimator estimator);

/// Exact per-position KL(pi || ref) = sum_v softmax(z)_v (log_softmax(z)_v - log_softmax(z_ref)_v)
/// from logits [B, T, V] of the policy (z) and the reference (z_ref), any float dtype. Returns
/// float32 [B, T].
///
/// Memory: the float32 log-softmaxes are built `chunk_rows` positions (of B*T) at a time and
/// never for the whole [B, T, V]; the backward pass recomputes them per chunk instead of saving
/// them (a custom autograd function), so the only [B, T, V] tensors alive are the caller's logits
/// and the gradient. The gradient flows to the policy logits only (dKL/dz_v = p_v (log p_v -
/// log ref_v - KL)); the reference is treated as a constant.
torch::Tensor full_kl(const torch::Tensor& logits, const torch::Tensor& ref_logits,
                      int64_t chunk_rows = 1024);

}  // namespace mmpost::algo
