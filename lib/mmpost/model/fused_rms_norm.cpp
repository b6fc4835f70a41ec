// Fused RMSNorm forward/backward on the CPU (see fused_rms_norm.h).
#include "mmpost/model/fused_rms_norm.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace mmpost::model {
namespace {

/// Rows per parallel chunk: about 16k elements, so small inputs stay on one thread.
int64_t row_grain(int64_t cols) { return std::max<int64_t>(1, (int64_t{1} << 14) / cols); }

/// sum_j a[j] * b[j] over n floats with 8 independent accumulators (vectorizable without
/// reassociation flags).
float dot8(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    for (int k = 0; k < 8; ++k) acc[k] += a[j + k] * b[j + k];
  }
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; j < n; ++j) s += a[j] * b[j];
  return s;
}

class FusedRmsNorm : public torch::autograd::Function<FusedRmsNorm> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x_in,
                               const torch::Tensor& weight_in, double eps) {
    auto x = x_in.contiguous();
    auto weight = weight_in.contiguous();
    const int64_t C = x.size(-1), N = x.numel() / std::max<int64_t>(1, C);
    auto y = torch::empty_like(x);
    auto rstd = torch::empty({N}, x.options());
    const float* xp = x.data_ptr<float>();
    const float* wp = weight.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    float* rp = rstd.data_ptr<float>();
    at::parallel_for(0, N, row_grain(C), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const float* xr = xp + r * C;
        float* yr = yp + r * C;
        const float ms = dot8(xr, xr, C) / static_cast<float>(C);
        const float rs = 1.0f / std::sqrt(ms + static_cast<float>(eps));
        rp[r] = rs;
        for (int64_t j = 0; j < C; ++j) yr[j] = wp[j] * (xr[j] * rs);
      }
    });
    ctx->save_for_backward({x, weight, rstd});
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto& x = saved[0];
    const auto& weight = saved[1];
    const auto& rstd = saved[2];
    auto dy = grads[0].contiguous();
    const int64_t C = x.size(-1), N = x.numel() / std::max<int64_t>(1, C);
    const bool want_dx = ctx->needs_input_grad(0), want_dw = ctx->needs_input_grad(1);
    torch::Tensor dx = want_dx ? torch::empty_like(x) : torch::Tensor();
    // dweight: one partial row per block of rows, summed at the end.
    const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), N));
    torch::Tensor partial = want_dw ? torch::zeros({blocks, C}, x.options()) : torch::Tensor();
    const float* xp = x.data_ptr<float>();
    const float* wp = weight.data_ptr<float>();
    const float* rp = rstd.data_ptr<float>();
    const float* gp = dy.data_ptr<float>();
    float* dxp = want_dx ? dx.data_ptr<float>() : nullptr;
    float* pp = want_dw ? partial.data_ptr<float>() : nullptr;
    const float inv_c = 1.0f / static_cast<float>(C);
    at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
      std::vector<float> gw(C);
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t r_begin = b * N / blocks, r_end = (b + 1) * N / blocks;
        for (int64_t r = r_begin; r < r_end; ++r) {
          const float* xr = xp + r * C;
          const float* gr = gp + r * C;
          const float rs = rp[r];
          if (pp != nullptr) {
            float* pr = pp + b * C;
            for (int64_t j = 0; j < C; ++j) pr[j] += gr[j] * (xr[j] * rs);
          }
          if (dxp != nullptr) {
            // dx = rs * (g*w - xhat * mean(g*w*xhat)), xhat = x * rs
            for (int64_t j = 0; j < C; ++j) gw[j] = gr[j] * wp[j];
            const float c = dot8(gw.data(), xr, C) * rs * inv_c;
            float* dr = dxp + r * C;
            for (int64_t j = 0; j < C; ++j) dr[j] = rs * (gw[j] - (xr[j] * rs) * c);
          }
        }
      }
    });
    return {dx, want_dw ? partial.sum(0) : torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor rms_norm_composite(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  auto h = x.to(torch::kFloat32);
  auto variance = h.pow(2).mean(/*dim=*/-1, /*keepdim=*/true);
  h = h * torch::rsqrt(variance + eps);
  return weight * h.to(x.scalar_type());
}

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  const bool fused = x.device().is_cpu() && weight.device().is_cpu() &&
                     x.scalar_type() == torch::kFloat32 &&
                     weight.scalar_type() == torch::kFloat32 && weight.dim() == 1 &&
                     x.dim() >= 1 && x.size(-1) == weight.size(0) && x.numel() > 0;
  if (!fused) return rms_norm_composite(x, weight, eps);
  return FusedRmsNorm::apply(x, weight, eps);
}

}  // namespace mmpost::model
