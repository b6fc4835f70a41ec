// LLaVA assembly (see vlm.h): vision feature selection and image-token splicing as in
// transformers' LlavaModel.get_image_features / get_placeholder_mask / masked_scatter.
#include "mmpost/model/vlm.h"

#include "mmpost/core/check.h"

namespace mmpost::model {

VlmImpl::VlmImpl(const VlmConfig& config) : config_(config) {
  validate(config_);
  vision_tower = register_module("vision_tower", ClipVisionModel(config_.vision_config));
  multi_modal_projector = register_module("multi_modal_projector", Projector(config_));
  language_model = register_module(
      "language_model", LanguageModel(config_.text_config, config_.tie_word_embeddings));
}

torch::Tensor VlmImpl::image_features(const torch::Tensor& pixel_values) {
  auto h = vision_tower(pixel_values, config_.vision_feature_layer);  // [N, 1 + P, C_vision]
  if (config_.vision_feature_select_strategy == "default") {
    h = h.narrow(/*dim=*/1, /*start=*/1, /*length=*/h.size(1) - 1);  // drop the class token
  }
  return multi_modal_projector(h);  // [N, P, C_text]
}

torch::Tensor VlmImpl::embed(const torch::Tensor& input_ids, const torch::Tensor& pixel_values) {
  const bool has_images = pixel_values.defined() && pixel_values.size(0) > 0;
  return embed_features(input_ids, has_images ? image_features(pixel_values) : torch::Tensor());
}

torch::Tensor VlmImpl::embed_features(const torch::Tensor& input_ids,
                                      const torch::Tensor& features) {
  TORCH_CHECK(input_ids.dim() == 2, "input_ids must be [B, T], got ", input_ids.sizes());
  auto is_image = input_ids == config_.image_token_index;  // [B, T]
  // Image ids may lie outside the vocabulary (HF llava-1.5 uses 32000); embed them as id 0.
  auto embeds = language_model->model->embed_tokens(input_ids.masked_fill(is_image, 0));
  const int64_t n_tokens = is_image.sum().item<int64_t>();  // one sync, for a clear error
  const int64_t n_images = features.defined() ? features.size(0) : 0;
  const int64_t P = config_.n_image_tokens();
  MMPOST_CHECK_DATA(n_tokens == n_images * P,
                    "image tokens and images do not match: input_ids hold ",
                    n_tokens, " image tokens (id ", config_.image_token_index, ") but ", n_images,
                    " image(s) x ", P, " tokens each = ", n_images * P, " features");
  if (n_images == 0) return embeds;
  TORCH_CHECK(features.dim() == 3 && features.size(1) == P, "features must be [N, P, C]");
  return embeds.masked_scatter(is_image.unsqueeze(-1), features.to(embeds.scalar_type()));
}

torch::Tensor VlmImpl::forward_features(const torch::Tensor& input_ids,
                                        const torch::Tensor& features,
                                        const torch::Tensor& attention_mask) {
  return logits(language_model->forward(embed_features(input_ids, features), attention_mask,
                                        torch::Tensor(), nullptr));
}

torch::Tensor VlmImpl::forward_hidden_features(const torch::Tensor& input_ids,
                                               const torch::Tensor& features,
                                               const torch::Tensor& attention_mask) {
  return language_model->forward(embed_features(input_ids, features), attention_mask,
                                 torch::Tensor(), nullptr);
}

torch::Tensor VlmImpl::forward_hidden(const torch::Tensor& input_ids,
                                      const torch::Tensor& pixel_values,
                                      const torch::Tensor& attention_mask, KVCache* cache,
                                      const torch::Tensor& position_ids) {
  return language_model(embed(input_ids, pixel_values), attention_mask, position_ids, cache);
}

torch::Tensor VlmImpl::logits(const torch::Tensor& hidden) {
  return language_model->logits(hidden).to(torch::kFloat32);
}

torch::Tensor VlmImpl::forward(const torch::Tensor& input_ids, const torch::Tensor& pixel_values,
                               const torch::Tensor& attention_mask, KVCache* cache,
                               const torch::Tensor& position_ids) {
  return logits(forward_hidden(input_ids, pixel_values, attention_mask, cache, position_ids));
}

Vlm build_vlm(const VlmConfig& config) { return Vlm(config); }

void VlmImpl::set_activation_checkpointing(bool on) {
  vision_tower->vision_model->checkpoint_layers = on;
  language_model->model->checkpoint_layers = on;
}

}  // namespace mmpost::model
