// Llama decoder (HF LlamaForCausalLM): `model.embed_tokens`, `model.layers.N`, `model.norm`, and
// `lm_head`, which shares `model.embed_tokens.weight` when tie_word_embeddings is set (then no
// separate lm_head parameter exists; hf_state_dict omits it, as save_pretrained does).
#pragma once

#include "mmpost/model/blocks.h"
#include "mmpost/model/config.h"

#include <torch/torch.h>

namespace mmpost::model {

/// Pre-norm decoder layer (HF LlamaDecoderLayer).
class LlamaDecoderLayerImpl : public torch::nn::Module {
 public:
  explicit LlamaDecoderLayerImpl(const TextConfig& c);
  /// x [B, T, C], rotary cos/sin [B, T, D], bias [B, 1, T, S + T] -> [B, T, C].
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        const torch::Tensor& bias, KVCache* cache, int64_t layer);
  Attention self_attn{nullptr};
  SwiGluMlp mlp{nullptr};
  RmsNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
};
TORCH_MODULE(LlamaDecoderLayer);

/// Default position ids for T new tokens: cumsum(attention_mask) - 1 clamped at 0, last T columns.
/// Equals arange for unpadded/right-padded rows and starts at 0 on the first real token of
/// left-padded rows (HF generate). attention_mask [B, S + T] -> [B, T] int64.
torch::Tensor default_position_ids(const torch::Tensor& attention_mask, int64_t n_new);

/// The decoder stack without the head (HF LlamaModel).
class LlamaModelImpl : public torch::nn::Module {
 public:
  explicit LlamaModelImpl(const TextConfig& c);
  /// inputs_embeds [B, T, C]; attention_mask [B, S + T] (1 = keep, 0 = pad; left or right
  /// padding; undefined = all ones) covering the S cached tokens too; position_ids [B, T] int64
  /// (undefined = default_position_ids), or [3, B, T] (temporal, height, width) with M-RoPE
  /// (TextConfig::mrope_section); cache: read and extended when not null.
  /// Returns the final-norm hidden states [B, T, C].
  torch::Tensor forward(const torch::Tensor& inputs_embeds, torch::Tensor attention_mask = {},
                        torch::Tensor position_ids = {}, KVCache* cache = nullptr);
  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  RmsNorm norm{nullptr};
  /// Activation checkpointing of every decoder layer while training without a KV cache
  /// (model::checkpointed).
  bool checkpoint_layers = false;

 private:
  int64_t head_dim_;
  double rope_theta_;
  std::vector<int64_t> mrope_section_;
};
TORCH_MODULE(LlamaModel);

/// Llama with its LM head (HF LlamaForCausalLM): children `model` and (untied) `lm_head`.
class LanguageModelImpl : public torch::nn::Module {
 public:
  LanguageModelImpl(const TextConfig& c, bool tie_word_embeddings);
  /// See LlamaModelImpl::forward; returns hidden states [B, T, C].
  torch::Tensor forward(const torch::Tensor& inputs_embeds, torch::Tensor attention_mask = {},
                        torch::Tensor position_ids = {}, KVCache* cache = nullptr);
  /// hidden [..., C] -> logits [..., V] in the weights' dtype.
  torch::Tensor logits(const torch::Tensor& hidden);
  /// The output projection [V, C]: lm_head's, or embed_tokens' when tied.
  torch::Tensor output_weight() const;
  bool tied() const { return tied_; }
  LlamaModel model{nullptr};
  torch::nn::Linear lm_head{nullptr};  // null when tied

 private:
  bool tied_;
};
TORCH_MODULE(LanguageModel);

}  // namespace mmpost::model
