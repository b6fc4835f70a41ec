// Fused CPU rotary embedding, SwiGLU and quick_gelu (see fused_ops.h). The kernels are plain
// loops the compiler vectorizes; CMakeLists.txt builds this file with -fno-trapping-math so the
// selects in exp_approx become vector blends instead of branches.
#include "mmpost/model/fused_ops.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#include "mmpost/core/cpu_clones.h"

namespace mmpost::model {
namespace {

/// e^x in float32: x = n ln2 + r with |r| <= ln2/2, e^r by Cephes' expf polynomial, 2^n built
/// in the exponent bits. Below -87.3 returns 0, above 88.7 +inf, NaN stays NaN. Branch-free so
/// that loops over it vectorize.
inline __attribute__((always_inline)) float exp_approx(float x) {
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round to nearest
  float r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  float nc = n >= -127.0f ? n : -127.0f;  // NaN -> -127, so the conversion below is defined
  nc = nc <= 128.0f ? nc : 128.0f;
  const int32_t bits = (static_cast<int32_t>(nc) + 127) << 23;  // 0 -> 0.0f, 255 -> +inf
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  float e = p * scale;
  e = x < -87.3f ? 0.0f : e;
  e = x > 88.7f ? std::numeric_limits<float>::infinity() : e;
  return e;
}

inline __attribute__((always_inline)) float sigmoid_approx(float x) {
  return 1.0f / (1.0f + exp_approx(-x));
}

// d/dg silu(g) = s (1 + g (1 - s)) with s = sigmoid(g).
MMPOST_CPU_CLONES
void swiglu_bwd_kernel(const float* __restrict dy, const float* __restrict g,
                       const float* __restrict u, float* __restrict dg, float* __restrict du,
                       int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float s = sigmoid_approx(g[i]);
    const float gs = g[i] * s;
    du[i] = dy[i] * gs;
    dg[i] = dy[i] * u[i] * (s + gs * (1.0f - s));
  }
}

MMPOST_CPU_CLONES
void quick_gelu_fwd_kernel(const float* __restrict x, float* __restrict y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * sigmoid_approx(1.702f * x[i]);
}

MMPOST_CPU_CLONES
void quick_gelu_bwd_kernel(const float* __restrict dy, const float* __restrict x,
                           float* __restrict dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float s = sigmoid_approx(1.702f * x[i]);
    dx[i] = dy[i] * (s + 1.702f * x[i] * s * (1.0f - s));
  }
}

/// Rotates the n_heads rows of one position (b, t), each `2 * half` floats, sharing one cos/sin
/// row. Forward: y1 = x1 c1 - x2 s1, y2 = x2 c2 + x1 s2. Transpose (backward): y1 = x1 c1 + x2 s2,
/// y2 = x2 c2 - x1 s1.
MMPOST_CPU_CLONES
void rope_kernel(const float* __restrict x, int64_t x_head_stride, float* __restrict y,
                 int64_t y_head_stride, const float* __restrict c, const float* __restrict s,
                 int64_t n_heads, int64_t half, bool transpose) {
  const float* c1 = c;
  const float* c2 = c + half;
  const float* s1 = s;
  const float* s2 = s + half;
  for (int64_t h = 0; h < n_heads; ++h) {
    const float* x1 = x + h * x_head_stride;
    const float* x2 = x1 + half;
    float* y1 = y + h * y_head_stride;
    float* y2 = y1 + half;
    if (!transpose) {
      for (int64_t j = 0; j < half; ++j) {
        y1[j] = x1[j] * c1[j] - x2[j] * s1[j];
        y2[j] = x2[j] * c2[j] + x1[j] * s2[j];
      }
    } else {
      for (int64_t j = 0; j < half; ++j) {
        y1[j] = x1[j] * c1[j] + x2[j] * s2[j];
        y2[j] = x2[j] * c2[j] - x1[j] * s1[j];
      }
    }
  }
}

/// Elements per parallel chunk of the element-wise kernels (small tensors stay on one thread).
constexpr int64_t kGrain = int64_t{1} << 15;

/// Runs `rope_kernel` over x [B, H, T, D] (stride(3) == 1) into y (same shape, stride(3) == 1);
/// c and s are [B or 1, T, D] contiguous.
void rope_apply(const torch::Tensor& x, torch::Tensor& y, const torch::Tensor& c,
                const torch::Tensor& s, bool transpose) {
  const int64_t B = x.size(0), H = x.size(1), T = x.size(2), D = x.size(3);
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const float* cp = c.data_ptr<float>();
  const float* sp = s.data_ptr<float>();
  const int64_t cb = c.size(0) == 1 ? 0 : T * D;
  const int64_t grain = std::max<int64_t>(1, kGrain / std::max<int64_t>(1, H * D));
  at::parallel_for(0, B * T, grain, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t b = p / T, t = p % T;
      rope_kernel(xp + b * x.stride(0) + t * x.stride(2), x.stride(1),
                  yp + b * y.stride(0) + t * y.stride(2), y.stride(1), cp + b * cb + t * D,
                  sp + b * cb + t * D, H, D / 2, transpose);
    }
  });
}

/// x's layout when it is dense with a unit last stride (as q/k from a projection + transpose),
/// else a contiguous copy; the output of empty_like keeps the layout of a dense input.
torch::Tensor unit_last_stride(const torch::Tensor& x) {
  return x.stride(-1) == 1 && x.is_non_overlapping_and_dense() ? x : x.contiguous();
}

class FusedRope : public torch::autograd::Function<FusedRope> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x_in,
                               const torch::Tensor& cos, const torch::Tensor& sin) {
    auto x = unit_last_stride(x_in);
    auto y = torch::empty_like(x);
    rope_apply(x, y, cos, sin, /*transpose=*/false);
    ctx->save_for_backward({cos, sin});
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    auto dy = unit_last_stride(grads[0]);
    auto dx = torch::empty_like(dy);
    rope_apply(dy, dx, saved[0], saved[1], /*transpose=*/true);
    return {dx, torch::Tensor(), torch::Tensor()};
  }
};

class FusedSwiGlu : public torch::autograd::Function<FusedSwiGlu> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& gate_in,
                               const torch::Tensor& up_in) {
    // The forward is ATen's own silu times up, so logits stay bit-identical to transformers'
    // LlamaMLP (a fused forward with this file's exp moved SmolLM2-135M's logits by 1.4e-4, past
    // the 1e-4 parity bound). Only the backward is fused: it saves gate and up, not silu(gate).
    auto g = gate_in.contiguous();
    auto u = up_in.contiguous();
    auto y = torch::silu(g).mul_(u);
    ctx->save_for_backward({g, u});
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto& g = saved[0];
    const auto& u = saved[1];
    auto dy = grads[0].contiguous();
    auto dg = torch::empty_like(g);
    auto du = torch::empty_like(u);
    const float* dyp = dy.data_ptr<float>();
    const float* gp = g.data_ptr<float>();
    const float* up = u.data_ptr<float>();
    float* dgp = dg.data_ptr<float>();
    float* dup = du.data_ptr<float>();
    at::parallel_for(0, g.numel(), kGrain, [&](int64_t i0, int64_t i1) {
      swiglu_bwd_kernel(dyp + i0, gp + i0, up + i0, dgp + i0, dup + i0, i1 - i0);
    });
    return {dg, du};
  }
};

class FusedQuickGelu : public torch::autograd::Function<FusedQuickGelu> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x_in) {
    auto x = x_in.contiguous();
    auto y = torch::empty_like(x);
    const float* xp = x.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    at::parallel_for(0, x.numel(), kGrain, [&](int64_t i0, int64_t i1) {
      quick_gelu_fwd_kernel(xp + i0, yp + i0, i1 - i0);
    });
    ctx->save_for_backward({x});
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto x = ctx->get_saved_variables()[0];
    auto dy = grads[0].contiguous();
    auto dx = torch::empty_like(x);
    const float* dyp = dy.data_ptr<float>();
    const float* xp = x.data_ptr<float>();
    float* dxp = dx.data_ptr<float>();
    at::parallel_for(0, x.numel(), kGrain, [&](int64_t i0, int64_t i1) {
      quick_gelu_bwd_kernel(dyp + i0, xp + i0, dxp + i0, i1 - i0);
    });
    return {dx};
  }
};

bool cpu_float(const torch::Tensor& t) {
  return t.device().is_cpu() && t.scalar_type() == torch::kFloat32;
}

}  // namespace

torch::Tensor apply_rope_composite(const torch::Tensor& x, const torch::Tensor& cos,
                                   const torch::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  auto x1 = x.narrow(/*dim=*/-1, /*start=*/0, half);
  auto x2 = x.narrow(/*dim=*/-1, /*start=*/half, half);
  auto rotated = torch::cat({-x2, x1}, /*dim=*/-1);
  return x * cos.unsqueeze(1) + rotated * sin.unsqueeze(1);
}

torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& cos,
                         const torch::Tensor& sin) {
  const bool fused = cpu_float(x) && cpu_float(cos) && cpu_float(sin) && x.dim() == 4 &&
                     cos.dim() == 3 && sin.sizes() == cos.sizes() && x.size(-1) % 2 == 0 &&
                     (cos.size(0) == x.size(0) || cos.size(0) == 1) && cos.size(1) == x.size(2) &&
                     cos.size(2) == x.size(3) && cos.is_contiguous() && sin.is_contiguous() &&
                     !cos.requires_grad() && !sin.requires_grad() && x.numel() > 0;
  if (!fused) return apply_rope_composite(x, cos, sin);
  return FusedRope::apply(x, cos, sin);
}

torch::Tensor swiglu(const torch::Tensor& gate, const torch::Tensor& up) {
  const bool fused = cpu_float(gate) && cpu_float(up) && gate.sizes() == up.sizes();
  if (!fused) return torch::silu(gate) * up;
  return FusedSwiGlu::apply(gate, up);
}

torch::Tensor quick_gelu(const torch::Tensor& x) {
  if (!cpu_float(x)) return x * torch::sigmoid(1.702 * x);
  return FusedQuickGelu::apply(x);
}

}  // namespace mmpost::model
