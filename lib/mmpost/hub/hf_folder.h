// Hugging Face model folders (hub layer): config.json + model.safetensors (or shards + index) +
// tokenizer.model + tokenizer_config.json/special_tokens_map.json + preprocessor_config.json.
// The one place that assembles a model bundle (model, tokenizer path, image settings) from a
// folder and writes it back so transformers, vLLM and mmpost all read the result. It sits above
// model/ and data/ because it joins them; io/ below it only knows files and tensors.
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "mmpost/data/image.h"
#include "mmpost/data/tokenizer.h"
#include "mmpost/model/lora.h"
#include "mmpost/model/vlm.h"

namespace mmpost::hub {

/// A model folder, loaded.
struct Pretrained {
  model::VlmConfig config;
  model::Vlm model{nullptr};
  std::filesystem::path tokenizer_path;  // tokenizer.model, else tokenizer.json, else empty
  data::ImageProcessorConfig image;      // preprocessor_config.json, else processor_config.json's
                                         // "image_processor" (transformers 5), else defaults
  bool has_processor_config = false;     // the folder had either file
};

/// Parses a JSON file; throws Error(kUsage) naming the path when it cannot be opened or parsed.
nlohmann::json read_json(const std::filesystem::path& path);

/// Reads DIR/config.json alone (nothing allocated). Throws Error(kUsage) naming the file.
model::VlmConfig read_model_config(const std::filesystem::path& dir);

/// Loads DIR: config.json (HF names), weights (safetensors, both LLaVA name layouts), tokenizer
/// and preprocessor settings; the model is float32 on the CPU. A PEFT LoRA adapter in DIR (an
/// mmpost LoRA run's output) is merged into the weights unless `merge_adapter` is false.
/// Throws Error(kUsage) for a missing folder or config, Error(kRuntime) for weight problems
/// (missing/unexpected/shape, listed).
Pretrained load_pretrained(const std::filesystem::path& dir, bool merge_adapter = true);

/// True when DIR holds a PEFT LoRA adapter (adapter_config.json + adapter_model.safetensors).
bool has_lora_adapter(const std::filesystem::path& dir);

/// The LoRA settings of DIR/adapter_config.json (PEFT's LoraConfig). Throws Error(kUsage)
/// naming the file for another peft_type or options mmpost does not reproduce (DoRA,
/// rank/alpha patterns, layers_to_transform, fan_in_fan_out).
model::LoraSettings read_lora_settings(const std::filesystem::path& dir);

/// Merges DIR's LoRA adapter into `model` (W += s B A; PEFT merge_and_unload). Throws
/// Error(kUsage)/(kData) naming the file when the adapter does not fit the model.
void merge_lora_adapter(model::VlmImpl& model, const std::filesystem::path& dir);

/// Writes `adapters` in PEFT's format into DIR: adapter_model.safetensors (lora_A/lora_B under
/// PEFT keys, plus every parameter of the `modules_to_save` parts as
/// "base_model.model.<transformers path>") and adapter_config.json. Atomic files; throws
/// Error(kRuntime).
void save_lora_adapter(const std::filesystem::path& dir, const model::VlmImpl& model,
                       const model::LoraAdapters& adapters,
                       const std::vector<std::string>& modules_to_save,
                       const std::string& base_model);

/// Registers the HF "added tokens" of a tokenizer folder with `tok`: tokenizer.json's
/// "added_tokens" (what transformers 5 save_pretrained writes) and tokenizer_config.json's
/// "added_tokens_decoder" (transformers 4.x, e.g. llava-hf's <image> = 32000, <pad> = 32001).
/// The sentencepiece control tokens (<unk>, <s>, </s>) stay the model's own. Sets the pad id
/// when tokenizer_config.json names a pad_token. Missing files are skipped. Throws Error(kUsage)
/// naming the file for invalid JSON or an id that contradicts the sentencepiece model.
void add_hf_added_tokens(data::Tokenizer& tok, const std::filesystem::path& dir);

/// The tokenizer file of folder DIR: tokenizer.model (sentencepiece) if present, else
/// tokenizer.json (byte-level BPE), else empty.
std::filesystem::path find_tokenizer(const std::filesystem::path& dir);

/// Loads a tokenizer file (tokenizer.model or tokenizer.json) and applies add_hf_added_tokens
/// with the files beside it: added tokens, BOS from the post_processor, for a tokenizer.json the
/// bos/eos/unk/pad tokens named in tokenizer_config.json (an EOS is required), and the chat
/// template (tokenizer_config.json "chat_template", chat_template.jinja, chat_template.json).
/// Throws Error(kUsage) naming the file.
std::unique_ptr<data::Tokenizer> load_tokenizer(const std::filesystem::path& file);

/// Writes a model folder (atomic files): config.json, model.safetensors (float32 unless
/// `save_dtype` says otherwise; sharded above max_shard_bytes), tokenizer.model (from
/// `tokenizer`'s bytes in memory when given, else copied from `tokenizer_path`), tokenizer_config.json, special_tokens_map.json, preprocessor_config.json.
/// `tokenizer` (optional) adds its added tokens (ids beyond the sentencepiece model, e.g.
/// <image>) to tokenizer_config.json's added_tokens_decoder so transformers restores them.
void save_pretrained(const std::filesystem::path& dir, model::Vlm& model,
                     const std::filesystem::path& tokenizer_path,
                     const data::ImageProcessorConfig& image,
                     torch::Dtype save_dtype = torch::kFloat32,
                     int64_t max_shard_bytes = int64_t{5} << 30,
                     const data::Tokenizer* tokenizer = nullptr);

}  // namespace mmpost::hub
