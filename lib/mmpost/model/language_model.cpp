// Llama decoder forward (see language_model.h): rotary tables once per call, one additive
// causal+padding mask per call, then the layers. Matches transformers' LlamaModel numerics.
#include "mmpost/model/language_model.h"

#include "mmpost/model/activation_checkpoint.h"
#include "mmpost/core/cpu_gemm.h"

namespace mmpost::model {

LlamaDecoderLayerImpl::LlamaDecoderLayerImpl(const TextConfig& c) {
  self_attn = register_module(
      "self_attn",
      Attention(c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                c.qkv_bias));
  mlp = register_module("mlp", SwiGluMlp(c.hidden_size, c.intermediate_size,
                                         activation_from_name(c.hidden_act)));
  input_layernorm = register_module("input_layernorm", RmsNorm(c.hidden_size, c.rms_norm_eps));
  post_attention_layernorm =
      register_module("post_attention_layernorm", RmsNorm(c.hidden_size, c.rms_norm_eps));
}

torch::Tensor LlamaDecoderLayerImpl::forward(const torch::Tensor& x, const torch::Tensor& cos,
                                             const torch::Tensor& sin, const torch::Tensor& bias,
                                             KVCache* cache, int64_t layer) {
  auto h = x + self_attn(input_layernorm(x), cos, sin, bias, cache, layer);
  return h + mlp(post_attention_layernorm(h));
}

torch::Tensor default_position_ids(const torch::Tensor& attention_mask, int64_t n_new) {
  auto pos = attention_mask.ne(0).to(torch::kInt64).cumsum(/*dim=*/1) - 1;
  pos = pos.clamp_min(0);
  return pos.narrow(/*dim=*/1, /*start=*/pos.size(1) - n_new, /*length=*/n_new);
}

LlamaModelImpl::LlamaModelImpl(const TextConfig& c)
    : head_dim_(c.head_dim), rope_theta_(c.rope_theta), mrope_section_(c.mrope_section) {
  embed_tokens = register_module("embed_tokens", torch::nn::Embedding(c.vocab_size, c.hidden_size));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) layers->push_back(LlamaDecoderLayer(c));
  norm = register_module("norm", RmsNorm(c.hidden_size, c.rms_norm_eps));
}

torch::Tensor LlamaModelImpl::forward(const torch::Tensor& inputs_embeds,
                                      torch::Tensor attention_mask,
                                      torch::Tensor position_ids, KVCache* cache) {
  const int64_t B = inputs_embeds.size(0), T = inputs_embeds.size(1);
  const int64_t n_past = cache != nullptr ? cache->seq_len() : 0;
  if (!attention_mask.defined()) {
    attention_mask = torch::ones({B, n_past + T},
                                 torch::dtype(torch::kInt64).device(inputs_embeds.device()));
  }
  TORCH_CHECK(attention_mask.dim() == 2 && attention_mask.size(0) == B &&
                  attention_mask.size(1) == n_past + T,
              "attention_mask must be [B, S + T] = [", B, ", ", n_past + T, "], got ",
              attention_mask.sizes());
  if (!position_ids.defined()) position_ids = default_position_ids(attention_mask, T);
  torch::Tensor cos, sin;
  if (!mrope_section_.empty()) {  // 1-D positions stand for equal temporal/height/width ones
    if (position_ids.dim() == 2) position_ids = position_ids.unsqueeze(0).expand({3, B, T});
    std::tie(cos, sin) = mrope_cos_sin(position_ids, head_dim_, rope_theta_, mrope_section_,
                                       inputs_embeds.scalar_type());
  } else {
    TORCH_CHECK(position_ids.dim() == 2, "position_ids must be [B, T] for 1-D rotary positions, ",
                "got ", position_ids.sizes());
    std::tie(cos, sin) =
        rope_cos_sin(position_ids, head_dim_, rope_theta_, inputs_embeds.scalar_type());
  }
  auto bias = causal_bias(attention_mask, T, inputs_embeds.scalar_type());
  auto h = inputs_embeds;
  for (size_t i = 0; i < layers->size(); ++i) {
    auto* l = layers[i]->as<LlamaDecoderLayer>();
    if (checkpoint_layers && cache == nullptr && is_training()) {
      h = checkpointed(
          [l, cos = cos, sin = sin, bias = bias](const torch::Tensor& x) {
            return l->forward(x, cos, sin, bias, nullptr, 0);
          },
          h, trainable_parameters(*l));
    } else {
      h = l->forward(h, cos, sin, bias, cache, static_cast<int64_t>(i));
    }
  }
  return norm(h);
}

LanguageModelImpl::LanguageModelImpl(const TextConfig& c, bool tie_word_embeddings)
    : tied_(tie_word_embeddings) {
  model = register_module("model", LlamaModel(c));
  if (!tied_) {
    lm_head = register_module(
        "lm_head",
        torch::nn::Linear(torch::nn::LinearOptions(c.hidden_size, c.vocab_size).bias(false)));
  }
}

torch::Tensor LanguageModelImpl::forward(const torch::Tensor& inputs_embeds,
                                         torch::Tensor attention_mask, torch::Tensor position_ids,
                                         KVCache* cache) {
  return model(inputs_embeds, attention_mask, position_ids, cache);
}

torch::Tensor LanguageModelImpl::output_weight() const {
  return tied_ ? model->embed_tokens->weight : lm_head->weight;
}

torch::Tensor LanguageModelImpl::logits(const torch::Tensor& hidden) {
  return mmpost::gemm_linear(hidden, output_weight());
}

}  // namespace mmpost::model
