// Model configuration of the Qwen2-VL family (HF Qwen2VLConfig, Qwen2_5_VLConfig) and its
// config.json mapping. Defaults are transformers 5.24's; both layouts published checkpoints use
// are read: transformers 5's nested `text_config` with `rope_parameters`, and the hub's flat one
// (text keys at the top level, `rope_scaling: {"type": "mrope", "mrope_section": [...]}`,
// vision keys `in_chans` / `spatial_patch_size`). Unknown keys and unsupported values are refused
// by JSON path, as for LLaVA (config.h).
#pragma once

#include "mmpost/model/config.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace mmpost::model {

/// Which vision tower and config layout: Qwen2-VL (LayerNorm + GELU-MLP blocks, full attention)
/// or Qwen2.5-VL (RMSNorm + SwiGLU blocks, window attention outside fullatt_block_indexes).
enum class Qwen2VLVariant { kQwen2VL, kQwen2_5VL };

/// The vision tower (HF Qwen2VLVisionConfig / Qwen2_5_VLVisionConfig), in one struct.
struct Qwen2VisionConfig {
  int64_t depth = 32;
  int64_t embed_dim = 1280;          // 2-VL: embed_dim; 2.5-VL: hidden_size
  int64_t out_hidden_size = 3584;    // merger output = LM width; 2-VL: hidden_size
  int64_t intermediate_size = 5120;  // 2-VL: embed_dim * mlp_ratio; 2.5-VL: intermediate_size
  int64_t mlp_ratio = 4;             // 2-VL only (kept so config.json round-trips)
  int64_t num_heads = 16;
  int64_t in_channels = 3;
  int64_t patch_size = 14;
  int64_t spatial_merge_size = 2;
  int64_t temporal_patch_size = 2;
  std::string hidden_act = "quick_gelu";  // 2.5-VL: silu
  double rope_theta = 10000.0;
  // Qwen2.5-VL only:
  int64_t window_size = 112;                  // pixels per window side
  std::vector<int64_t> fullatt_block_indexes;  // blocks with full (per-image) attention
  int64_t tokens_per_second = 4;              // video time scale (kept for round trips)

  int64_t head_dim() const { return embed_dim / num_heads; }
  /// Flattened patch length: in_channels * temporal_patch_size * patch_size^2.
  int64_t patch_dim() const { return in_channels * temporal_patch_size * patch_size * patch_size; }
};

/// Qwen2-VL / Qwen2.5-VL settings. The text model is a Qwen2 decoder: TextConfig with
/// qkv_bias and mrope_section set, head_dim = hidden_size / num_attention_heads.
struct Qwen2VLConfig {
  Qwen2VLVariant variant = Qwen2VLVariant::kQwen2VL;
  Qwen2VisionConfig vision_config;
  TextConfig text_config;
  int64_t image_token_id = 151655;
  int64_t video_token_id = 151656;
  int64_t vision_start_token_id = 151652;
  int64_t vision_end_token_id = 151653;
  bool tie_word_embeddings = false;
  std::string torch_dtype = "float32";

  /// "qwen2_vl" or "qwen2_5_vl".
  std::string model_type() const;
};

/// True when config.json's model_type names the Qwen2-VL family ("qwen2_vl", "qwen2_5_vl").
bool is_qwen2_vl_config(const nlohmann::json& j);

/// Reads a Qwen2-VL or Qwen2.5-VL config.json object (either layout, see the file comment).
/// Missing fields take transformers' defaults. Refused with Error(kUsage) naming the JSON path:
/// unknown keys (with the closest known one), wrong types, sliding-window attention, rope types
/// other than default/mrope, mrope_section not summing to head_dim / 2, fullatt_block_indexes
/// outside [0, depth), a vision output width differing from the text hidden_size.
Qwen2VLConfig qwen2_vl_config_from_json(const nlohmann::json& j);

/// The config.json transformers 5.24's save_pretrained writes for `c` (nested text_config with
/// rope_parameters), plus rope_scaling / rope_theta spellings older transformers read.
nlohmann::json qwen2_vl_config_to_json(const Qwen2VLConfig& c);

/// Cross-field rules (see qwen2_vl_config_from_json). Throws Error(kUsage).
void validate(const Qwen2VLConfig& c);

}  // namespace mmpost::model
