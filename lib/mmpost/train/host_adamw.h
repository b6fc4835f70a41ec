// The optimizer's host loops for float32 CPU tensors: one-pass AdamW with the clipping
// coefficient applied as the gradient is read, and the gradient sum of squares (see
// optimizer.h, which uses them for every float32 CPU tensor; other tensors take ATen's kernels).
#pragma once

#include <cstdint>
#include <vector>

namespace mmpost::train {

/// One contiguous float32 CPU tensor's AdamW update: its buffers (`numel` floats each) and the
/// hyper-parameters of its group. `step` is the tensor's step count after this update (>= 1).
struct HostAdamWTensor {
  float* param = nullptr;
  const float* grad = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  int64_t numel = 0;
  double lr = 0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  int64_t step = 1;
};

/// AdamW (Loshchilov & Hutter 2019, Alg. 2; torch.optim.AdamW's update, in the evaluation order
/// of its fused CPU kernel) over every tensor of `tensors`, in one pass over each element and
/// one parallel region for the whole list (chunks of 32k elements over the intra-op threads):
///   g' = g * grad_scale;  p <- p * (1 - lr wd);  m <- lerp(m, g', 1 - beta1);
///   v <- beta2 v + (1 - beta2) g'^2;  p <- p - (lr / bc1) m / (sqrt(v) / sqrt(bc2) + eps),
/// bc_i = 1 - beta_i^step in double, every per-element operation in float32. `grad_scale` is the
/// clipping coefficient (1: none): folding it into the read saves the separate pass that scales
/// the gradients in place (torch.nn.utils.clip_grad_norm_), which is why `grad` is const and is
/// left unscaled. Results do not depend on the thread count or the CPU's vector width.
void host_adamw(const std::vector<HostAdamWTensor>& tensors, double grad_scale);

/// sum_i x_i^2 over `n` floats: 32 float32 lanes per block of 4096 elements, blocks and chunks of
/// 64k elements summed in double, chunks spread over the intra-op threads. The result does not
/// depend on the thread count or the CPU's vector width.
double host_sum_squares(const float* x, int64_t n);

}  // namespace mmpost::train
