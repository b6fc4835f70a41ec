// LLaVA config.json <-> VlmConfig. Field names and defaults follow transformers' LlavaConfig,
// CLIPVisionConfig and LlamaConfig; keys HF writes that do not change the math (initializer_range,
// use_cache, ...) are ignored on read, and anything we do not implement is refused by name.
#include "mmpost/model/config.h"
#include "mmpost/model/config_json.h"
#include "mmpost/model/qwen2_vl_config.h"

#include "mmpost/config/schema.h"
#include "mmpost/core/check.h"

#include <algorithm>
#include <set>

namespace mmpost::model {
namespace detail {

using nlohmann::json;

namespace {
const std::vector<std::string> kSupportedActs = {"silu", "gelu", "gelu_pytorch_tanh", "quick_gelu"};

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}
}  // namespace

void check_act(const std::string& act, const std::string& field) {
  MMPOST_CHECK_USAGE(std::find(kSupportedActs.begin(), kSupportedActs.end(), act) !=
                         kSupportedActs.end(),
                     "config.json: ", field, ": unsupported \"", act,
                     "\" (supported: ", joined(kSupportedActs), ")");
}

void check_model_type(const json& j, const std::string& field, const std::string& expected) {
  auto it = j.find("model_type");
  if (it == j.end()) return;
  MMPOST_CHECK_USAGE(it->is_string() && it->get<std::string>() == expected, "config.json: ", field,
                     ".model_type: unsupported ", it->dump(), " (supported: ", expected, ")");
}

// ---- keys: read, or known not to change the math ---------------------------------------------
// transformers' PretrainedConfig writes these into every config (generation defaults,
// bookkeeping, label maps); none changes a forward pass of the models mmpost builds.
const std::set<std::string> kInertCommon = {
    "_name_or_path", "transformers_version", "architectures", "model_type", "torch_dtype", "dtype",
    "_attn_implementation", "_attn_implementation_autoset", "attn_implementation", "return_dict",
    "output_hidden_states", "output_attentions", "torchscript", "use_bfloat16", "tf_legacy_loss",
    "pruned_heads", "chunk_size_feed_forward", "is_encoder_decoder", "is_decoder",
    "cross_attention_hidden_size", "add_cross_attention", "tie_encoder_decoder", "max_length",
    "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
    "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty",
    "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
    "num_return_sequences", "output_scores", "return_dict_in_generate", "forced_bos_token_id",
    "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty",
    "suppress_tokens", "begin_suppress_tokens", "finetuning_task", "id2label", "label2id",
    "tokenizer_class", "prefix", "sep_token_id", "decoder_start_token_id", "task_specific_params",
    "problem_type", "initializer_range", "initializer_factor", "use_cache"};
const std::set<std::string> kVisionKeys = {  // read, plus CLIPVisionConfig's inert ones
    "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_channels",
    "image_size", "patch_size", "hidden_act", "layer_norm_eps", "projection_dim",
    "dropout", "attention_dropout"};
const std::set<std::string> kTextKeys = {  // read, plus LlamaConfig's inert ones
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "hidden_act", "rms_norm_eps", "max_position_embeddings",
    "tie_word_embeddings", "rope_theta", "rope_scaling", "rope_parameters", "attention_bias",
    "mlp_bias", "bos_token_id", "pad_token_id", "eos_token_id",
    "pretraining_tp", "attention_dropout"};
const std::set<std::string> kTopKeys = {  // read, plus LlavaConfig's inert ones
    "vision_config", "text_config", "image_token_index", "image_seq_length",
    "vision_feature_layer", "vision_feature_select_strategy", "projector_hidden_act",
    "multimodal_projector_bias", "tie_word_embeddings",
    "ignore_index", "pad_token_id", "bos_token_id", "eos_token_id", "vocab_size",
    "num_labels",            // a reward model's head (hub/reward_model_folder reads it)
    "mmpost_reward_model"};  // the same loader's own block

/// Refuses a key of object `j` (at JSON path `path`, e.g. "vision_config.") that is neither in
/// `known` nor in kInertCommon, naming the closest known key.
void check_keys(const json& j, const std::set<std::string>& known, const std::string& path) {
  for (const auto& [key, value] : j.items()) {
    if (known.count(key) || kInertCommon.count(key)) continue;
    const std::string best =
        config::closest_key(key, std::vector<std::string>(known.begin(), known.end()));
    throw Error(ErrorKind::kUsage,
                "config.json: " + path + key + ": unknown key (mmpost does not read it, and it is "
                "not one of transformers' keys known to leave the model unchanged)",
                best.empty() ? "remove it, or report it if transformers uses it"
                             : "did you mean \"" + path + best + "\"?");
  }
}

void read_token_ids(const json& j, TextConfig& t) {
  auto optional_id = [&](const char* key, std::optional<int64_t>& out) {
    if (auto it = j.find(key); it != j.end())
      out = it->is_null() ? std::nullopt : std::optional<int64_t>(it->get<int64_t>());
  };
  optional_id("bos_token_id", t.bos_token_id);
  optional_id("pad_token_id", t.pad_token_id);
  if (auto it = j.find("eos_token_id"); it != j.end()) {
    t.eos_token_id.clear();
    if (it->is_array()) {
      for (const auto& e : *it) t.eos_token_id.push_back(e.get<int64_t>());
    } else if (!it->is_null()) {
      t.eos_token_id.push_back(it->get<int64_t>());
    }
  }
}

void write_token_ids(const TextConfig& t, json& text) {
  text["bos_token_id"] = t.bos_token_id ? json(*t.bos_token_id) : json(nullptr);
  text["pad_token_id"] = t.pad_token_id ? json(*t.pad_token_id) : json(nullptr);
  text["eos_token_id"] = t.eos_token_id.size() == 1 ? json(t.eos_token_id[0]) : json(t.eos_token_id);
}

}  // namespace detail

namespace {

using nlohmann::json;
using detail::check_act;
using detail::check_keys;
using detail::check_model_type;
using detail::kInertCommon;
using detail::read;
using detail::kTextKeys;
using detail::kTopKeys;
using detail::kVisionKeys;

VisionConfig vision_from_json(const json& j) {
  const std::string p = "vision_config.";
  MMPOST_CHECK_USAGE(j.is_object(), "config.json: vision_config: expected an object");
  check_model_type(j, "vision_config", "clip_vision_model");
  check_keys(j, kVisionKeys, p);
  VisionConfig v;
  read(j, "hidden_size", p, v.hidden_size);
  read(j, "intermediate_size", p, v.intermediate_size);
  read(j, "num_hidden_layers", p, v.num_hidden_layers);
  read(j, "num_attention_heads", p, v.num_attention_heads);
  read(j, "num_channels", p, v.num_channels);
  read(j, "image_size", p, v.image_size);
  read(j, "patch_size", p, v.patch_size);
  read(j, "hidden_act", p, v.hidden_act);
  read(j, "layer_norm_eps", p, v.layer_norm_eps);
  read(j, "projection_dim", p, v.projection_dim);
  return v;
}

TextConfig text_from_json(const json& j) {
  const std::string p = "text_config.";
  MMPOST_CHECK_USAGE(j.is_object(), "config.json: text_config: expected an object");
  check_model_type(j, "text_config", "llama");
  check_keys(j, kTextKeys, p);
  TextConfig t;
  read(j, "vocab_size", p, t.vocab_size);
  read(j, "hidden_size", p, t.hidden_size);
  read(j, "intermediate_size", p, t.intermediate_size);
  read(j, "num_hidden_layers", p, t.num_hidden_layers);
  read(j, "num_attention_heads", p, t.num_attention_heads);
  t.num_key_value_heads = t.num_attention_heads;
  read(j, "num_key_value_heads", p, t.num_key_value_heads);
  MMPOST_CHECK_USAGE(t.num_attention_heads > 0, "config.json: text_config.num_attention_heads: ",
                     "must be positive, got ", t.num_attention_heads);
  t.head_dim = t.hidden_size / t.num_attention_heads;
  read(j, "head_dim", p, t.head_dim);
  read(j, "hidden_act", p, t.hidden_act);
  read(j, "rms_norm_eps", p, t.rms_norm_eps);
  read(j, "max_position_embeddings", p, t.max_position_embeddings);
  read(j, "tie_word_embeddings", p, t.tie_word_embeddings);
  // transformers < 5 writes rope_theta + rope_scaling; >= 5 writes rope_parameters.
  read(j, "rope_theta", p, t.rope_theta);
  if (auto it = j.find("rope_scaling"); it != j.end())
    MMPOST_CHECK_USAGE(it->is_null(), "config.json: text_config.rope_scaling: unsupported ",
                       it->dump(), " (supported: null)");
  if (auto it = j.find("rope_parameters"); it != j.end() && !it->is_null()) {
    MMPOST_CHECK_USAGE(it->is_object(),
                       "config.json: text_config.rope_parameters: expected an object");
    std::string rope_type = "default";
    read(*it, "rope_type", p + "rope_parameters.", rope_type);
    MMPOST_CHECK_USAGE(rope_type == "default",
                       "config.json: text_config.rope_parameters.rope_type: ",
                       "unsupported \"", rope_type, "\" (supported: default)");
    read(*it, "rope_theta", p + "rope_parameters.", t.rope_theta);
  }
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    bool on = false;
    read(j, key, p, on);
    MMPOST_CHECK_USAGE(!on, "config.json: text_config.", key,
                       ": unsupported true (supported: false)");
  }
  detail::read_token_ids(j, t);
  return t;
}

}  // namespace

TextConfig causal_lm_config_from_json(const json& j, const std::string& where) {
  MMPOST_CHECK_USAGE(j.is_object(), where, ": expected a JSON object");
  if (auto it = j.find("architectures"); it != j.end() && it->is_array()) {
    for (const auto& a : *it) {
      MMPOST_CHECK_USAGE(a == "LlamaForCausalLM", where, ": architectures: unsupported ",
                         a.dump(), " (supported: LlamaForCausalLM)");
    }
  }
  json text = j;
  // Keys of a causal LM's top level that a LLaVA text_config does not carry.
  for (const char* key : {"architectures", "unk_token_id", "_model_name_or_path"}) text.erase(key);
  try {
    TextConfig t = text_from_json(text);
    VlmConfig probe;  // the cross-field rules
    probe.text_config = t;
    probe.vision_config.image_size = probe.vision_config.patch_size;
    validate(probe);
    return t;
  } catch (const Error& e) {
    std::string m = e.message();
    const std::string prefix = "config.json: text_config.";
    if (m.rfind(prefix, 0) == 0) m = where + ": " + m.substr(prefix.size());
    std::string h = e.hint();
    if (auto pos = h.find("\"text_config."); pos != std::string::npos) h.erase(pos + 1, 12);
    throw Error(e.kind(), m, h);
  }
}

int64_t VlmConfig::n_image_tokens() const {
  return vision_config.n_patches() + (vision_feature_select_strategy == "full" ? 1 : 0);
}

void validate(const VlmConfig& c) {
  const auto& v = c.vision_config;
  const auto& t = c.text_config;
  MMPOST_CHECK_USAGE(v.hidden_size > 0 && v.num_attention_heads > 0 &&
                         v.hidden_size % v.num_attention_heads == 0,
                     "config.json: vision_config.hidden_size (", v.hidden_size,
                     ") must be a positive multiple of num_attention_heads (",
                     v.num_attention_heads, ")");
  MMPOST_CHECK_USAGE(v.patch_size > 0 && v.image_size % v.patch_size == 0,
                     "config.json: vision_config.image_size (", v.image_size,
                     ") must be a multiple of patch_size (", v.patch_size, ")");
  MMPOST_CHECK_USAGE(t.num_key_value_heads > 0 &&
                         t.num_attention_heads % t.num_key_value_heads == 0,
                     "config.json: text_config.num_attention_heads (", t.num_attention_heads,
                     ") must be a multiple of num_key_value_heads (", t.num_key_value_heads, ")");
  MMPOST_CHECK_USAGE(t.head_dim > 0 && t.head_dim % 2 == 0, "config.json: text_config.head_dim: ",
                     "must be positive and even (rotary embedding), got ", t.head_dim);
  check_act(v.hidden_act, "vision_config.hidden_act");
  check_act(t.hidden_act, "text_config.hidden_act");
  check_act(c.projector_hidden_act, "projector_hidden_act");
  MMPOST_CHECK_USAGE(
      c.vision_feature_select_strategy == "default" || c.vision_feature_select_strategy == "full",
      "config.json: vision_feature_select_strategy: unsupported \"",
      c.vision_feature_select_strategy,
      "\" (supported: default, full)");
  const int64_t n_states = v.num_hidden_layers + 1;
  MMPOST_CHECK_USAGE(c.vision_feature_layer >= -n_states && c.vision_feature_layer < n_states,
                     "config.json: vision_feature_layer: ", c.vision_feature_layer,
                     " is out of range for ", v.num_hidden_layers, " vision layers");
}

VlmConfig vlm_config_from_json(const json& j, const std::string& where) {
  if (where != "config.json") {  // the same checks, with messages naming `where`
    try {
      return vlm_config_from_json(j);
    } catch (const Error& e) {
      std::string m = e.message();
      if (m.rfind("config.json: ", 0) == 0) {  // "config.json: PATH: why" -> "WHERE.PATH: why"
        const std::string rest = m.substr(13);
        const bool path_first = rest.find(':') < rest.find(' ');
        m = where + (path_first ? "." : ": ") + rest;
      }
      std::string h = e.hint();
      if (h.rfind("did you mean \"", 0) == 0) h.insert(14, where + ".");
      throw Error(e.kind(), m, h);
    }
  }
  MMPOST_CHECK_USAGE(j.is_object(), "config.json: expected a JSON object");
  MMPOST_CHECK_USAGE(!is_qwen2_vl_config(j), "config.json: model_type \"",
                     j.value("model_type", ""), "\" is the Qwen2-VL family: mmpost loads and runs "
                     "it (model::Qwen2VL, at parity with transformers) but its stages take LLaVA "
                     "folders only so far",
                     "\n  hint: README.md, \"The Qwen2-VL family (in progress)\"");
  check_model_type(j, "(top level)", "llava");
  check_keys(j, kTopKeys, "");
  VlmConfig c;
  if (auto it = j.find("vision_config"); it != j.end() && !it->is_null()) {
    c.vision_config = vision_from_json(*it);
  } else {  // LlavaConfig.sub_configs_defaults: CLIP ViT-L/14 at 336 px
    c.vision_config = {.hidden_size = 1024, .intermediate_size = 4096, .num_hidden_layers = 24,
                       .num_attention_heads = 16, .image_size = 336, .patch_size = 14,
                       .projection_dim = 768};
  }
  if (auto it = j.find("text_config"); it != j.end() && !it->is_null())
    c.text_config = text_from_json(*it);
  read(j, "image_token_index", "", c.image_token_index);
  read(j, "image_seq_length", "", c.image_seq_length);
  if (auto it = j.find("vision_feature_layer"); it != j.end())
    MMPOST_CHECK_USAGE(it->is_number_integer(), "config.json: vision_feature_layer: unsupported ",
                       it->dump(), " (supported: one integer layer index)");
  read(j, "vision_feature_layer", "", c.vision_feature_layer);
  read(j, "vision_feature_select_strategy", "", c.vision_feature_select_strategy);
  read(j, "projector_hidden_act", "", c.projector_hidden_act);
  read(j, "multimodal_projector_bias", "", c.multimodal_projector_bias);
  read(j, "tie_word_embeddings", "", c.tie_word_embeddings);
  c.tie_word_embeddings = c.tie_word_embeddings || c.text_config.tie_word_embeddings;
  read(j, "torch_dtype", "", c.torch_dtype);
  read(j, "dtype", "", c.torch_dtype);  // transformers >= 5 writes "dtype"
  validate(c);
  return c;
}

json vlm_config_to_json(const VlmConfig& c) {
  const auto& v = c.vision_config;
  const auto& t = c.text_config;
  json vision = {{"model_type", "clip_vision_model"},
                 {"hidden_size", v.hidden_size},
                 {"intermediate_size", v.intermediate_size},
                 {"num_hidden_layers", v.num_hidden_layers},
                 {"num_attention_heads", v.num_attention_heads},
                 {"num_channels", v.num_channels},
                 {"image_size", v.image_size},
                 {"patch_size", v.patch_size},
                 {"hidden_act", v.hidden_act},
                 {"layer_norm_eps", v.layer_norm_eps},
                 {"projection_dim", v.projection_dim}};
  json text = {{"model_type", "llama"},
               {"vocab_size", t.vocab_size},
               {"hidden_size", t.hidden_size},
               {"intermediate_size", t.intermediate_size},
               {"num_hidden_layers", t.num_hidden_layers},
               {"num_attention_heads", t.num_attention_heads},
               {"num_key_value_heads", t.num_key_value_heads},
               {"head_dim", t.head_dim},
               {"hidden_act", t.hidden_act},
               {"rms_norm_eps", t.rms_norm_eps},
               // Both spellings: transformers < 5 reads rope_theta, >= 5 rope_parameters.
               {"rope_theta", t.rope_theta},
               {"rope_scaling", nullptr},
               {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", t.rope_theta}}},
               {"attention_bias", false},
               {"mlp_bias", false},
               {"max_position_embeddings", t.max_position_embeddings},
               {"tie_word_embeddings", t.tie_word_embeddings}};
  detail::write_token_ids(t, text);
  return {{"architectures", {"LlavaForConditionalGeneration"}},
          {"model_type", "llava"},
          {"vision_config", vision},
          {"text_config", text},
          {"image_token_index", c.image_token_index},
          {"image_seq_length", c.image_seq_length},
          {"vision_feature_layer", c.vision_feature_layer},
          {"vision_feature_select_strategy", c.vision_feature_select_strategy},
          {"projector_hidden_act", c.projector_hidden_act},
          {"multimodal_projector_bias", c.multimodal_projector_bias},
          {"tie_word_embeddings", c.tie_word_embeddings},
          {"torch_dtype", c.torch_dtype},
          {"dtype", c.torch_dtype}};
}

ParamCounts param_counts(const VlmConfig& c) {
  const auto& v = c.vision_config;
  const auto& t = c.text_config;
  const int64_t D = v.hidden_size, H = t.hidden_size;
  ParamCounts n;
  n.vision_tower = D + v.num_channels * v.patch_size * v.patch_size * D + (v.n_patches() + 1) * D +
                   2 * 2 * D +  // pre_layrnorm, post_layernorm
                   v.num_hidden_layers * (4 * (D * D + D) + 2 * 2 * D +  // attention, layer norms
                                          D * v.intermediate_size + v.intermediate_size +  // fc1
                                          v.intermediate_size * D + D);                    // fc2
  const int64_t pb = c.multimodal_projector_bias ? 1 : 0;
  n.projector = D * H + pb * H + H * H + pb * H;
  const int64_t q = t.num_attention_heads * t.head_dim, kv = t.num_key_value_heads * t.head_dim;
  n.language_model = t.vocab_size * H * (c.tie_word_embeddings ? 1 : 2) +
                     t.num_hidden_layers * (H * q + 2 * H * kv + q * H +
                                            3 * H * t.intermediate_size + 2 * H) +
                     H;  // final norm
  return n;
}

int64_t training_state_bytes(int64_t n_params, int64_t trainable, int64_t weight_bytes) {
  return n_params * weight_bytes + trainable * 3 * weight_bytes;
}

}  // namespace mmpost::model
