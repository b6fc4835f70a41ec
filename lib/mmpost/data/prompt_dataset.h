// Prompt datasets for online RL (`mmpost rlhf`): TRL conversational records whose reference answer
// is the record's "answer" field, else the <answer> of the final assistant turn, else that turn's
// text (the rule `mmpost eval --reward` shares). Held in memory so a curriculum can sample by
// index and by the optional integer "difficulty"; images are decoded per batch, not at load.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "mmpost/algo/rewards.h"
#include "mmpost/data/sft_dataset.h"

namespace mmpost::data {

/// Prompt records held in memory, index-aligned.
struct PromptPool {
  std::vector<nlohmann::json> records;
  std::vector<int64_t> lines;        // 1-based line in the JSONL
  std::vector<int64_t> difficulty;   // the record's "difficulty" (0 when absent)
  std::vector<std::string> references;
  int64_t n_skipped = 0;             // bad records skipped (on_bad_sample: skip)
};

/// A prompt record -> prompt-only sample (ids end with the generation prompt). A record without a
/// final assistant turn gets an empty one, so it passes the same validation as eval's. Throws
/// Error(kData) naming ctx.source:line.
SftSample make_prompt_sample(nlohmann::json record, int64_t line, const SampleContext& ctx);

/// The reference answer of a record (see the file comment). Throws Error(kData) for an "answer"
/// that is neither a string nor a number.
std::string reference_of(const nlohmann::json& record, const SftSample& sample);

/// Reads every record of `path`: schema and length checks (images are not decoded), the
/// difficulty, and the reference, which each numeric/choice verifier of `specs` must be able to
/// read. Bad records throw Error(kData) with FILE:LINE, or are counted and skipped with
/// `skip_bad`. Throws Error(kData) when no usable prompt is left.
PromptPool load_prompts(const std::string& path, const SampleContext& ctx, bool skip_bad,
                        const std::vector<algo::RewardSpec>& specs);

}  // namespace mmpost::data
