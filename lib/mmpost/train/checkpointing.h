// Training checkpoints shared by the stages: OUTPUT/step_000120/ holds the model in HF layout,
// optimizer.pt, rng.pt and state.json (format version, step, loader cursor, counters, recipe),
// with DONE written last; resume loads the newest folder that has DONE (ARCHITECTURE.md).
#pragma once

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <filesystem>
#include <map>
#include <string>

#include "mmpost/data/image.h"
#include "mmpost/data/loader.h"
#include "mmpost/data/tokenizer.h"
#include "mmpost/model/vlm.h"

namespace mmpost::train {

inline constexpr int64_t kStateFormatVersion = 1;

/// Loop state that a checkpoint must restore for an exact resume.
struct TrainState {
  int64_t step = 0;              // optimizer steps completed
  data::LoaderCursor loader;     // training stream position
  int64_t n_skipped = 0;         // bad samples skipped so far
  int64_t tokens_seen = 0;
  nlohmann::json extra = nlohmann::json::object();  // stage-specific counters
};

/// Writes OUTPUT/step_NNNNNN (model folder + optimizer + RNG + `extra_tensors` in
/// extra.safetensors when non-empty, e.g. a value head + state.json + DONE), then prunes
/// to keep_last complete checkpoints. Returns the folder. Throws Error(kRuntime) (disk full etc.);
/// an interrupted save leaves no DONE, so resume ignores it.
std::filesystem::path save_checkpoint(const std::filesystem::path& output_dir,
                                      const TrainState& state, model::Vlm& model,
                                      const std::filesystem::path& tokenizer_path,
                                      const data::ImageProcessorConfig& image,
                                      torch::optim::Optimizer& optimizer,
                                      const nlohmann::json& recipe, int64_t keep_last,
                                      const data::Tokenizer* tokenizer = nullptr,
                                      const std::map<std::string, torch::Tensor>& extra_tensors = {});

/// The extra.safetensors tensors of a checkpoint folder (empty map when there is none).
std::map<std::string, torch::Tensor> load_extra_tensors(const std::filesystem::path& dir);

/// Reads state.json of a checkpoint folder. Throws Error(kRuntime) for an unknown format version.
TrainState read_train_state(const std::filesystem::path& dir);

/// Restores optimizer.pt and rng.pt of a checkpoint folder into `optimizer` and torch's CPU RNG.
void load_optimizer_and_rng(const std::filesystem::path& dir, torch::optim::Optimizer& optimizer);

}  // namespace mmpost::train
