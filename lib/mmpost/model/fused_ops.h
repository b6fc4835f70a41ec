// Fused CPU kernels for the element-wise parts of a transformer layer that ATen runs as chains of
// small kernels: rotary embedding (HF apply_rotary_pos_emb), the SwiGLU product silu(gate) * up
// (LlamaMLP) and CLIP's quick_gelu. Each is one pass forward (SwiGLU: ATen's own forward, see
// swiglu) and one pass backward over float32 CPU tensors, compiled for AVX-512, AVX2 and baseline
// x86-64 with the best chosen at load time (GCC target_clones); any other dtype, device or layout
// takes the composite ATen form, so CUDA and bf16 keep their existing path. The exp inside the sigmoids is a Cephes-style polynomial
// (relative error < 3e-7 against double precision, NaN in -> NaN out), not ATen's Sleef exp, so
// results agree with the composite forms to float32 rounding (tests/unit/test_fused_ops.cpp).
#pragma once

#include <torch/torch.h>

namespace mmpost::model {

/// Rotary position embedding, transformers' apply_rotary_pos_emb for one tensor:
/// x * cos + rotate_half(x) * sin with rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2]).
/// x [B, H, T, D] (any strides; the last dimension is made contiguous), cos and sin [B, T, D] or
/// [1, T, D] without gradient. Returns [B, H, T, D] laid out like x. Gradients flow to x only;
/// cos or sin that require grad, or any non-float32 / non-CPU input, take the composite form
/// (apply_rope_composite). Throws c10::Error when the shapes do not match.
torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

/// The composite form of apply_rope (HF line by line, any dtype and device, gradients to all
/// inputs); the reference the fused kernel is tested against.
torch::Tensor apply_rope_composite(const torch::Tensor& x, const torch::Tensor& cos,
                                   const torch::Tensor& sin);

/// silu(gate) * up, the SwiGLU product of LlamaMLP / Qwen2MLP (Shazeer 2020, "GLU Variants
/// Improve Transformer", eq. 6 with Swish_1). gate and up of the same shape [..., I]. The forward
/// is ATen's silu(gate) * up, bit-identical to transformers; the fused part is the backward, which
/// keeps only gate and up (the sigmoid is recomputed) and runs in one pass. Gradients to both.
torch::Tensor swiglu(const torch::Tensor& gate, const torch::Tensor& up);

/// x * sigmoid(1.702 x), HF's QuickGELUActivation (CLIP). Any shape; gradient to x.
torch::Tensor quick_gelu(const torch::Tensor& x);

}  // namespace mmpost::model
