// Qwen2-VL / Qwen2.5-VL config.json <-> Qwen2VLConfig (see qwen2_vl_config.h). Field names and
// defaults follow transformers 5.24's configuration_qwen2_vl.py and configuration_qwen2_5_vl.py.
#include "mmpost/model/qwen2_vl_config.h"

#include "mmpost/core/check.h"
#include "mmpost/model/config_json.h"

#include <algorithm>
#include <set>

namespace mmpost::model {
namespace {

using nlohmann::json;
using detail::check_act;
using detail::check_keys;
using detail::read;

const std::set<std::string> kVision2Keys = {
    "depth", "embed_dim", "hidden_size", "hidden_act", "mlp_ratio", "num_heads", "in_channels",
    "in_chans", "patch_size", "spatial_patch_size", "spatial_merge_size", "temporal_patch_size",
    "rope_parameters"};
const std::set<std::string> kVision25Keys = {
    "depth", "hidden_size", "hidden_act", "intermediate_size", "num_heads", "in_channels",
    "in_chans", "patch_size", "spatial_patch_size", "spatial_merge_size", "temporal_patch_size",
    "tokens_per_second", "window_size", "out_hidden_size", "fullatt_block_indexes",
    "rope_parameters"};
const std::set<std::string> kQwenTextKeys = {
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "hidden_act", "max_position_embeddings", "rms_norm_eps",
    "use_sliding_window", "sliding_window", "max_window_layers", "layer_types",
    "attention_dropout", "rope_parameters", "rope_scaling", "rope_theta", "bos_token_id",
    "eos_token_id", "pad_token_id", "tie_word_embeddings"};
const std::set<std::string> kQwenTopKeys = {
    "text_config", "vision_config", "image_token_id", "video_token_id", "vision_start_token_id",
    "vision_end_token_id", "vision_token_id", "tie_word_embeddings",
    "num_labels",            // a reward model's head (hub/reward_model_folder reads it)
    "mmpost_reward_model"};  // the same loader's own block

// The rope settings of a text config: rope_parameters (transformers 5) or rope_scaling +
// rope_theta (the hub's Qwen2-VL files). rope_type "mrope" is transformers' old name for the
// default rotary kind with an mrope_section.
void read_rope(const json& j, const std::string& p, TextConfig& t) {
  read(j, "rope_theta", p, t.rope_theta);
  t.mrope_section = {16, 24, 24};  // Qwen2VLRotaryEmbedding's fallback
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) continue;
    const std::string q = p + key + ".";
    MMPOST_CHECK_USAGE(it->is_object(), "config.json: ", p, key, ": expected an object");
    for (const auto& [k, v] : it->items()) {
      MMPOST_CHECK_USAGE(k == "type" || k == "rope_type" || k == "mrope_section" ||
                             k == "rope_theta" || k == "mrope_interleaved",
                         "config.json: ", q, k, ": unknown key (supported: rope_type, ",
                         "rope_theta, mrope_section)");
    }
    std::string type = "default";
    read(*it, "type", q, type);
    read(*it, "rope_type", q, type);
    MMPOST_CHECK_USAGE(type == "default" || type == "mrope", "config.json: ", q,
                       "rope_type: unsupported \"", type, "\" (supported: default, mrope)");
    bool interleaved = false;
    read(*it, "mrope_interleaved", q, interleaved);
    MMPOST_CHECK_USAGE(!interleaved, "config.json: ", q,
                       "mrope_interleaved: unsupported true (Qwen2-VL and Qwen2.5-VL use the "
                       "chunked layout)");
    read(*it, "rope_theta", q, t.rope_theta);
    read(*it, "mrope_section", q, t.mrope_section);
  }
}

TextConfig qwen_text_from_json(const json& j, const std::string& p) {
  TextConfig t;  // Qwen2VLTextConfig's defaults
  t.vocab_size = 152064;
  t.hidden_size = 8192;
  t.intermediate_size = 29568;
  t.num_hidden_layers = 80;
  t.num_attention_heads = 64;
  t.num_key_value_heads = 8;
  t.hidden_act = "silu";
  t.max_position_embeddings = 32768;
  t.rms_norm_eps = 1e-5;
  t.rope_theta = 1e6;
  t.qkv_bias = true;
  read(j, "vocab_size", p, t.vocab_size);
  read(j, "hidden_size", p, t.hidden_size);
  read(j, "intermediate_size", p, t.intermediate_size);
  read(j, "num_hidden_layers", p, t.num_hidden_layers);
  read(j, "num_attention_heads", p, t.num_attention_heads);
  read(j, "num_key_value_heads", p, t.num_key_value_heads);
  MMPOST_CHECK_USAGE(t.num_attention_heads > 0, "config.json: ", p,
                     "num_attention_heads: must be positive, got ", t.num_attention_heads);
  t.head_dim = t.hidden_size / t.num_attention_heads;  // Qwen2VLAttention ignores head_dim
  int64_t head_dim = t.head_dim;
  read(j, "head_dim", p, head_dim);
  MMPOST_CHECK_USAGE(head_dim == t.head_dim, "config.json: ", p, "head_dim: unsupported ",
                     head_dim, " (Qwen2-VL's attention uses hidden_size / num_attention_heads = ",
                     t.head_dim, ")");
  read(j, "hidden_act", p, t.hidden_act);
  read(j, "max_position_embeddings", p, t.max_position_embeddings);
  read(j, "rms_norm_eps", p, t.rms_norm_eps);
  read(j, "tie_word_embeddings", p, t.tie_word_embeddings);
  bool sliding = false;
  read(j, "use_sliding_window", p, sliding);
  MMPOST_CHECK_USAGE(!sliding, "config.json: ", p,
                     "use_sliding_window: unsupported true (supported: false)");
  if (auto it = j.find("layer_types"); it != j.end() && !it->is_null()) {
    MMPOST_CHECK_USAGE(it->is_array(), "config.json: ", p, "layer_types: expected an array");
    for (const auto& lt : *it) {
      MMPOST_CHECK_USAGE(lt == "full_attention", "config.json: ", p, "layer_types: unsupported ",
                         lt.dump(), " (supported: full_attention)");
    }
  }
  read_rope(j, p, t);
  t.bos_token_id = 151643;
  t.pad_token_id = std::nullopt;
  t.eos_token_id = {151645};
  detail::read_token_ids(j, t);
  return t;
}

Qwen2VisionConfig vision_from_json(const json& j, Qwen2VLVariant variant) {
  const std::string p = "vision_config.";
  MMPOST_CHECK_USAGE(j.is_object(), "config.json: vision_config: expected an object");
  const bool v25 = variant == Qwen2VLVariant::kQwen2_5VL;
  if (auto it = j.find("model_type"); it != j.end()) {
    const std::string base = v25 ? "qwen2_5_vl" : "qwen2_vl";
    MMPOST_CHECK_USAGE(*it == base + "_vision" || *it == base,
                       "config.json: vision_config.model_type: unsupported ", it->dump(),
                       " (supported: ", base, "_vision)");
  }
  check_keys(j, v25 ? kVision25Keys : kVision2Keys, p);
  Qwen2VisionConfig v;
  read(j, "depth", p, v.depth);
  read(j, "num_heads", p, v.num_heads);
  read(j, "in_chans", p, v.in_channels);
  read(j, "in_channels", p, v.in_channels);
  read(j, "patch_size", p, v.patch_size);
  int64_t spatial_patch = v.patch_size;
  read(j, "spatial_patch_size", p, spatial_patch);
  MMPOST_CHECK_USAGE(spatial_patch == v.patch_size, "config.json: vision_config.",
                     "spatial_patch_size (", spatial_patch, ") must equal patch_size (",
                     v.patch_size, ")");
  read(j, "spatial_merge_size", p, v.spatial_merge_size);
  read(j, "temporal_patch_size", p, v.temporal_patch_size);
  if (v25) {  // Qwen2_5_VLVisionConfig
    v.embed_dim = 3584;
    v.out_hidden_size = 3584;
    v.intermediate_size = 3420;
    v.hidden_act = "silu";
    v.fullatt_block_indexes = {7, 15, 23, 31};
    read(j, "hidden_size", p, v.embed_dim);
    read(j, "out_hidden_size", p, v.out_hidden_size);
    read(j, "intermediate_size", p, v.intermediate_size);
    read(j, "window_size", p, v.window_size);
    read(j, "fullatt_block_indexes", p, v.fullatt_block_indexes);
    read(j, "tokens_per_second", p, v.tokens_per_second);
  } else {  // Qwen2VLVisionConfig
    read(j, "embed_dim", p, v.embed_dim);
    read(j, "hidden_size", p, v.out_hidden_size);
    read(j, "mlp_ratio", p, v.mlp_ratio);
    v.intermediate_size = v.embed_dim * v.mlp_ratio;
  }
  read(j, "hidden_act", p, v.hidden_act);
  if (auto it = j.find("rope_parameters"); it != j.end() && !it->is_null()) {
    MMPOST_CHECK_USAGE(it->is_object(), "config.json: vision_config.rope_parameters: ",
                       "expected an object");
    std::string type = "axial";
    read(*it, "rope_type", p + "rope_parameters.", type);
    MMPOST_CHECK_USAGE(type == "axial", "config.json: vision_config.rope_parameters.rope_type: ",
                       "unsupported \"", type, "\" (supported: axial)");
    read(*it, "rope_theta", p + "rope_parameters.", v.rope_theta);
  }
  return v;
}

}  // namespace

std::string Qwen2VLConfig::model_type() const {
  return variant == Qwen2VLVariant::kQwen2_5VL ? "qwen2_5_vl" : "qwen2_vl";
}

bool is_qwen2_vl_config(const json& j) {
  auto it = j.find("model_type");
  return j.is_object() && it != j.end() && (*it == "qwen2_vl" || *it == "qwen2_5_vl");
}

void validate(const Qwen2VLConfig& c) {
  const auto& v = c.vision_config;
  const auto& t = c.text_config;
  MMPOST_CHECK_USAGE(v.depth > 0 && v.num_heads > 0 && v.embed_dim % v.num_heads == 0 &&
                         v.head_dim() % 4 == 0,
                     "config.json: vision_config: the width (", v.embed_dim,
                     ") must be a multiple of num_heads (", v.num_heads,
                     ") with a head size divisible by 4 (2-D rotary positions)");
  MMPOST_CHECK_USAGE(v.patch_size > 0 && v.spatial_merge_size > 0 && v.temporal_patch_size > 0,
                     "config.json: vision_config: patch_size, spatial_merge_size and ",
                     "temporal_patch_size must be positive");
  MMPOST_CHECK_USAGE(v.out_hidden_size == t.hidden_size, "config.json: vision_config.",
                     c.variant == Qwen2VLVariant::kQwen2_5VL ? "out_hidden_size" : "hidden_size",
                     " (", v.out_hidden_size, ") must equal text_config.hidden_size (",
                     t.hidden_size, "): the merger's output goes into the language model");
  for (int64_t i : v.fullatt_block_indexes) {
    MMPOST_CHECK_USAGE(i >= 0 && i < v.depth, "config.json: vision_config.fullatt_block_indexes: ",
                       i, " is out of range for depth ", v.depth);
  }
  if (c.variant == Qwen2VLVariant::kQwen2_5VL) {
    MMPOST_CHECK_USAGE(v.window_size >= v.patch_size * v.spatial_merge_size,
                       "config.json: vision_config.window_size (", v.window_size,
                       ") must be at least patch_size * spatial_merge_size (",
                       v.patch_size * v.spatial_merge_size, ")");
  }
  check_act(v.hidden_act, "vision_config.hidden_act");
  check_act(t.hidden_act, "text_config.hidden_act");
  MMPOST_CHECK_USAGE(t.num_key_value_heads > 0 &&
                         t.num_attention_heads % t.num_key_value_heads == 0,
                     "config.json: text_config.num_attention_heads (", t.num_attention_heads,
                     ") must be a multiple of num_key_value_heads (", t.num_key_value_heads, ")");
  MMPOST_CHECK_USAGE(t.head_dim > 0 && t.head_dim % 2 == 0 &&
                         t.head_dim * t.num_attention_heads == t.hidden_size,
                     "config.json: text_config.hidden_size (", t.hidden_size,
                     ") must be an even head size times num_attention_heads (",
                     t.num_attention_heads, ")");
  int64_t total = 0;
  for (int64_t s : t.mrope_section) {
    MMPOST_CHECK_USAGE(s >= 0, "config.json: text_config.rope_parameters.mrope_section: ",
                       "negative entry ", s);
    total += s;
  }
  MMPOST_CHECK_USAGE(t.mrope_section.size() == 3 && total == t.head_dim / 2,
                     "config.json: text_config.rope_parameters.mrope_section: must be 3 entries "
                     "(temporal, height, width) summing to head_dim / 2 = ",
                     t.head_dim / 2, ", got ", nlohmann::json(t.mrope_section).dump());
  for (int64_t id : {c.image_token_id, c.vision_start_token_id, c.vision_end_token_id}) {
    MMPOST_CHECK_USAGE(id >= 0 && id < t.vocab_size, "config.json: image/vision token id ", id,
                       " is outside the vocabulary (", t.vocab_size, ")");
  }
}

Qwen2VLConfig qwen2_vl_config_from_json(const json& j) {
  MMPOST_CHECK_USAGE(j.is_object(), "config.json: expected a JSON object");
  Qwen2VLConfig c;
  const std::string type = j.value("model_type", "");
  MMPOST_CHECK_USAGE(type == "qwen2_vl" || type == "qwen2_5_vl",
                     "config.json: model_type: unsupported \"", type,
                     "\" (supported: qwen2_vl, qwen2_5_vl)");
  c.variant = type == "qwen2_5_vl" ? Qwen2VLVariant::kQwen2_5VL : Qwen2VLVariant::kQwen2VL;
  const bool nested = j.contains("text_config") && !j["text_config"].is_null();
  std::set<std::string> top = kQwenTopKeys;
  if (!nested) top.insert(kQwenTextKeys.begin(), kQwenTextKeys.end());  // the hub's flat layout
  check_keys(j, top, "");
  if (nested) {
    const auto& tj = j["text_config"];
    MMPOST_CHECK_USAGE(tj.is_object(), "config.json: text_config: expected an object");
    if (auto it = tj.find("model_type"); it != tj.end()) {
      MMPOST_CHECK_USAGE(*it == type + "_text" || *it == type, "config.json: ",
                         "text_config.model_type: unsupported ", it->dump(), " (supported: ",
                         type, "_text)");
    }
    check_keys(tj, kQwenTextKeys, "text_config.");
    c.text_config = qwen_text_from_json(tj, "text_config.");
  } else {
    json flat = json::object();
    for (const auto& [k, v] : j.items()) {
      if (kQwenTextKeys.count(k)) flat[k] = v;
    }
    c.text_config = qwen_text_from_json(flat, "");
  }
  if (auto it = j.find("vision_config"); it != j.end() && !it->is_null()) {
    c.vision_config = vision_from_json(*it, c.variant);
  } else {
    c.vision_config = vision_from_json(json::object(), c.variant);
  }
  read(j, "image_token_id", "", c.image_token_id);
  read(j, "video_token_id", "", c.video_token_id);
  read(j, "vision_start_token_id", "", c.vision_start_token_id);
  read(j, "vision_end_token_id", "", c.vision_end_token_id);
  read(j, "tie_word_embeddings", "", c.tie_word_embeddings);
  c.tie_word_embeddings = c.tie_word_embeddings || c.text_config.tie_word_embeddings;
  read(j, "torch_dtype", "", c.torch_dtype);
  read(j, "dtype", "", c.torch_dtype);
  validate(c);
  return c;
}

json qwen2_vl_config_to_json(const Qwen2VLConfig& c) {
  const auto& v = c.vision_config;
  const auto& t = c.text_config;
  const bool v25 = c.variant == Qwen2VLVariant::kQwen2_5VL;
  const std::string type = c.model_type();
  json vision = {{"model_type", type + "_vision"},
                 {"depth", v.depth},
                 {"hidden_act", v.hidden_act},
                 {"num_heads", v.num_heads},
                 {"in_channels", v.in_channels},
                 {"patch_size", v.patch_size},
                 {"spatial_merge_size", v.spatial_merge_size},
                 {"temporal_patch_size", v.temporal_patch_size},
                 {"rope_parameters", {{"rope_type", "axial"}, {"rope_theta", v.rope_theta}}}};
  if (v25) {
    vision["hidden_size"] = v.embed_dim;
    vision["out_hidden_size"] = v.out_hidden_size;
    vision["intermediate_size"] = v.intermediate_size;
    vision["window_size"] = v.window_size;
    vision["fullatt_block_indexes"] = v.fullatt_block_indexes;
    vision["tokens_per_second"] = v.tokens_per_second;
  } else {
    vision["embed_dim"] = v.embed_dim;
    vision["hidden_size"] = v.out_hidden_size;
    vision["mlp_ratio"] = v.mlp_ratio;
  }
  json rope = {{"rope_type", "default"},
               {"rope_theta", t.rope_theta},
               {"mrope_section", t.mrope_section}};
  json text = {{"model_type", type + "_text"},
               {"vocab_size", t.vocab_size},
               {"hidden_size", t.hidden_size},
               {"intermediate_size", t.intermediate_size},
               {"num_hidden_layers", t.num_hidden_layers},
               {"num_attention_heads", t.num_attention_heads},
               {"num_key_value_heads", t.num_key_value_heads},
               {"hidden_act", t.hidden_act},
               {"rms_norm_eps", t.rms_norm_eps},
               {"max_position_embeddings", t.max_position_embeddings},
               {"rope_parameters", rope},
               {"use_sliding_window", false},
               {"tie_word_embeddings", c.tie_word_embeddings}};
  detail::write_token_ids(t, text);
  return {{"architectures",
           {v25 ? "Qwen2_5_VLForConditionalGeneration" : "Qwen2VLForConditionalGeneration"}},
          {"model_type", type},
          {"text_config", text},
          {"vision_config", vision},
          {"image_token_id", c.image_token_id},
          {"video_token_id", c.video_token_id},
          {"vision_start_token_id", c.vision_start_token_id},
          {"vision_end_token_id", c.vision_end_token_id},
          {"tie_word_embeddings", c.tie_word_embeddings},
          {"dtype", c.torch_dtype}};
}

}  // namespace mmpost::model
