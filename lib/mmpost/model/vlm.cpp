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

VlmImpl::VlmImpl(Qwen2VL qwen) : qwen2_vl(std::move(qwen)) {
  const auto& q = qwen2_vl->config();
  config_.text_config = q.text_config;
  config_.image_token_index = q.image_token_id;
  config_.tie_word_embeddings = q.tie_word_embeddings;
  config_.torch_dtype = q.torch_dtype;
  register_module("visual", qwen2_vl->visual);
  language_model = register_module("language_model", qwen2_vl->language_model);
}

torch::Tensor VlmImpl::image_features(const Images& images) {
  if (qwen2_vl) return qwen2_vl->image_features(images.pixel_values, images.image_grid_thw);
  const auto& pixel_values = images.pixel_values;
  auto h = vision_tower(pixel_values, config_.vision_feature_layer);  // [N, 1 + P, C_vision]
  if (config_.vision_feature_select_strategy == "default") {
    h = h.narrow(/*dim=*/1, /*start=*/1, /*length=*/h.size(1) - 1);  // drop the class token
  }
  return multi_modal_projector(h);  // [N, P, C_text]
}

torch::Tensor VlmImpl::embed(const torch::Tensor& input_ids, const Images& images) {
  return embed_features(input_ids, images.empty() ? torch::Tensor() : image_features(images));
}

torch::Tensor VlmImpl::embed_features(const torch::Tensor& input_ids,
                                      const torch::Tensor& features) {
  if (qwen2_vl) return qwen2_vl->embed_features(input_ids, features);
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

namespace {
void check_llava_only(const VlmImpl& m, const char* what) {
  MMPOST_CHECK_USAGE(!m.is_qwen2_vl(), what,
                     " runs LLaVA models only: Qwen2-VL positions need the images' grids");
}
}  // namespace

torch::Tensor VlmImpl::forward_features(const torch::Tensor& input_ids,
                                        const torch::Tensor& features,
                                        const torch::Tensor& attention_mask) {
  check_llava_only(*this, "forward_features");
  return logits(language_model->forward(embed_features(input_ids, features), attention_mask,
                                        torch::Tensor(), nullptr));
}

torch::Tensor VlmImpl::forward_hidden_features(const torch::Tensor& input_ids,
                                               const torch::Tensor& features,
                                               const torch::Tensor& attention_mask) {
  check_llava_only(*this, "forward_hidden_features");
  return language_model->forward(embed_features(input_ids, features), attention_mask,
                                 torch::Tensor(), nullptr);
}

torch::Tensor VlmImpl::forward_hidden(const torch::Tensor& input_ids, const Images& images,
                                      const torch::Tensor& attention_mask, KVCache* cache,
                                      const torch::Tensor& position_ids) {
  if (qwen2_vl) {
    return qwen2_vl->forward_hidden(input_ids, images.pixel_values, images.image_grid_thw,
                                    attention_mask, cache, position_ids);
  }
  return language_model(embed(input_ids, images), attention_mask, position_ids, cache);
}

torch::Tensor VlmImpl::logits(const torch::Tensor& hidden) {
  return language_model->logits(hidden).to(torch::kFloat32);
}

torch::Tensor VlmImpl::forward(const torch::Tensor& input_ids, const Images& images,
                               const torch::Tensor& attention_mask, KVCache* cache,
                               const torch::Tensor& position_ids) {
  return logits(forward_hidden(input_ids, images, attention_mask, cache, position_ids));
}

Vlm build_vlm(const VlmConfig& config) { return Vlm(config); }

void VlmImpl::set_activation_checkpointing(bool on) {
  if (qwen2_vl) {
    qwen2_vl->set_activation_checkpointing(on);
    return;
  }
  vision_tower->vision_model->checkpoint_layers = on;
  language_model->model->checkpoint_layers = on;
}

std::vector<torch::nn::Module*> model_part(VlmImpl& m, const std::string& part) {
  if (part == "language_model") return {m.language_model.get()};
  if (m.is_qwen2_vl()) {
    auto& v = *m.qwen2_vl->visual;
    if (part == "projector") {
      return {v.merger_ln ? static_cast<torch::nn::Module*>(v.merger_ln.get()) : v.merger_rms.get(),
              v.merger_mlp.get()};
    }
    if (part == "vision_tower") return {v.patch_embed_proj.get(), v.blocks.get()};
  } else {
    if (part == "vision_tower") return {m.vision_tower.get()};
    if (part == "projector") return {m.multi_modal_projector.get()};
  }
  throw Error(ErrorKind::kUsage, "model.freeze: unknown part \"" + part + "\"",
              "the parts are vision_tower, projector, language_model");
}

}  // namespace mmpost::model
