// The model every stage trains, of either family:
// - LLaVA (HF LlavaForConditionalGeneration): CLIP vision tower -> projector -> image features
//   spliced into the token embeddings at image-token positions -> Llama. Parameter names are the
//   hub checkpoint names (`vision_tower.vision_model.*`, `multi_modal_projector.*`,
//   `language_model.*`).
// - Qwen2-VL / Qwen2.5-VL (model/qwen2_vl.h), held inside: its `visual` and `language_model`
//   are this module's children, so parameter names read `visual.*`, `language_model.model.*`.
// Images travel as model::Images: LLaVA's pixel_values alone, or Qwen2-VL's flattened patches
// with their image_grid_thw.
#pragma once

#include "mmpost/model/blocks.h"
#include "mmpost/model/config.h"
#include "mmpost/model/language_model.h"
#include "mmpost/model/projector.h"
#include "mmpost/model/qwen2_vl.h"
#include "mmpost/model/vision_encoder.h"

#include <torch/torch.h>

namespace mmpost::model {

/// The images of a batch, as each family's processor gives them. LLaVA: pixel_values
/// [N, 3, H, W] float. Qwen2-VL family: pixel_values [L, C * t * p * p] (flattened patches of
/// all images) and image_grid_thw [N, 3] int64. Converts implicitly from a LLaVA pixel_values
/// tensor; default = no images.
struct Images {
  torch::Tensor pixel_values;
  torch::Tensor image_grid_thw;  // undefined for LLaVA
  Images() = default;
  Images(torch::Tensor pixel_values) : pixel_values(std::move(pixel_values)) {}  // NOLINT
  Images(torch::Tensor pixel_values, torch::Tensor image_grid_thw)
      : pixel_values(std::move(pixel_values)), image_grid_thw(std::move(image_grid_thw)) {}
  bool empty() const { return !pixel_values.defined() || pixel_values.size(0) == 0; }
};

/// The model a stage trains (LLaVA, or a Qwen2-VL family model held inside). Device- and dtype-agnostic (move it with `->to(device, dtype)`).
class VlmImpl : public torch::nn::Module {
 public:
  explicit VlmImpl(const VlmConfig& config);
  /// Adopts a Qwen2-VL family model (its modules become this module's children `visual` and
  /// `language_model`); config() then mirrors its text config and image token id.
  explicit VlmImpl(Qwen2VL qwen2_vl);

  /// True when this is a Qwen2-VL family model (`qwen2_vl` set).
  bool is_qwen2_vl() const { return static_cast<bool>(qwen2_vl); }

  /// LLaVA: pixel_values [N, 3, H, W] (any float dtype) -> projected features [N, P, C_text]
  /// with P = config.n_image_tokens() (HF LlavaModel.get_image_features). Qwen2-VL: merged
  /// features [sum of t*h*w / merge^2, C_text] (Qwen2VLImpl::image_features).
  torch::Tensor image_features(const Images& images);

  /// input_ids [B, T] int64 -> inputs_embeds [B, T, C]. Rows whose id is image_token_index are
  /// replaced, in row-major order, by the features of pixel_values' images in order (N images
  /// across the batch, any number per sample). pixel_values undefined: no images expected.
  /// Throws mmpost::Error (kData) when the image-token count differs from N * P.
  torch::Tensor embed(const torch::Tensor& input_ids, const Images& images);

  /// As embed, from precomputed image features [N, P, C] (undefined = no images), so one vision
  /// pass can serve several rows (chosen and rejected of a preference pair, G rollouts).
  torch::Tensor embed_features(const torch::Tensor& input_ids, const torch::Tensor& features);

  /// Logits [B, T, V] float32 from precomputed image features (see embed_features);
  /// attention_mask as in forward_hidden, no cache. Qwen2-VL family: `features` [K, C] and the
  /// grids image_grid_thw [N, 3] of the images they came from, in row-major order (the M-RoPE
  /// positions need them); LLaVA ignores image_grid_thw. Throws Error(kData) when image tokens,
  /// features and grids disagree.
  torch::Tensor forward_features(const torch::Tensor& input_ids, const torch::Tensor& features,
                                 const torch::Tensor& attention_mask,
                                 const torch::Tensor& image_grid_thw = {});

  /// Hidden states [B, T, C] after the final norm from precomputed image features (arguments as
  /// in forward_features). Used by reward models, whose score head reads the hidden state of
  /// the last non-pad token, and by the chunked LM head.
  torch::Tensor forward_hidden_features(const torch::Tensor& input_ids,
                                        const torch::Tensor& features,
                                        const torch::Tensor& attention_mask,
                                        const torch::Tensor& image_grid_thw = {});

  /// Hidden states [B, T, C] after the final norm. attention_mask [B, S + T] (1 = keep; covers
  /// cached tokens; undefined = all ones); position_ids [B, T] (undefined = cumsum(mask) - 1;
  /// Qwen2-VL: [3, B, T], undefined = M-RoPE positions, see Qwen2VLImpl::forward_hidden).
  torch::Tensor forward_hidden(const torch::Tensor& input_ids, const Images& images,
                               const torch::Tensor& attention_mask, KVCache* cache = nullptr,
                               const torch::Tensor& position_ids = {});

  /// Logits [B, T, V] float32 (HF LlavaForConditionalGeneration.forward). Arguments as in
  /// forward_hidden.
  torch::Tensor forward(const torch::Tensor& input_ids, const Images& images,
                        const torch::Tensor& attention_mask, KVCache* cache = nullptr,
                        const torch::Tensor& position_ids = {});

  /// lm_head on hidden states [..., C] -> logits [..., V] float32.
  torch::Tensor logits(const torch::Tensor& hidden);

  const VlmConfig& config() const { return config_; }
  /// Turns activation checkpointing (model::checkpointed) of every vision encoder layer and
  /// every decoder layer on or off; it acts in training mode, without a KV cache.
  void set_activation_checkpointing(bool on);

  ClipVisionModel vision_tower{nullptr};     // LLaVA
  Projector multi_modal_projector{nullptr};  // LLaVA
  LanguageModel language_model{nullptr};     // both families
  Qwen2VL qwen2_vl{nullptr};  // Qwen2-VL family (not a registered child: its children are ours)

 private:
  VlmConfig config_;
};
TORCH_MODULE(Vlm);

/// Position ids of a packed batch (data::collate_packed: attention_mask numbers each row's
/// samples 1, 2, ..., 0 = padding): every sample gets the positions it has alone. LLaVA:
/// [B, T] int64, 0 .. L-1 per sample. Qwen2-VL family: [3, B, T] M-RoPE (mrope_position_ids of
/// the sample's tokens with its images' grids, taken in order from image_grid_thw [N, 3]).
/// Padding gets 0. Reads the tensors on the CPU; returns CPU tensors. Throws Error(kData) when
/// image tokens and grids disagree.
torch::Tensor packed_position_ids(const VlmImpl& m, const torch::Tensor& input_ids,
                                  const torch::Tensor& attention_mask,
                                  const torch::Tensor& image_grid_thw);

/// Builds a LLaVA model from its config (validated first; throws mmpost::Error kUsage).
Vlm build_vlm(const VlmConfig& config);

/// The parts `model.freeze` names, of either family: "vision_tower" (Qwen2-VL: the visual
/// blocks and patch embedding), "projector" (Qwen2-VL: visual.merger), "language_model".
/// Throws Error(kUsage) for another name.
std::vector<torch::nn::Module*> model_part(VlmImpl& m, const std::string& part);

}  // namespace mmpost::model
