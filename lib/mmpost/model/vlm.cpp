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

torch::Tensor VlmImpl::forward_features(const torch::Tensor& input_ids,
                                        const torch::Tensor& features,
                                        const torch::Tensor& attention_mask,
                                        const torch::Tensor& image_grid_thw) {
  return logits(forward_hidden_features(input_ids, features, attention_mask, image_grid_thw));
}

torch::Tensor VlmImpl::forward_hidden_features(const torch::Tensor& input_ids,
                                               const torch::Tensor& features,
                                               const torch::Tensor& attention_mask,
                                               const torch::Tensor& image_grid_thw) {
  if (qwen2_vl) {
    return qwen2_vl->forward_hidden_features(input_ids, features, image_grid_thw, attention_mask);
  }
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

torch::Tensor packed_position_ids(const VlmImpl& m, const torch::Tensor& input_ids,
                                  const torch::Tensor& attention_mask,
                                  const torch::Tensor& image_grid_thw) {
  const auto ids = input_ids.to(torch::kCPU, torch::kInt64).contiguous();
  const auto mask = attention_mask.to(torch::kCPU, torch::kInt64).contiguous();
  const int64_t B = ids.size(0), T = ids.size(1);
  const bool qwen = m.is_qwen2_vl();
  auto out = torch::zeros({qwen ? 3 : 1, B, T}, torch::kInt64);
  const auto grids = image_grid_thw.defined() ? image_grid_thw.to(torch::kCPU, torch::kInt64)
                                              : torch::zeros({0, 3}, torch::kInt64);
  int64_t merge = 1, image_token = m.config().image_token_index;
  if (qwen) merge = m.qwen2_vl->config().vision_config.spatial_merge_size;
  auto ma = mask.accessor<int64_t, 2>();
  int64_t next_grid = 0;  // grids are consumed in row-major sample order
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t a = 0; a < T;) {
      if (ma[b][a] == 0) {
        ++a;
        continue;
      }
      int64_t e = a;
      while (e < T && ma[b][e] == ma[b][a]) ++e;
      const int64_t L = e - a;
      if (!qwen) {
        out[0][b].narrow(0, a, L).copy_(torch::arange(L, torch::kInt64));
      } else {
        auto seg = ids[b].narrow(0, a, L).unsqueeze(0);  // [1, L]
        int64_t tokens = seg.eq(image_token).sum().item<int64_t>(), n_grids = 0;
        while (tokens > 0 && next_grid + n_grids < grids.size(0)) {
          tokens -= grids[next_grid + n_grids].prod().item<int64_t>() / (merge * merge);
          ++n_grids;
        }
        MMPOST_CHECK_DATA(tokens == 0, "packed batch: row ", b, "'s sample at token ", a,
                          " holds image tokens that the images' grids do not cover");
        auto g = n_grids > 0 ? grids.narrow(0, next_grid, n_grids) : torch::Tensor();
        next_grid += n_grids;
        auto pos = mrope_position_ids(seg, g, {}, image_token, merge).first;  // [3, 1, L]
        out.select(1, b).narrow(1, a, L).copy_(pos.select(1, 0));
      }
      a = e;
    }
  }
  return qwen ? out : out[0];
}

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
