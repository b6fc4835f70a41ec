// RMSNorm as one fused kernel per direction on the CPU (float32): the forward reads each row once
// for its mean square and once to write y = weight * (x * rstd), keeping only rstd [N]; the
// backward reads x, dy and rstd once per row for dx and accumulates dweight per thread. The
// composite form HF writes (pow, mean, add, rsqrt, mul, mul, and their backward nodes) makes ~6
// passes and ~12 kernel launches each way, which dominates small and medium Llama layers on a CPU.
// Numerics: transformers' LlamaRMSNorm (Zhang & Sennrich 2019, "Root Mean Square Layer
// Normalization", eq. 4) in float32; sums are accumulated in float32 in a different order than
// ATen's reductions, so results agree to float32 rounding (tests/unit/test_fused_rms_norm.cpp).
#pragma once

#include <torch/torch.h>

namespace mmpost::model {

/// y = weight * (x * rsqrt(mean(x^2, -1) + eps)). x [..., C], weight [C]. The fused kernel runs
/// when x and weight are float32 CPU tensors (x need not be contiguous; it is made so); any
/// other dtype or device takes the composite HF form (float32 statistics, cast back to x's
/// dtype, then weight's promotion), so CUDA and bf16 keep their existing path. Gradients flow to
/// x and weight (first order only). A weight whose length is not x's last dimension takes the
/// composite path, which throws c10::Error when the shapes do not broadcast.
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);

/// The composite form above (transformers' LlamaRMSNorm line by line), for every dtype and
/// device; the reference the fused kernel is tested against.
torch::Tensor rms_norm_composite(const torch::Tensor& x, const torch::Tensor& weight, double eps);

}  // namespace mmpost::model
