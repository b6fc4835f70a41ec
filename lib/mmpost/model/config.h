// Model configuration for LLaVA (CLIP vision tower + projector + Llama text model) and its mapping
// to/from Hugging Face config.json. Defaults are those of transformers' CLIPVisionConfig,
// LlamaConfig and LlavaConfig (checked against transformers 5.24); unsupported values are refused.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mmpost::model {

/// CLIP ViT settings (HF CLIPVisionConfig).
struct VisionConfig {
  int64_t hidden_size = 768;
  int64_t intermediate_size = 3072;
  int64_t num_hidden_layers = 12;
  int64_t num_attention_heads = 12;
  int64_t num_channels = 3;
  int64_t image_size = 224;
  int64_t patch_size = 32;
  std::string hidden_act = "quick_gelu";
  double layer_norm_eps = 1e-5;
  int64_t projection_dim = 512;  // unused by LLaVA; kept so config.json round-trips

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  /// Patches per image side squared: (image_size / patch_size)^2.
  int64_t n_patches() const { return (image_size / patch_size) * (image_size / patch_size); }
};

/// Llama decoder settings (HF LlamaConfig).
struct TextConfig {
  int64_t vocab_size = 32000;
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 11008;
  int64_t num_hidden_layers = 32;
  int64_t num_attention_heads = 32;
  int64_t num_key_value_heads = 32;  // HF: defaults to num_attention_heads
  int64_t head_dim = 128;            // HF: defaults to hidden_size / num_attention_heads
  std::string hidden_act = "silu";
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  int64_t max_position_embeddings = 2048;
  bool tie_word_embeddings = false;
  std::optional<int64_t> bos_token_id = 1;
  std::vector<int64_t> eos_token_id = {2};
  std::optional<int64_t> pad_token_id;
  /// q_proj / k_proj / v_proj carry biases (Qwen2; not a LlamaConfig key: Llama's
  /// attention_bias would bias o_proj too and stays refused).
  bool qkv_bias = false;
  /// M-RoPE split of the head_dim / 2 rotary frequencies over (temporal, height, width), e.g.
  /// Qwen2-VL's [16, 24, 24]; empty = 1-D rotary positions (Llama).
  std::vector<int64_t> mrope_section;
};

/// LLaVA settings (HF LlavaConfig).
struct VlmConfig {
  VisionConfig vision_config;
  TextConfig text_config;
  int64_t image_token_index = 32000;
  int64_t image_seq_length = 576;
  int64_t vision_feature_layer = -2;  // index into HF hidden_states, 0 = embeddings
  std::string vision_feature_select_strategy = "default";  // "default" drops CLS, "full" keeps it
  std::string projector_hidden_act = "gelu";
  bool multimodal_projector_bias = true;
  bool tie_word_embeddings = false;  // HF: true if text_config.tie_word_embeddings is
  std::string torch_dtype = "float32";

  /// Image tokens each image expands to: n_patches (+1 with the "full" strategy).
  int64_t n_image_tokens() const;
};

/// Reads a LLaVA config.json object. Missing fields take the HF defaults (a missing vision_config
/// takes LlavaConfig's CLIP ViT-L/14-336 defaults, as transformers does). Every key must be one
/// mmpost reads or one of transformers' keys known not to change the math (PretrainedConfig's
/// generation and bookkeeping fields, dropout rates, initializer ranges, use_cache, ...); any
/// other key, e.g. a misspelt `vision_config.hiden_size`, is refused with its JSON path and the
/// closest known key. `where` names the source in messages ("config.json", or "model.config" for
/// a recipe's inline config, whose paths then read `model.config.vision_config.hiden_size`).
/// Throws mmpost::Error (kUsage) naming the field for unknown keys, wrong types and unsupported
/// values (e.g. `config.json: text_config.hidden_act: unsupported "relu2" (supported: ...)`).
VlmConfig vlm_config_from_json(const nlohmann::json& j, const std::string& where = "config.json");

/// Reads a pretrained language model's config.json (LlamaForCausalLM, e.g. SmolLM2) as the
/// text_config of a LLaVA model: the same keys and checks as vlm_config_from_json's
/// text_config, with messages naming `where` (e.g. "lm/config.json: hidden_act: unsupported").
/// Throws mmpost::Error (kUsage).
TextConfig causal_lm_config_from_json(const nlohmann::json& j, const std::string& where);

/// Writes an HF-loadable config.json object ("architectures": ["LlavaForConditionalGeneration"]).
nlohmann::json vlm_config_to_json(const VlmConfig& c);

/// Exact parameter counts of the model `c` describes, by the parts `model.freeze` names (CLIP
/// vision tower with embeddings, pre/post layer norms and biased projections; projector; Llama
/// decoder with bias-free projections, RMSNorm weights, lm_head unless tied), from the config
/// alone, without allocating.
struct ParamCounts {
  int64_t vision_tower = 0, projector = 0, language_model = 0;
  int64_t total() const { return vision_tower + projector + language_model; }
};
ParamCounts param_counts(const VlmConfig& c);
inline int64_t num_params(const VlmConfig& c) { return param_counts(c).total(); }

/// Bytes that training holds before activations: `n_params` weights at `weight_bytes` each, plus
/// for the `trainable` ones a gradient and AdamW's two moments in the same dtype (libtorch's
/// AdamW keeps exp_avg / exp_avg_sq like the parameter). Activations come on top.
int64_t training_state_bytes(int64_t n_params, int64_t trainable, int64_t weight_bytes);

/// Checks cross-field rules (head counts divide, sizes positive, known activations).
/// Throws mmpost::Error (kUsage).
void validate(const VlmConfig& c);

}  // namespace mmpost::model
