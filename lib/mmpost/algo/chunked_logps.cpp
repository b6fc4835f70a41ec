// Chunked LM-head log-probs (see chunked_logps.h). Backward of out_i = z_i[t_i] - lse(z_i):
// d out_i / d z_i = onehot(t_i) - softmax(z_i); then dh = dz W and dW = dz^T h per chunk.
#include "mmpost/algo/chunked_logps.h"

#include "mmpost/algo/ignore_index.h"
#include "mmpost/core/cpu_gemm.h"

namespace mmpost::algo {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct LinearTokenLogps : torch::autograd::Function<LinearTokenLogps> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& hidden,
                               const torch::Tensor& weight, const torch::Tensor& targets,
                               int64_t chunk) {
    const int64_t n = hidden.size(0);
    auto fopts = hidden.options().dtype(torch::kFloat32);
    auto out = torch::empty({n}, fopts);
    auto lse = torch::empty({n}, fopts);
    for (int64_t s = 0; s < n; s += chunk) {
      const int64_t len = std::min(chunk, n - s);
      auto z = mmpost::gemm_linear(hidden.narrow(0, s, len), weight).to(torch::kFloat32);
      auto l = z.logsumexp(/*dim=*/-1);
      auto picked = z.gather(/*dim=*/-1, targets.narrow(0, s, len).unsqueeze(-1)).squeeze(-1);
      out.narrow(0, s, len).copy_(picked - l);
      lse.narrow(0, s, len).copy_(l);
    }
    ctx->save_for_backward({hidden, weight, targets, lse});
    ctx->saved_data["chunk"] = chunk;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    auto saved = ctx->get_saved_variables();
    const auto &hidden = saved[0], &weight = saved[1], &targets = saved[2], &lse = saved[3];
    const int64_t chunk = ctx->saved_data["chunk"].toInt();
    const int64_t n = hidden.size(0);
    auto g = grad_out[0].to(torch::kFloat32);
    const bool want_h = ctx->needs_input_grad(0), want_w = ctx->needs_input_grad(1);
    torch::Tensor grad_h = want_h ? torch::empty_like(hidden) : torch::Tensor();
    torch::Tensor grad_w = want_w ? torch::zeros(weight.sizes(), weight.options().dtype(torch::kFloat32))
                                  : torch::Tensor();
    for (int64_t s = 0; s < n; s += chunk) {
      const int64_t len = std::min(chunk, n - s);
      auto h = hidden.narrow(0, s, len);
      auto z = mmpost::gemm_linear(h, weight);  // the forward's matmul dtype
      const auto compute = z.scalar_type();
      auto gs = g.narrow(0, s, len).unsqueeze(-1);                                   // [len, 1]
      auto dz = (z.to(torch::kFloat32) - lse.narrow(0, s, len).unsqueeze(-1)).exp_();  // softmax
      dz.mul_(-gs).scatter_add_(/*dim=*/-1, targets.narrow(0, s, len).unsqueeze(-1), gs);
      auto dzc = dz.to(compute);
      if (want_h) grad_h.narrow(0, s, len).copy_(mmpost::gemm_mm(dzc, weight.to(compute)));
      if (want_w) grad_w.add_(mmpost::gemm_mm(dzc.t(), h.to(compute)).to(torch::kFloat32));
    }
    return {grad_h, want_w ? grad_w.to(weight.scalar_type()) : torch::Tensor(), torch::Tensor(),
            torch::Tensor()};
  }
};

}  // namespace

torch::Tensor linear_token_logps(const torch::Tensor& hidden, const torch::Tensor& weight,
                                 const torch::Tensor& targets, int64_t chunk_rows) {
  TORCH_CHECK(hidden.dim() == 2 && weight.dim() == 2 && hidden.size(1) == weight.size(1),
              "linear_token_logps: expected hidden [N, C] and weight [V, C], got ",
              hidden.sizes(), " and ", weight.sizes());
  TORCH_CHECK(targets.dim() == 1 && targets.size(0) == hidden.size(0),
              "linear_token_logps: targets must be [N]");
  TORCH_CHECK(chunk_rows >= 1, "linear_token_logps: chunk_rows must be >= 1");
  return LinearTokenLogps::apply(hidden, weight, targets, chunk_rows);
}

int64_t logits_chunk_rows(int64_t setting, int64_t vocab_size, int64_t budget_bytes) {
  if (setting > 0) return setting;
  return std::max<int64_t>(1, budget_bytes / (4 * std::max<int64_t>(1, vocab_size)));
}

torch::Tensor sft_loss_sum_from_hidden(const torch::Tensor& hidden, const torch::Tensor& weight,
                                       const torch::Tensor& labels, int64_t chunk_rows) {
  TORCH_CHECK(hidden.dim() == 3 && labels.dim() == 2 && hidden.size(0) == labels.size(0) &&
                  hidden.size(1) == labels.size(1),
              "sft_loss_sum_from_hidden: expected hidden [B, T, C] and labels [B, T]");
  const int64_t t = hidden.size(1);
  auto h = hidden.narrow(1, 0, t - 1).reshape({-1, hidden.size(2)});
  auto lb = labels.narrow(1, 1, t - 1).reshape({-1});
  auto idx = lb.ne(kIgnoreIndex).nonzero().squeeze(-1);
  if (idx.numel() == 0) return (h.sum() * 0).to(torch::kFloat32);  // keeps the graph connected
  auto logps = linear_token_logps(h.index_select(0, idx), weight, lb.index_select(0, idx), chunk_rows);
  return -logps.sum();
}

TokenStats token_stats_from_hidden(const torch::Tensor& hidden, const torch::Tensor& weight,
                                   const torch::Tensor& labels, int64_t chunk_rows) {
  TORCH_CHECK(hidden.dim() == 3 && labels.dim() == 2 && hidden.size(0) == labels.size(0) &&
                  hidden.size(1) == labels.size(1),
              "token_stats_from_hidden: expected hidden [R, T, C] and labels [R, T]");
  const int64_t R = hidden.size(0), t = hidden.size(1);
  auto h = hidden.narrow(1, 0, t - 1).reshape({-1, hidden.size(2)});
  auto lb = labels.narrow(1, 1, t - 1);
  TokenStats s;
  s.mask = lb.ne(kIgnoreIndex);
  auto flat = lb.reshape({-1});
  auto idx = s.mask.reshape({-1}).nonzero().squeeze(-1);
  auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(hidden.device());
  auto logps = torch::zeros({R * (t - 1)}, f32);
  auto logits_sum = torch::zeros({R * (t - 1)}, f32);
  if (idx.numel() > 0) {
    auto hs = h.index_select(0, idx);
    logps = logps.index_put({idx}, linear_token_logps(hs, weight, flat.index_select(0, idx),
                                                      chunk_rows));
    torch::NoGradGuard no_grad;
    logits_sum.index_put_({idx}, torch::mv(hs.to(torch::kFloat32),
                                           weight.to(torch::kFloat32).sum(/*dim=*/0)));
  }
  s.logps = logps.view({R, t - 1});
  s.logits_sum = logits_sum.view({R, t - 1}).sum(/*dim=*/1);
  return s;
}

double mean_entropy_from_hidden(const torch::Tensor& hidden, const torch::Tensor& weight,
                                const torch::Tensor& mask, int64_t chunk_rows) {
  TORCH_CHECK(hidden.dim() == 3 && mask.dim() == 2 && hidden.size(0) == mask.size(0) &&
                  hidden.size(1) == mask.size(1) && chunk_rows >= 1,
              "mean_entropy_from_hidden: expected hidden [R, T, C], mask [R, T], chunk_rows >= 1");
  torch::NoGradGuard no_grad;
  auto idx = mask.reshape({-1}).ne(0).nonzero().squeeze(-1);
  const int64_t n = idx.numel();
  if (n == 0) return 0.0;
  auto h = hidden.reshape({-1, hidden.size(2)}).index_select(0, idx);
  double total = 0;
  for (int64_t i = 0; i < n; i += chunk_rows) {
    auto z = mmpost::gemm_linear(h.narrow(0, i, std::min(chunk_rows, n - i)), weight)
                 .to(torch::kFloat32);  // [c, V]
    auto lp = torch::log_softmax(z, -1);
    total += (-(lp.exp() * lp).sum()).item<double>();
  }
  return total / static_cast<double>(n);
}

}  // namespace mmpost::algo
