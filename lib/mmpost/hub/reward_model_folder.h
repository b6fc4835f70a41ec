// Reward-model folders (hub layer): the VLM in HF layout (hub::save_pretrained, so any VLM loader
// still reads it) plus `reward_head.safetensors` holding `score.weight` [1, C] float32 (a separate
// file, so hub::load_pretrained, which refuses unexpected weights, still reads the folder as a
// VLM); config.json gains "num_labels": 1 and
// "mmpost_reward_model": {"format_version": 1, "head": "reward_head.safetensors"}.
#pragma once

#include <cstdint>
#include <filesystem>

#include "mmpost/data/image.h"
#include "mmpost/data/tokenizer.h"
#include "mmpost/model/reward_model.h"

namespace mmpost::hub {

inline constexpr const char* kRewardHeadFile = "reward_head.safetensors";
inline constexpr int64_t kRewardModelFormatVersion = 1;

/// Writes a reward-model folder (format above): save_pretrained(dir, rm->model, ...), then
/// reward_head.safetensors, then config.json with the reward-model keys (atomic writes).
/// Throws Error(kRuntime) on write errors.
void save_reward_model(const std::filesystem::path& dir, model::RewardModel& rm,
                       const std::filesystem::path& tokenizer_path,
                       const data::ImageProcessorConfig& image,
                       const data::Tokenizer* tokenizer = nullptr);

/// True when `dir` holds reward_head.safetensors.
bool has_reward_head(const std::filesystem::path& dir);

/// Loads `dir`/reward_head.safetensors into rm->score (keeps its device/dtype). Throws
/// Error(kUsage) naming the folder when the file is missing, Error(kRuntime) for a missing or
/// mis-shaped score.weight.
void load_reward_head(model::RewardModel& rm, const std::filesystem::path& dir);

/// A reward-model folder, loaded (float32, CPU, eval mode).
struct PretrainedRewardModel {
  model::RewardModel model{nullptr};
  std::filesystem::path tokenizer_path;  // empty when the folder has no tokenizer.model
  data::ImageProcessorConfig image;
};

/// Loads a folder written by save_reward_model. Throws Error(kUsage) naming the folder when it has
/// no reward head (e.g. a plain SFT/DPO model folder), plus load_pretrained's errors.
PretrainedRewardModel load_reward_model(const std::filesystem::path& dir);

}  // namespace mmpost::hub
