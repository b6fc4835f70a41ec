// LLaVA (HF LlavaForConditionalGeneration): CLIP vision tower -> projector -> image features
// spliced into the token embeddings at image-token positions -> Llama. Parameter names are the hub
// checkpoint names (`vision_tower.vision_model.*`, `multi_modal_projector.*`, `language_model.*`).
#pragma once

#include "mmpost/model/blocks.h"
#include "mmpost/model/config.h"
#include "mmpost/model/language_model.h"
#include "mmpost/model/projector.h"
#include "mmpost/model/vision_encoder.h"

#include <torch/torch.h>

namespace mmpost::model {

/// The LLaVA model. Device- and dtype-agnostic (move it with `->to(device, dtype)`).
class VlmImpl : public torch::nn::Module {
 public:
  explicit VlmImpl(const VlmConfig& config);

  /// pixel_values [N, 3, H, W] (any float dtype) -> projected features [N, P, C_text] with
  /// P = config.n_image_tokens() (HF LlavaModel.get_image_features).
  torch::Tensor image_features(const torch::Tensor& pixel_values);

  /// input_ids [B, T] int64 -> inputs_embeds [B, T, C]. Rows whose id is image_token_index are
  /// replaced, in row-major order, by the features of pixel_values' images in order (N images
  /// across the batch, any number per sample). pixel_values undefined: no images expected.
  /// Throws mmpost::Error (kData) when the image-token count differs from N * P.
  torch::Tensor embed(const torch::Tensor& input_ids, const torch::Tensor& pixel_values);

  /// As embed, from precomputed image features [N, P, C] (undefined = no images), so one vision
  /// pass can serve several rows (chosen and rejected of a preference pair, G rollouts).
  torch::Tensor embed_features(const torch::Tensor& input_ids, const torch::Tensor& features);

  /// Logits [B, T, V] float32 from precomputed image features (see embed_features);
  /// attention_mask as in forward_hidden, no cache.
  torch::Tensor forward_features(const torch::Tensor& input_ids, const torch::Tensor& features,
                                 const torch::Tensor& attention_mask);

  /// Hidden states [B, T, C] after the final norm from precomputed image features (see
  /// embed_features); attention_mask as in forward_hidden, no cache. Used by reward models, whose
  /// score head reads the hidden state of the last non-pad token.
  torch::Tensor forward_hidden_features(const torch::Tensor& input_ids,
                                        const torch::Tensor& features,
                                        const torch::Tensor& attention_mask);

  /// Hidden states [B, T, C] after the final norm. attention_mask [B, S + T] (1 = keep; covers
  /// cached tokens; undefined = all ones); position_ids [B, T] (undefined = cumsum(mask) - 1).
  torch::Tensor forward_hidden(const torch::Tensor& input_ids, const torch::Tensor& pixel_values,
                               const torch::Tensor& attention_mask, KVCache* cache = nullptr,
                               const torch::Tensor& position_ids = {});

  /// Logits [B, T, V] float32 (HF LlavaForConditionalGeneration.forward). Arguments as in
  /// forward_hidden.
  torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& pixel_values,
                        const torch::Tensor& attention_mask, KVCache* cache = nullptr,
                        const torch::Tensor& position_ids = {});

  /// lm_head on hidden states [..., C] -> logits [..., V] float32.
  torch::Tensor logits(const torch::Tensor& hidden);

  const VlmConfig& config() const { return config_; }
  /// Turns activation checkpointing (model::checkpointed) of every vision encoder layer and
  /// every decoder layer on or off; it acts in training mode, without a KV cache.
  void set_activation_checkpointing(bool on);

  ClipVisionModel vision_tower{nullptr};
  Projector multi_modal_projector{nullptr};
  LanguageModel language_model{nullptr};

 private:
  VlmConfig config_;
};
TORCH_MODULE(Vlm);

/// Builds a LLaVA model from its config (validated first; throws mmpost::Error kUsage).
Vlm build_vlm(const VlmConfig& config);

}  // namespace mmpost::model
