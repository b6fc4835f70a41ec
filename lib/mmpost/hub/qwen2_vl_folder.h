// Qwen2-VL / Qwen2.5-VL model folders in the hub layout: config.json (either layout, see
// model/qwen2_vl_config.h), model.safetensors (or shards + index; hub or transformers 5 names),
// preprocessor_config.json (Qwen2VLImageProcessor), and the tokenizer files, which are copied
// byte for byte on save (tokenizer.json, tokenizer_config.json, chat_template.*, ...).
#pragma once

#include "mmpost/data/qwen2_vl_image.h"
#include "mmpost/model/qwen2_vl.h"

#include <torch/torch.h>

#include <filesystem>

namespace mmpost::hub {

/// A Qwen2-VL family folder, loaded.
struct Qwen2VLPretrained {
  model::Qwen2VLConfig config;
  model::Qwen2VL model{nullptr};
  data::Qwen2VLImageConfig image;      // preprocessor_config.json, else the class defaults
  bool has_processor_config = false;
};

/// True when DIR/config.json names the Qwen2-VL family (model_type qwen2_vl / qwen2_5_vl).
/// Throws Error(kUsage) when config.json exists but is not valid JSON.
bool is_qwen2_vl_folder(const std::filesystem::path& dir);

/// Loads DIR: config.json, weights (float32, CPU), preprocessor_config.json. Throws
/// Error(kUsage) for a missing or refused config or processor file, Error(kData) for weights
/// that do not match the config (every missing / unexpected / mis-shaped tensor listed).
Qwen2VLPretrained load_qwen2_vl_pretrained(const std::filesystem::path& dir);

/// Writes a folder transformers' from_pretrained loads: config.json (dtype = save_dtype),
/// model.safetensors in the hub layout (sharded above max_shard_bytes), preprocessor_config.json
/// for `image`, and the tokenizer files of `tokenizer_dir` copied unchanged (skipped when it is
/// empty or `dir` itself). Files are written atomically; throws Error(kRuntime) on write errors
/// (disk full: checked up front).
void save_qwen2_vl_pretrained(const std::filesystem::path& dir, const model::Qwen2VLImpl& model,
                              const data::Qwen2VLImageConfig& image,
                              const std::filesystem::path& tokenizer_dir,
                              torch::Dtype save_dtype = torch::kFloat32,
                              int64_t max_shard_bytes = int64_t{5} << 30);

}  // namespace mmpost::hub
