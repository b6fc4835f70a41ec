// Shared helpers of the config.json readers (config.cpp for LLaVA, qwen2_vl_config.cpp for
// Qwen2-VL): typed reads that name the JSON path, the refusal of unknown keys with the closest
// known one, and the transformers keys known not to change a forward pass. Messages start with
// "config.json: PATH" (vlm_config_from_json rewrites the prefix for other sources).
#pragma once

#include "mmpost/core/check.h"
#include "mmpost/model/config.h"

#include <nlohmann/json.hpp>

#include <set>
#include <string>
#include <type_traits>

namespace mmpost::model::detail {

/// Reads j[key] into `out` when present and not null; a wrong type throws Error(kUsage) naming
/// `path` + key and the value found.
template <typename T>
void read(const nlohmann::json& j, const std::string& key, const std::string& path, T& out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return;
  try {
    out = it->get<T>();
  } catch (const nlohmann::json::exception&) {
    throw Error(ErrorKind::kUsage, "config.json: " + path + key + ": expected " +
                                       (std::is_same_v<T, std::string> ? "a string"
                                        : std::is_same_v<T, bool>      ? "a boolean"
                                        : std::is_arithmetic_v<T>      ? "a number"
                                                                       : "an array") +
                                       ", got " + it->dump());
  }
}

/// transformers' PretrainedConfig keys that change no forward pass (generation defaults,
/// bookkeeping, label maps).
extern const std::set<std::string> kInertCommon;
/// Keys of LLaVA's CLIP vision_config, Llama text_config and top level (read or inert).
extern const std::set<std::string> kVisionKeys, kTextKeys, kTopKeys;

/// Refuses a key of object `j` (at JSON path `path`, e.g. "vision_config.") that is neither in
/// `known` nor in kInertCommon, naming the closest known key. Throws Error(kUsage).
void check_keys(const nlohmann::json& j, const std::set<std::string>& known,
                const std::string& path);
/// Refuses an activation mmpost does not implement (Error kUsage naming `field`).
void check_act(const std::string& act, const std::string& field);
/// Refuses j["model_type"] (when present) other than `expected` (Error kUsage naming `field`).
void check_model_type(const nlohmann::json& j, const std::string& field,
                      const std::string& expected);

/// Reads bos_token_id / pad_token_id (null = none) and eos_token_id (one id or a list) into
/// `t` where present.
void read_token_ids(const nlohmann::json& j, TextConfig& t);
/// Writes them back in the same form (one eos id as a number, several as a list).
void write_token_ids(const TextConfig& t, nlohmann::json& text);

}  // namespace mmpost::model::detail
