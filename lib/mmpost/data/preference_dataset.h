// Preference samples for DPO and reward modelling, from TRL's preference JSONL:
//   conversational {"id", "images": [...], "prompt": [messages], "chosen": [assistant message(s)],
//                   "rejected": [assistant message(s)]}
//   or standard    {"prompt": "text", "chosen": "text", "rejected": "text"} (+ "images").
// Tokenization shares the SFT chat template, so prompt + completion ids equal the SFT encoding of
// the whole conversation. Every problem is an Error(kData) naming FILE:LINE.
#pragma once

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "mmpost/data/sft_dataset.h"

namespace mmpost::data {

/// Length limits (TRL DPOConfig names; 0 = no limit). Truncation order: the prompt keeps its last
/// max_prompt_length tokens (TRL's keep_end) unless that would cut an image token (then the
/// record is bad); each completion keeps its first max_completion_length tokens; then completions
/// shrink further until prompt + completion <= max_length. The prompt is never cut for max_length.
struct PreferenceLimits {
  int64_t max_prompt_length = 0;
  int64_t max_completion_length = 0;
  int64_t max_length = 0;
};

/// How mDPO corrupts the image for its conditional term (Wang et al. 2024, arXiv:2406.11839,
/// Sec. 3.2: a random crop keeping <= 20% of the image; masking and noise as variants).
struct ImageCorruption {
  std::string mode = "crop";  // crop | mask | noise
  double strength = 0.8;      // crop: fraction of the area removed; mask: area masked; noise: std
};

/// One preprocessed preference pair; the images are processed once and shared by both sides.
struct PreferenceSample {
  std::string id;
  int64_t line = 0;
  std::vector<int64_t> prompt_ids;        // [Tp] BOS + prompt turns + "ASSISTANT:"
  std::vector<int64_t> chosen_ids;        // [Tc] completion tokens (reply + EOS)
  std::vector<int64_t> chosen_labels;     // [Tc] algo::kIgnoreIndex on markers between replies
  std::vector<int64_t> rejected_ids;      // [Tr]
  std::vector<int64_t> rejected_labels;   // [Tr]
  torch::Tensor pixel_values;             // [N, 3, H, W] float32 or undefined (N = 0);
                                          // Qwen2-VL: [sum of patches, 3 * t * p * p]
  torch::Tensor image_grid_thw;           // Qwen2-VL: [N, 3] int64 (else undefined)
  int64_t n_images = 0;                   // N
  torch::Tensor corrupted_pixel_values;   // [N, 3, H, W] mDPO only (else undefined)
  std::vector<Message> prompt;            // parsed prompt turns
  std::string chosen_text, rejected_text; // the completions' text (last assistant message)
};

/// Record -> PreferenceSample. Validates both sides (present, non-empty, assistant role only, no
/// <image> in completions), that "<image>" placeholders in the prompt equal len(images), and
/// applies `limits`. `corruption` (optional) also produces corrupted_pixel_values, seeded by
/// `sample_seed`. Qwen2-VL family (ctx.image.qwen): each image's grid decides its
/// <|image_pad|> count, as for SFT; no corruption (Error kUsage). Throws Error(kData)
/// "SOURCE:LINE: ...".
PreferenceSample make_preference_sample(const nlohmann::json& record, int64_t line,
                                        const SampleContext& ctx, const PreferenceLimits& limits,
                                        const ImageCorruption* corruption = nullptr,
                                        uint64_t sample_seed = 0);

/// A concatenated preference batch: rows [0, B) are prompt + chosen, rows [B, 2B) prompt +
/// rejected (torchtune's concatenated_forward layout), right padded. Images of the B samples are
/// stored once; the caller feeds image_features twice (cat([f, f])) for the 2B rows.
struct PreferenceBatch {
  torch::Tensor input_ids;        // [2B, T] int64
  torch::Tensor attention_mask;   // [2B, T] int64
  torch::Tensor labels;           // [2B, T] int64, algo::kIgnoreIndex on prompt and padding
  torch::Tensor pixel_values;     // [N, 3, H, W] (undefined when no sample has images);
                                  // Qwen2-VL: [sum of patches, 3 * t * p * p]
  torch::Tensor image_grid_thw;   // Qwen2-VL: [N, 3] int64, images in pair order (else undefined)
  std::vector<int64_t> n_images;  // [B] images of each pair
  torch::Tensor corrupted_pixel_values;  // [N, 3, H, W] (mDPO; else undefined)
  std::vector<std::string> ids;   // [B]
  std::vector<int64_t> lines;     // [B] JSONL lines (keys of precomputed reference log-probs)
  int64_t batch_size = 0;         // B
  int64_t n_tokens = 0;           // attention_mask.sum()

  PreferenceBatch to(const torch::Device& device, torch::Dtype pixel_dtype) const;
};

/// Pads and stacks samples into a PreferenceBatch. Throws std::invalid_argument when empty.
PreferenceBatch collate_preference(const std::vector<PreferenceSample>& samples, int64_t pad_id);

/// Corrupts normalized pixel_values [3, H, W] for mDPO's conditional term: "crop" keeps a random
/// window of (1 - strength) of the area and resizes it back (bilinear), "mask" sets a random
/// rectangle of `strength` of the area to 0 (the dataset mean after normalization), "noise" adds
/// N(0, strength^2). Deterministic in `seed`. Throws Error(kUsage) for an unknown mode.
torch::Tensor corrupt_pixel_values(const torch::Tensor& pixel_values, const ImageCorruption& c,
                                   uint64_t seed);

}  // namespace mmpost::data
