// Activation checkpointing (Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost"):
// a layer's forward runs without recording its graph, only its input is kept, and the backward
// pass recomputes the layer with the graph on before differentiating it. torch.utils.checkpoint
// with use_reentrant=True does the same; transformers' gradient_checkpointing_enable and
// torchtune's enable_activation_checkpointing wrap each decoder / vision layer this way.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <vector>

namespace mmpost::model {

/// y = fn(x) with only x (not fn's intermediate activations) kept for backward. `params` are the
/// tensors fn reads that need gradients (the layer's parameters); in backward, fn is run again on
/// x with grad mode (and the autocast state of the forward) restored, and the incoming gradient
/// of y is propagated to x and `params`. Random draws in fn (LoRA dropout) repeat
/// exactly: the default generator of x's device is reset to its pre-forward state for the
/// recompute and put back afterwards (torch.utils.checkpoint's preserve_rng_state). x: any shape; returns fn(x). When grad mode is off, or neither x nor any of
/// `params` requires grad, it is just fn(x). Gradients equal the plain forward's (same kernels on
/// the same shapes).
torch::Tensor checkpointed(const std::function<torch::Tensor(const torch::Tensor&)>& fn,
                           const torch::Tensor& x, const std::vector<torch::Tensor>& params);

/// The parameters of `m` that require grad, then the trainable LoRA adapter tensors of its
/// LoraLinear layers (checkpointed's `params` for one layer).
std::vector<torch::Tensor> trainable_parameters(const torch::nn::Module& m);

}  // namespace mmpost::model
