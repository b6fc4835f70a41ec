// Training checkpoints, one writer for every stage: OUTPUT/step_000120/ holds the model folder in
// HF layout (plus a reward or value head), optimizer.pt, rng.pt and state.json (format version,
// step, loader cursor, counters, recipe), with DONE written last. A save is built in a hidden
// temporary folder, fsynced and renamed into place, so a crash or a full disk never leaves a
// folder resume would trust, and the newest complete checkpoint is never touched before a newer
// one is complete (ARCHITECTURE.md; llm.c's DONE_%08d).
#pragma once

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <filesystem>
#include <optional>
#include <string>

#include "mmpost/data/image.h"
#include "mmpost/data/loader.h"
#include "mmpost/data/tokenizer.h"
#include "mmpost/model/reward_model.h"
#include "mmpost/model/vlm.h"
#include "mmpost/train/optimizer.h"

namespace mmpost::train {

inline constexpr int64_t kStateFormatVersion = 1;
inline constexpr const char* kValueHeadFile = "value_head.safetensors";

/// Loop state that a checkpoint must restore for an exact resume.
struct TrainState {
  int64_t step = 0;              // optimizer steps completed
  data::LoaderCursor loader;     // training stream position
  int64_t n_skipped = 0;         // bad samples skipped so far
  int64_t tokens_seen = 0;
  nlohmann::json extra = nlohmann::json::object();  // stage-specific counters
  nlohmann::json recipe;  // read_train_state: the recipe the checkpoint recorded (null if none)
};

/// What a model folder holds: the VLM, or a reward model (VLM + score head), optionally a PPO
/// value head; the tokenizer (written from its bytes in memory) and image settings.
struct ModelBundle {
  model::Vlm vlm{nullptr};                  // the VLM (rm: the trunk, for its LoRA adapter)
  model::RewardModel reward_model{nullptr}; // rm: written by hub::save_reward_model
  torch::nn::Linear value_head{nullptr};    // ppo: value_head.safetensors {weight [1, C], bias [1]}
  const data::Tokenizer* tokenizer = nullptr;
  data::ImageProcessorConfig image;
  // LoRA runs: the adapter is written beside the (frozen) base weights in PEFT's format.
  model::LoraAdapters* lora = nullptr;
  std::vector<std::string> lora_modules_to_save;
  std::string lora_base_model;     // adapter_config.json base_model_name_or_path
  bool lora_merge_on_save = false;  // export_final writes the merged model, no adapter files
};

/// Writes `b` as a model folder into `dir` (float32 weights, atomic files). Throws Error(kRuntime).
void save_model_bundle(const std::filesystem::path& dir, const ModelBundle& b);

/// Loads `dir`/value_head.safetensors into `head` (keeps its device/dtype). Throws
/// Error(kRuntime) naming the file when it is missing or mis-shaped.
void load_value_head(torch::nn::Linear& head, const std::filesystem::path& dir);

/// Saves and prunes the checkpoints of one run.
class Checkpointer {
 public:
  /// `last_saved_step`: the step of the checkpoint the run resumed from (-1: none), so a save of
  /// the same step is skipped. The free-space need is estimated from `model_bytes` (all
  /// parameters, float32) plus the optimizer's two AdamW moments of every trainable parameter.
  /// `writer`: this process writes (rank 0); the others only join the collective part of a save
  /// (gathering a sharded optimizer state) and write nothing.
  Checkpointer(std::filesystem::path output_dir, int64_t keep_last, ModelBundle bundle,
               Optimizer& optimizer, int64_t last_saved_step, bool writer = true);

  /// Writes OUTPUT/step_<state.step> (model folder, optimizer.pt, rng.pt, state.json, DONE) via a
  /// temporary folder, then prunes to keep_last complete checkpoints. Every rank of a
  /// multi-process run calls it at the same step; only the writer writes. Does nothing when that step
  /// was saved already (a stop signal on a save step). Returns the folder. Throws Error(kRuntime)
  /// naming the folder and the space needed (full disk, I/O error); the previous checkpoint is
  /// then intact and no partial folder is left.
  std::filesystem::path save(const TrainState& state, const nlohmann::json& recipe);

  /// Writes the final model folder at the top level of the output folder (the writer only).
  /// Throws Error(kRuntime).
  void export_final();

  /// Bytes a checkpoint needs on disk (estimate used by the free-space check).
  uint64_t bytes_needed() const { return bytes_needed_; }

 private:
  std::filesystem::path out_;
  int64_t keep_last_;
  ModelBundle bundle_;
  Optimizer& optimizer_;
  int64_t last_saved_;
  bool writer_;
  uint64_t bytes_needed_ = 0;
};

/// Reads state.json of a checkpoint folder. Throws Error(kRuntime) for an unknown format version.
TrainState read_train_state(const std::filesystem::path& dir);

/// Restores optimizer.pt and rng.pt of a checkpoint folder into `optimizer` (its own shard under
/// ZeRO-1) and torch's CPU RNG. Throws Error(kRuntime) naming the folder.
void load_optimizer_and_rng(const std::filesystem::path& dir, Optimizer& optimizer);

}  // namespace mmpost::train
