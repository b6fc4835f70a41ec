// CLIP vision transformer (HF CLIPVisionModel): conv patch embedding + class token + learned
// positions, pre_layrnorm, pre-LN encoder layers. Module names match the hub checkpoint layout
// (`vision_model.embeddings.patch_embedding.weight`, `vision_model.encoder.layers.N.mlp.fc1.*`).
#pragma once

#include "mmpost/model/blocks.h"
#include "mmpost/model/config.h"

#include <torch/torch.h>

#include "mmpost/model/lora.h"

namespace mmpost::model {

/// Patch + class + position embeddings (HF CLIPVisionEmbeddings).
class ClipVisionEmbeddingsImpl : public torch::nn::Module {
 public:
  explicit ClipVisionEmbeddingsImpl(const VisionConfig& c);
  /// pixel_values [N, 3, H, W] (H = W = image_size; cast to the weights' dtype) -> [N, 1 + P, C].
  /// Throws mmpost::Error (kData) when the image size does not match the config. The patch
  /// convolution (stride = kernel = patch size) runs as one GEMM over the unfolded patches: the
  /// same sums as HF's Conv2d (tested to 1e-5), and safe inside train.cpu_shards' threads.
  torch::Tensor forward(const torch::Tensor& pixel_values);
  torch::Tensor class_embedding;
  torch::nn::Conv2d patch_embedding{nullptr};  // holds the [C, 3, p, p] weight (hub name)
  torch::nn::Embedding position_embedding{nullptr};

 private:
  int64_t image_size_;
};
TORCH_MODULE(ClipVisionEmbeddings);

/// Bidirectional multi-head attention with biases (HF CLIPAttention): q/k/v/out_proj.
class ClipAttentionImpl : public torch::nn::Module {
 public:
  explicit ClipAttentionImpl(const VisionConfig& c);
  /// x: [N, L, C] -> [N, L, C].
  torch::Tensor forward(const torch::Tensor& x);
  LoraLinear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, out_proj{nullptr};

 private:
  int64_t n_heads_, head_dim_;
};
TORCH_MODULE(ClipAttention);

/// fc2(act(fc1(x))) with biases (HF CLIPMLP). x: [N, L, C] -> [N, L, C].
class ClipMlpImpl : public torch::nn::Module {
 public:
  explicit ClipMlpImpl(const VisionConfig& c);
  torch::Tensor forward(const torch::Tensor& x);
  LoraLinear fc1{nullptr}, fc2{nullptr};

 private:
  Activation act_;
};
TORCH_MODULE(ClipMlp);

/// Pre-LN encoder layer (HF CLIPEncoderLayer): x + attn(ln1(x)), then + fc2(act(fc1(ln2(x)))).
class ClipEncoderLayerImpl : public torch::nn::Module {
 public:
  explicit ClipEncoderLayerImpl(const VisionConfig& c);
  /// x: [N, L, C] -> [N, L, C].
  torch::Tensor forward(const torch::Tensor& x);
  ClipAttention self_attn{nullptr};
  torch::nn::LayerNorm layer_norm1{nullptr}, layer_norm2{nullptr};
  ClipMlp mlp{nullptr};
};
TORCH_MODULE(ClipEncoderLayer);

/// Stack of encoder layers (HF CLIPEncoder): holds `layers`.
class ClipEncoderImpl : public torch::nn::Module {
 public:
  explicit ClipEncoderImpl(const VisionConfig& c);
  torch::nn::ModuleList layers{nullptr};
};
TORCH_MODULE(ClipEncoder);

/// The transformer under `vision_model.` (HF CLIPVisionTransformer of transformers < 5).
class ClipVisionTransformerImpl : public torch::nn::Module {
 public:
  explicit ClipVisionTransformerImpl(const VisionConfig& c);
  /// Hidden state `layer` of HF's `hidden_states` tuple: 0 = embeddings after pre_layrnorm,
  /// i = output of encoder layer i, negative counts from the end (-1 = last layer, without
  /// post_layernorm). Runs only the layers it needs. pixel_values [N, 3, H, W] -> [N, 1 + P, C].
  torch::Tensor forward(const torch::Tensor& pixel_values, int64_t layer = -1);
  ClipVisionEmbeddings embeddings{nullptr};
  torch::nn::LayerNorm pre_layrnorm{nullptr};  // sic: HF's spelling
  ClipEncoder encoder{nullptr};
  torch::nn::LayerNorm post_layernorm{nullptr};  // unused by LLaVA, present in checkpoints
  /// Activation checkpointing of every encoder layer while training (model::checkpointed).
  bool checkpoint_layers = false;
};
TORCH_MODULE(ClipVisionTransformer);

/// HF CLIPVisionModel: holds `vision_model`.
class ClipVisionModelImpl : public torch::nn::Module {
 public:
  explicit ClipVisionModelImpl(const VisionConfig& c);
  /// See ClipVisionTransformerImpl::forward.
  torch::Tensor forward(const torch::Tensor& pixel_values, int64_t layer = -1);
  ClipVisionTransformer vision_model{nullptr};
};
TORCH_MODULE(ClipVisionModel);

}  // namespace mmpost::model
