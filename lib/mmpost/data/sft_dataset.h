// SFT samples from TRL conversational JSONL: {"id", "images": [...], "messages": [...]}. One
// record -> input_ids, labels and pixel_values; every problem is an Error(kData) naming
// FILE:LINE (the physical line), which the loader turns into a counted skip or a hard error.
#pragma once

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <filesystem>
#include <string>
#include <vector>

#include "mmpost/data/chat_template.h"
#include "mmpost/data/image.h"
#include "mmpost/data/tokenizer.h"


namespace mmpost::data {

/// One preprocessed sample.
struct SftSample {
  std::string id;
  int64_t line = 0;                  // physical line in the JSONL file (1-based)
  std::vector<int64_t> input_ids;    // [T]
  std::vector<int64_t> labels;       // [T], algo::kIgnoreIndex where unsupervised
  torch::Tensor pixel_values;        // [N, 3, H, W] float32, N = images (undefined when N = 0);
                                     // Qwen2-VL: [sum of patches, 3 * T * p * p]
  torch::Tensor image_grid_thw;      // Qwen2-VL: [N, 3] int64 patches per image (else undefined)
  std::vector<Message> messages;     // the parsed conversation
  std::string reference;             // prompt_only: the final assistant reply (eval target)
  std::string answer;                // the record's "answer" field (string or number), if any
};

/// Everything needed to turn a record into a sample.
struct SampleContext {
  const Tokenizer* tokenizer = nullptr;
  TemplateOptions template_options;
  ImageProcessorConfig image;
  std::filesystem::path base_dir;    // image paths resolve relative to the JSONL's folder
  std::string source;                // JSONL path, for error messages
  int64_t max_length = 512;
  bool load_images = true;           // false: count/validate only (tests, inspect)
  bool check_image_files = false;    // with load_images false: each image must exist (a file)
  int64_t random_shift = 0;          // training augmentation: max translation in pixels (0 = off)
};

/// Qwen2-VL images of one sample: pixel_values [sum of patches, D] and image_grid_thw [N, 3]
/// (undefined when `decode` is false or N = 0), and each image's LLM token count. Without
/// `decode` the counts come from the JPEG/PNG header's size (other formats are decoded).
/// Throws Error(kData) "WHERE: ..." for a missing, corrupt or too elongated image.
struct QwenSampleImages {
  torch::Tensor pixel_values, image_grid_thw;
  std::vector<int64_t> token_counts;
};
QwenSampleImages load_qwen2_vl_sample_images(const std::vector<std::string>& images,
                                             const SampleContext& ctx, const std::string& where,
                                             bool decode);

/// Parses "messages" (string content, or HF content lists of {"type": "text"|"image"}).
/// Throws Error(kData) "SOURCE:LINE: FIELD[i].role: ..." etc. (`field` names the JSON key).
std::vector<Message> parse_messages(const nlohmann::json& messages, const std::string& where,
                                    const std::string& field = "messages");

/// Number of "<image>" placeholders in a text.
int64_t count_image_placeholders(const std::string& text);

/// The record's "images" list (absent or null = none). Throws Error(kData) "WHERE: images...".
std::vector<std::string> parse_image_paths(const nlohmann::json& record, const std::string& where);

/// Decodes and preprocesses images (paths relative to ctx.base_dir) -> [N, 3, H, W] float32, or
/// an undefined tensor for none. ctx.random_shift augments with `sample_seed`. Throws Error(kData)
/// "WHERE: ..." for a missing or corrupt image.
torch::Tensor load_sample_images(const std::vector<std::string>& images, const SampleContext& ctx,
                                const std::string& where, uint64_t sample_seed = 0);

/// With !ctx.load_images && ctx.check_image_files: throws Error(kData) "WHERE: PATH: image file
/// not found" (as decoding would) for an image that is not a file (the validation pass, which decodes nothing).
void check_image_files(const std::vector<std::string>& images, const SampleContext& ctx,
                       const std::string& where);

/// Record -> SftSample. Validates the schema, that the number of "<image>" placeholders equals
/// len(images), that at least one assistant turn exists, that images decode, and truncates to
/// max_length without cutting image tokens or every supervised token (else an Error(kData)).
/// prompt_only (eval/generation): the final assistant turn becomes `reference`, the ids are the
/// preceding turns plus the generation prompt ("ASSISTANT:"), labels all algo::kIgnoreIndex.
/// `sample_seed` drives the random augmentation (ctx.random_shift) of this sample's images.
SftSample make_sft_sample(const nlohmann::json& record, int64_t line, const SampleContext& ctx,
                          bool prompt_only = false, uint64_t sample_seed = 0);

/// Truncates ids/labels to max_length; returns false (leaving them untouched) when that would cut
/// an image token or leave no supervised label.
bool truncate_sample(std::vector<int64_t>& input_ids, std::vector<int64_t>& labels,
                     int64_t max_length, int64_t image_token_id);

}  // namespace mmpost::data
