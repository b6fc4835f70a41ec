// Host loops of the optimizer step (see host_adamw.h). CMakeLists.txt builds this file with
// -ffp-contract=off and -fno-math-errno: every CPU level rounds alike, and sqrt vectorizes.
#include "mmpost/train/host_adamw.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "mmpost/core/cpu_clones.h"

namespace mmpost::train {
namespace {

/// The float32 constants of one tensor's update.
struct AdamWScalars {
  float decay;          // 1 - lr * weight_decay
  float lerp_weight;    // 1 - beta1
  float beta2;
  float one_minus_beta2;
  float bc2_sqrt;       // sqrt(1 - beta2^step)
  float eps;
  float neg_step_size;  // -lr / (1 - beta1^step)
  float grad_scale;
};

AdamWScalars scalars_of(const HostAdamWTensor& t, double grad_scale) {
  const auto step = static_cast<double>(t.step);
  const double bc1 = 1.0 - std::pow(t.beta1, step);
  const double bc2 = 1.0 - std::pow(t.beta2, step);
  return {static_cast<float>(1.0 - t.lr * t.weight_decay),
          static_cast<float>(1.0 - t.beta1),
          static_cast<float>(t.beta2),
          static_cast<float>(1.0 - t.beta2),
          static_cast<float>(std::sqrt(bc2)),
          static_cast<float>(t.eps),
          static_cast<float>(-(t.lr / bc1)),
          static_cast<float>(grad_scale)};
}

/// Elements [0, n) of one tensor. The exp_avg update is torch's lerp: m + w (g - m) for a small
/// weight w < 0.5, g - (g - m)(1 - w) otherwise.
MMPOST_CPU_CLONES
void adamw_kernel(float* __restrict p, const float* __restrict g, float* __restrict m,
                  float* __restrict v, int64_t n, AdamWScalars s) {
  if (s.lerp_weight < 0.5f) {
    for (int64_t i = 0; i < n; ++i) {
      const float gi = g[i] * s.grad_scale;
      const float mi = m[i] + s.lerp_weight * (gi - m[i]);
      const float vi = v[i] * s.beta2 + s.one_minus_beta2 * gi * gi;
      m[i] = mi;
      v[i] = vi;
      const float denom = std::sqrt(vi) / s.bc2_sqrt + s.eps;
      p[i] = p[i] * s.decay + s.neg_step_size * mi / denom;
    }
  } else {
    const float keep = 1.0f - s.lerp_weight;
    for (int64_t i = 0; i < n; ++i) {
      const float gi = g[i] * s.grad_scale;
      const float mi = gi - (gi - m[i]) * keep;
      const float vi = v[i] * s.beta2 + s.one_minus_beta2 * gi * gi;
      m[i] = mi;
      v[i] = vi;
      const float denom = std::sqrt(vi) / s.bc2_sqrt + s.eps;
      p[i] = p[i] * s.decay + s.neg_step_size * mi / denom;
    }
  }
}

/// 16 float32 lanes (GCC vector extension): one zmm, two ymm or four xmm registers, whichever the
/// CPU level has, with the same per-lane arithmetic on every level.
typedef float F32x16 __attribute__((vector_size(64)));

/// sum of squares of one block of <= 4096 floats: two 16-lane float accumulators (element i goes
/// to lane i mod 32), their lanes then summed in double in lane order, the tail in double.
/// Written with explicit vectors: GCC's vectorizer turned the plain 8-accumulator loop into
/// transposing shuffles that made this pass compute-bound.
MMPOST_CPU_CLONES
double block_sum_squares(const float* __restrict x, int64_t n) {
  F32x16 acc0 = {}, acc1 = {};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    F32x16 a, b;
    std::memcpy(&a, x + i, sizeof a);
    std::memcpy(&b, x + i + 16, sizeof b);
    acc0 += a * a;
    acc1 += b * b;
  }
  double block = 0.0;
  for (int k = 0; k < 16; ++k) block += acc0[k];
  for (int k = 0; k < 16; ++k) block += acc1[k];
  for (; i < n; ++i) block += static_cast<double>(x[i]) * x[i];
  return block;
}

constexpr int64_t kAdamChunk = int64_t{1} << 15;
constexpr int64_t kSumChunk = int64_t{1} << 16;

}  // namespace

void host_adamw(const std::vector<HostAdamWTensor>& tensors, double grad_scale) {
  struct Work {
    size_t tensor;
    int64_t begin, end;
  };
  std::vector<Work> work;
  std::vector<AdamWScalars> scalars;
  scalars.reserve(tensors.size());
  for (size_t k = 0; k < tensors.size(); ++k) {
    scalars.push_back(scalars_of(tensors[k], grad_scale));
    for (int64_t b = 0; b < tensors[k].numel; b += kAdamChunk) {
      work.push_back({k, b, std::min(tensors[k].numel, b + kAdamChunk)});
    }
  }
  at::parallel_for(0, static_cast<int64_t>(work.size()), 1, [&](int64_t w0, int64_t w1) {
    for (int64_t w = w0; w < w1; ++w) {
      const Work& it = work[static_cast<size_t>(w)];
      const HostAdamWTensor& t = tensors[it.tensor];
      adamw_kernel(t.param + it.begin, t.grad + it.begin, t.exp_avg + it.begin,
                   t.exp_avg_sq + it.begin, it.end - it.begin, scalars[it.tensor]);
    }
  });
}

double host_sum_squares(const float* x, int64_t n) {
  const int64_t n_chunks = (n + kSumChunk - 1) / kSumChunk;
  std::vector<double> partial(static_cast<size_t>(n_chunks), 0.0);
  at::parallel_for(0, n_chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t end = std::min(n, (c + 1) * kSumChunk);
      double chunk = 0.0;
      for (int64_t b = c * kSumChunk; b < end; b += 4096) {
        chunk += block_sum_squares(x + b, std::min<int64_t>(end - b, 4096));
      }
      partial[static_cast<size_t>(c)] = chunk;
    }
  });
  double total = 0.0;
  for (double v : partial) total += v;
  return total;
}

}  // namespace mmpost::train
