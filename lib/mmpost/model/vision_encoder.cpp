// CLIP ViT forward pass (see vision_encoder.h). Parity with transformers' CLIPVisionModel is
// checked by tests/golden/test_llava_golden.cpp through the full LLaVA forward.
#include "mmpost/model/vision_encoder.h"

#include "mmpost/model/activation_checkpoint.h"
#include "mmpost/core/cpu_gemm.h"

#include "mmpost/core/check.h"

namespace mmpost::model {

ClipVisionEmbeddingsImpl::ClipVisionEmbeddingsImpl(const VisionConfig& c)
    : image_size_(c.image_size) {
  class_embedding = register_parameter("class_embedding", torch::randn({c.hidden_size}) * 0.02);
  patch_embedding = register_module(
      "patch_embedding",
      torch::nn::Conv2d(torch::nn::Conv2dOptions(c.num_channels, c.hidden_size, c.patch_size)
                            .stride(c.patch_size)
                            .bias(false)));
  position_embedding =
      register_module("position_embedding", torch::nn::Embedding(c.n_patches() + 1, c.hidden_size));
}

torch::Tensor ClipVisionEmbeddingsImpl::forward(const torch::Tensor& pixel_values) {
  MMPOST_CHECK_DATA(pixel_values.dim() == 4 && pixel_values.size(2) == image_size_ &&
                        pixel_values.size(3) == image_size_,
                    "pixel_values: expected [N, 3, ", image_size_, ", ", image_size_, "], got ",
                    pixel_values.sizes());
  const int64_t N = pixel_values.size(0);
  // The stride-p, p x p convolution as one GEMM over the non-overlapping patches (the same sums
  // as transformers' Conv2d): [N, 3, G*p, G*p] -> [N, G*G, 3*p*p] @ [3*p*p, C]. A plain GEMM also
  // runs safely inside train.cpu_shards' parallel region, where oneDNN's convolution does not.
  const auto& w = patch_embedding->weight;  // [C, 3, p, p]
  const int64_t p = w.size(2), G = image_size_ / p, K = w.size(1) * p * p;
  auto x = pixel_values.to(w.scalar_type());
  if (G * p != image_size_) x = x.narrow(2, 0, G * p).narrow(3, 0, G * p);  // conv drops the rest
  auto cols = x.reshape({N, w.size(1), G, p, G, p}).permute({0, 2, 4, 1, 3, 5}).reshape({N, G * G, K});
  auto patches = mmpost::gemm_linear(cols, w.reshape({w.size(0), K}));                // [N, P, C]
  auto cls = class_embedding.view({1, 1, -1}).expand({N, 1, -1});         // [N, 1, C]
  return torch::cat({cls, patches}, /*dim=*/1) + position_embedding->weight.unsqueeze(0);
}

ClipAttentionImpl::ClipAttentionImpl(const VisionConfig& c)
    : n_heads_(c.num_attention_heads), head_dim_(c.head_dim()) {
  const int64_t C = c.hidden_size;
  q_proj = register_module("q_proj", LoraLinear(C, C));
  k_proj = register_module("k_proj", LoraLinear(C, C));
  v_proj = register_module("v_proj", LoraLinear(C, C));
  out_proj = register_module("out_proj", LoraLinear(C, C));
}

torch::Tensor ClipAttentionImpl::forward(const torch::Tensor& x) {
  const int64_t N = x.size(0), L = x.size(1);
  auto heads = [&](const torch::Tensor& t) {
    return t.view({N, L, n_heads_, head_dim_}).transpose(1, 2);  // [N, H, L, D]
  };
  auto out = at::scaled_dot_product_attention(heads(q_proj(x)), heads(k_proj(x)), heads(v_proj(x)));
  return out_proj(out.transpose(1, 2).reshape({N, L, n_heads_ * head_dim_}));
}

ClipMlpImpl::ClipMlpImpl(const VisionConfig& c) : act_(activation_from_name(c.hidden_act)) {
  fc1 = register_module("fc1", LoraLinear(c.hidden_size, c.intermediate_size));
  fc2 = register_module("fc2", LoraLinear(c.intermediate_size, c.hidden_size));
}

torch::Tensor ClipMlpImpl::forward(const torch::Tensor& x) {
  return fc2(apply_activation(fc1(x), act_));
}

namespace {
torch::nn::LayerNorm layer_norm(const VisionConfig& c) {
  return torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.hidden_size}).eps(c.layer_norm_eps));
}
}  // namespace

ClipEncoderLayerImpl::ClipEncoderLayerImpl(const VisionConfig& c) {
  self_attn = register_module("self_attn", ClipAttention(c));
  layer_norm1 = register_module("layer_norm1", layer_norm(c));
  mlp = register_module("mlp", ClipMlp(c));
  layer_norm2 = register_module("layer_norm2", layer_norm(c));
}

torch::Tensor ClipEncoderLayerImpl::forward(const torch::Tensor& x) {
  auto h = x + self_attn(layer_norm1(x));
  return h + mlp(layer_norm2(h));
}

ClipEncoderImpl::ClipEncoderImpl(const VisionConfig& c) {
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) layers->push_back(ClipEncoderLayer(c));
}

ClipVisionTransformerImpl::ClipVisionTransformerImpl(const VisionConfig& c) {
  embeddings = register_module("embeddings", ClipVisionEmbeddings(c));
  pre_layrnorm = register_module("pre_layrnorm", layer_norm(c));
  encoder = register_module("encoder", ClipEncoder(c));
  post_layernorm = register_module("post_layernorm", layer_norm(c));
}

torch::Tensor ClipVisionTransformerImpl::forward(const torch::Tensor& pixel_values, int64_t layer) {
  auto layers = encoder->layers;
  const int64_t n_layers = static_cast<int64_t>(layers->size());
  const int64_t last = layer < 0 ? n_layers + 1 + layer : layer;
  TORCH_CHECK(last >= 0 && last <= n_layers, "vision layer ", layer, " out of range for ", n_layers,
              " layers");
  auto h = pre_layrnorm(embeddings(pixel_values));
  for (int64_t i = 0; i < last; ++i) {
    auto* l = layers[i]->as<ClipEncoderLayer>();
    if (checkpoint_layers && is_training()) {
      h = checkpointed([l](const torch::Tensor& x) { return l->forward(x); }, h,
                       trainable_parameters(*l));
    } else {
      h = l->forward(h);
    }
  }
  return h;
}

ClipVisionModelImpl::ClipVisionModelImpl(const VisionConfig& c) {
  vision_model = register_module("vision_model", ClipVisionTransformer(c));
}

torch::Tensor ClipVisionModelImpl::forward(const torch::Tensor& pixel_values, int64_t layer) {
  return vision_model(pixel_values, layer);
}

}  // namespace mmpost::model
