// KL estimators (see kl.h). The sampled-token estimators are one line each; `full` is a chunked
// custom autograd function so that float32 log-softmaxes of [B, T, V] never exist in full.
#include "mmpost/algo/kl.h"

#include <utility>

#include "mmpost/core/check.h"
#include "mmpost/core/names.h"

namespace mmpost::algo {
namespace {

const std::pair<KlEstimator, const char*> kKlEstimatorNames[] = {
    {KlEstimator::kK1, "k1"},        {KlEstimator::kK1, "kl"},   {KlEstimator::kK2, "k2"},
    {KlEstimator::kK2, "mse"},       {KlEstimator::kK3, "k3"},   {KlEstimator::kLowVarKl, "low_var_kl"},
    {KlEstimator::kAbs, "abs"},      {KlEstimator::kFull, "full"},
};

/// Per-row KL of one chunk of rows: z, zr [n, V] -> (kl [n], log p [n, V], log ref [n, V]), float32.
struct ChunkKl {
  torch::Tensor kl, lp, lr;
};
ChunkKl chunk_kl(const torch::Tensor& z, const torch::Tensor& zr) {
  auto lp = torch::log_softmax(z.to(torch::kFloat32), /*dim=*/-1);
  auto lr = torch::log_softmax(zr.to(torch::kFloat32), /*dim=*/-1);
  auto kl = (lp.exp() * (lp - lr)).sum(/*dim=*/-1);
  return {kl, lp, lr};
}

/// Forward: KL per row, chunked; saves only the caller's logits. Backward recomputes each chunk.
struct FullKlFunction : public torch::autograd::Function<FullKlFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& logits,
                               const torch::Tensor& ref_logits, int64_t chunk_rows) {
    ctx->save_for_backward({logits, ref_logits});
    ctx->saved_data["chunk_rows"] = chunk_rows;
    const auto V = logits.size(-1);
    auto z = logits.reshape({-1, V}), zr = ref_logits.reshape({-1, V});
    auto out = torch::empty({z.size(0)}, logits.options().dtype(torch::kFloat32));
    for (int64_t i = 0; i < z.size(0); i += chunk_rows) {
      const auto n = std::min(chunk_rows, z.size(0) - i);
      out.narrow(0, i, n).copy_(chunk_kl(z.narrow(0, i, n), zr.narrow(0, i, n)).kl);
    }
    return out.view(logits.sizes().slice(0, logits.dim() - 1));
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const auto saved = ctx->get_saved_variables();
    const auto& logits = saved[0];
    const auto chunk_rows = ctx->saved_data["chunk_rows"].toInt();
    const auto V = logits.size(-1);
    auto z = logits.reshape({-1, V}), zr = saved[1].reshape({-1, V});
    auto g = grad_out[0].reshape({-1}).to(torch::kFloat32);
    auto grad = torch::empty_like(z);
    for (int64_t i = 0; i < z.size(0); i += chunk_rows) {
      const auto n = std::min(chunk_rows, z.size(0) - i);
      auto c = chunk_kl(z.narrow(0, i, n), zr.narrow(0, i, n));
      // d/dz_v sum_u p_u (lp_u - lr_u) = p_v (lp_v - lr_v - KL)
      auto gz = c.lp.exp() * (c.lp - c.lr - c.kl.unsqueeze(-1)) * g.narrow(0, i, n).unsqueeze(-1);
      grad.narrow(0, i, n).copy_(gz);
    }
    return {grad.view(logits.sizes()), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

KlEstimator parse_kl_estimator(const std::string& name) {
  return parse_name(kKlEstimatorNames, name, "rlhf.kl_estimator");
}

// The first name of each estimator is the canonical one (name_of returns the first match).
std::string to_string(KlEstimator estimator) { return name_of(kKlEstimatorNames, estimator); }

std::string kl_estimator_names() { return names_of(kKlEstimatorNames); }

torch::Tensor per_token_kl(const torch::Tensor& logps, const torch::Tensor& ref_logps,
                           KlEstimator estimator) {
  TORCH_CHECK(logps.sizes() == ref_logps.sizes(), "per_token_kl: logps ", logps.sizes(),
              " and ref_logps ", ref_logps.sizes(), " differ");
  switch (estimator) {
    // k1: E_pi[log pi/ref] = KL(pi || ref); unbiased, high variance, negative per token at times.
    case KlEstimator::kK1:
      return logps - ref_logps;
    // k2: 0.5 (log r)^2; biased, low variance (Schulman 2020).
    case KlEstimator::kK2:
      return 0.5 * (logps - ref_logps).square();
    // k3: (r - 1) - log r, r = ref/pi; unbiased and >= 0 (Schulman 2020; TRL GRPO, DeepSeekMath Eq. 4).
    case KlEstimator::kK3: {
      auto log_r = ref_logps - logps;
      return torch::exp(log_r) - log_r - 1;
    }
    // verl's low_var_kl: k3 with log r clamped to [-20, 20] and the estimate to [-10, 10].
    case KlEstimator::kLowVarKl: {
      auto log_r = (ref_logps - logps).clamp(-20, 20);
      return (torch::exp(log_r) - log_r - 1).clamp(-10, 10);
    }
    case KlEstimator::kAbs:
      return (logps - ref_logps).abs();
    case KlEstimator::kFull:
      TORCH_CHECK(false, "per_token_kl: the 'full' estimator needs logits; call algo::full_kl");
  }
  TORCH_CHECK(false, "unhandled KlEstimator");
}

torch::Tensor full_kl(const torch::Tensor& logits, const torch::Tensor& ref_logits,
                      int64_t chunk_rows) {
  TORCH_CHECK(logits.dim() >= 2 && logits.sizes() == ref_logits.sizes(),
              "full_kl: logits ", logits.sizes(), " and ref_logits ", ref_logits.sizes(),
              " must both be [..., V]");
  TORCH_CHECK(chunk_rows > 0, "full_kl: chunk_rows must be > 0");
  return FullKlFunction::apply(logits, ref_logits.detach(), chunk_rows);
}

}  // namespace mmpost::algo
