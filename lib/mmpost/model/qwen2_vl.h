// The Qwen2-VL family (HF Qwen2VLForConditionalGeneration, Qwen2_5_VLForConditionalGeneration):
// a native-resolution ViT over 14-px patches (a still image is duplicated over the temporal patch
// of 2), 2-D rotary positions in its blocks, a 2x2 patch merger into the LM width, and a Qwen2
// decoder (q/k/v biases) with multimodal rotary positions (M-RoPE). Qwen2.5-VL's tower uses
// RMSNorm + SwiGLU blocks and window attention outside `fullatt_block_indexes`.
// Parameter names are the hub's: `visual.*`, and `model.*` / `lm_head.*` of the decoder, which
// this module holds as `language_model.model.*` / `language_model.lm_head.*` (see
// qwen2_vl_hub_name).
#pragma once

#include "mmpost/model/blocks.h"
#include "mmpost/model/language_model.h"
#include "mmpost/model/lora.h"
#include "mmpost/model/qwen2_vl_config.h"

#include <torch/torch.h>

#include <array>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace mmpost::model {

/// One vision block: x + attn(norm1(x)); x + mlp(norm2(x)). Qwen2-VL: LayerNorm (eps 1e-6),
/// mlp = fc2(act(fc1(x))); Qwen2.5-VL: RMSNorm (eps 1e-6), mlp = down_proj(act(gate_proj(x)) *
/// up_proj(x)) with biases. Attention: qkv / proj with biases, 2-D rotary on q and k in float32
/// (HF apply_rotary_pos_emb_vision), non-causal within each [cu_seqlens[i], cu_seqlens[i+1]).
class Qwen2VisionBlockImpl : public torch::nn::Module {
 public:
  Qwen2VisionBlockImpl(const Qwen2VisionConfig& c, Qwen2VLVariant variant);
  /// x [L, E]; cos, sin [L, head_dim] float32; cu_seqlens: segment bounds (0, ..., L).
  /// Returns [L, E].
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        const std::vector<int64_t>& cu_seqlens);

  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};  // Qwen2-VL "norm1" / "norm2"
  RmsNorm rms1{nullptr}, rms2{nullptr};             // Qwen2.5-VL "norm1" / "norm2"
  LoraLinear qkv{nullptr}, proj{nullptr};           // "attn.qkv", "attn.proj"
  LoraLinear fc1{nullptr}, fc2{nullptr};            // Qwen2-VL "mlp.*"
  LoraLinear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};  // Qwen2.5-VL "mlp.*"

 private:
  torch::Tensor attention(const torch::Tensor& x, const torch::Tensor& cos,
                          const torch::Tensor& sin, const std::vector<int64_t>& cu_seqlens);
  torch::Tensor mlp(const torch::Tensor& x);
  int64_t n_heads_, head_dim_;
  Activation act_;
};
TORCH_MODULE(Qwen2VisionBlock);

/// The vision tower with its merger (HF Qwen2VisionTransformerPretrainedModel /
/// Qwen2_5_VisionTransformerPretrainedModel): children patch_embed.proj (Conv3d weight
/// [E, C, t, p, p], applied as one matmul over flattened patches), blocks.N, merger (ln_q,
/// mlp.0, mlp.2).
class Qwen2VisionTransformerImpl : public torch::nn::Module {
 public:
  Qwen2VisionTransformerImpl(const Qwen2VisionConfig& c, Qwen2VLVariant variant);
  /// pixel_values [L, C * t * p * p] (the processor's flattened patches, any float dtype),
  /// image_grid_thw [N, 3] int64 (patches per image along t, h, w; L = sum of t*h*w) ->
  /// merged features [L / merge^2, out_hidden_size], images in order.
  /// Throws Error(kData) when L does not match the grids.
  torch::Tensor forward(const torch::Tensor& pixel_values, const torch::Tensor& image_grid_thw);
  /// Turns activation checkpointing of every block on or off (acts in training mode).
  bool checkpoint_blocks = false;

  torch::nn::Conv3d patch_embed_proj{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::LayerNorm merger_ln{nullptr};  // Qwen2-VL "merger.ln_q"
  RmsNorm merger_rms{nullptr};              // Qwen2.5-VL "merger.ln_q"
  torch::nn::Sequential merger_mlp{nullptr};

 private:
  Qwen2VisionConfig c_;
  Qwen2VLVariant variant_;
};
TORCH_MODULE(Qwen2VisionTransformer);

/// Patch (h, w) positions of the vision tower's rotary embedding, [L, 2] int64, in the
/// processor's patch order: 2x2 merge blocks row-major, patches row-major inside each block,
/// repeated over t (transformers.vision_utils.get_vision_position_ids).
torch::Tensor vision_patch_positions(const std::vector<std::array<int64_t, 3>>& grids,
                                     int64_t spatial_merge_size);

/// Qwen2.5-VL's window layout (transformers.vision_utils.get_vision_window_index): the order
/// that groups merge units by window of window_size / (patch * merge) units per side (windows
/// row-major per frame, padded edge windows kept partial), and the cumulative patch counts of
/// the windows (empty windows dropped). Returns {window_index over merge units, cu_seqlens}.
std::pair<std::vector<int64_t>, std::vector<int64_t>> vision_window_index(
    const std::vector<std::array<int64_t, 3>>& grids, int64_t spatial_merge_size,
    int64_t window_size, int64_t patch_size);

/// M-RoPE position ids (HF Qwen2VLModel.get_rope_index, images only): text tokens advance all
/// three axes by 1; each run of image tokens (t * h * w / merge^2 of them, grids consumed in
/// order across the batch) takes t = start + frame, h = start + row, w = start + column on the
/// merged grid, and the text after it restarts at start + max(h, w) / merge.
/// input_ids [B, T] int64; image_grid_thw [N, 3] int64 (undefined: no images); attention_mask
/// [B, T] (undefined = all ones; padded positions get 0 and are skipped).
/// Returns {position_ids [3, B, T] int64, rope_deltas [B] int64 = max position + 1 - real
/// tokens}. Throws Error(kData) when image tokens and grids disagree.
std::pair<torch::Tensor, torch::Tensor> mrope_position_ids(const torch::Tensor& input_ids,
                                                           const torch::Tensor& image_grid_thw,
                                                           const torch::Tensor& attention_mask,
                                                           int64_t image_token_id,
                                                           int64_t spatial_merge_size);

/// Qwen2-VL / Qwen2.5-VL for conditional generation. Device- and dtype-agnostic.
class Qwen2VLImpl : public torch::nn::Module {
 public:
  explicit Qwen2VLImpl(const Qwen2VLConfig& config);

  /// Merged image features [sum_i t*h*w / merge^2, C] (HF get_image_features, concatenated).
  torch::Tensor image_features(const torch::Tensor& pixel_values,
                               const torch::Tensor& image_grid_thw);

  /// input_ids [B, T] -> inputs_embeds [B, T, C] with image_token_id rows replaced, in
  /// row-major order, by `features` [K, C] (undefined: no images). Throws Error(kData) when the
  /// image-token count differs from K.
  torch::Tensor embed_features(const torch::Tensor& input_ids, const torch::Tensor& features);

  /// Hidden states [B, T, C] after the final norm. pixel_values / image_grid_thw as for
  /// image_features (undefined: text only); attention_mask [B, S + T] (undefined = ones);
  /// position_ids [3, B, T] (undefined: mrope_position_ids over this call's tokens, or, when
  /// `cache` already holds S > 0 tokens, default positions + the rope deltas the cache kept from
  /// the prompt, as HF generate does).
  torch::Tensor forward_hidden(const torch::Tensor& input_ids, const torch::Tensor& pixel_values,
                               const torch::Tensor& image_grid_thw,
                               const torch::Tensor& attention_mask, KVCache* cache = nullptr,
                               torch::Tensor position_ids = {});

  /// As forward_hidden from precomputed merged features [K, C] (image_features of the rows'
  /// images, in row-major order; undefined: none) and those images' grids image_grid_thw [N, 3]
  /// (for the M-RoPE positions), so one vision pass can serve several rows (chosen and rejected
  /// of a preference pair, G rollouts of a prompt). Throws Error(kData) when tokens, features
  /// and grids disagree.
  torch::Tensor forward_hidden_features(const torch::Tensor& input_ids,
                                        const torch::Tensor& features,
                                        const torch::Tensor& image_grid_thw,
                                        const torch::Tensor& attention_mask,
                                        KVCache* cache = nullptr,
                                        torch::Tensor position_ids = {});

  /// Logits [B, T, V] float32 (HF Qwen2VLForConditionalGeneration.forward). Arguments as in
  /// forward_hidden.
  torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& pixel_values,
                        const torch::Tensor& image_grid_thw, const torch::Tensor& attention_mask,
                        KVCache* cache = nullptr, torch::Tensor position_ids = {});

  /// lm_head on hidden [..., C] -> logits [..., V] float32.
  torch::Tensor logits(const torch::Tensor& hidden);

  const Qwen2VLConfig& config() const { return config_; }
  void set_activation_checkpointing(bool on);

  Qwen2VisionTransformer visual{nullptr};
  LanguageModel language_model{nullptr};

 private:
  Qwen2VLConfig config_;
};
TORCH_MODULE(Qwen2VL);

/// Builds a model from its config (validated first; throws Error kUsage).
Qwen2VL build_qwen2_vl(const Qwen2VLConfig& config);

/// The module's parameter name of a checkpoint tensor: hub names (`visual.*`, `model.*`,
/// `lm_head.weight`) and transformers 5's in-memory ones (`model.visual.*`,
/// `model.language_model.*`) both map to `visual.*` / `language_model.model.*` /
/// `language_model.lm_head.weight`.
std::string qwen2_vl_param_name(const std::string& checkpoint_name);

/// Copies checkpoint `tensors` into the model (each converted to its parameter's dtype and
/// device). With tied embeddings an lm_head tensor is ignored. Throws Error(kData) naming
/// `source_name` and every missing, unexpected or wrongly shaped tensor.
void load_qwen2_vl_weights(Qwen2VLImpl& model, const std::map<std::string, torch::Tensor>& tensors,
                           const std::string& source_name);

/// The tensors to write as model.safetensors, in the hub layout (contiguous, CPU).
std::map<std::string, torch::Tensor> qwen2_vl_state_dict(const Qwen2VLImpl& model);

}  // namespace mmpost::model
