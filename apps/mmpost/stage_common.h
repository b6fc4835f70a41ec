// Glue the training stages share for real: loading the starting model + tokenizer + image
// settings (from a recipe's model section or a resume checkpoint), freezing parts, the sample
// context and short number formatting. The loops themselves stay in each stage (STYLE.md 2).
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "mmpost/config/recipe.h"
#include "mmpost/data/loader.h"
#include "mmpost/data/sft_dataset.h"
#include "mmpost/data/tokenizer.h"
#include "mmpost/dist/process_group.h"
#include "mmpost/model/vlm.h"
#include "mmpost/train/run.h"

namespace mmpost::cli {

/// A model ready for a stage, with its tokenizer and image preprocessing.
struct StageModel {
  model::Vlm model{nullptr};
  std::unique_ptr<data::Tokenizer> tokenizer;
  std::filesystem::path tokenizer_path;
  data::ImageProcessorConfig image;
  std::filesystem::path source;  // folder it was loaded from (empty: random init)
  std::unique_ptr<model::LoraAdapters> lora;  // lora.r > 0: the trainable adapters
};

/// Loads `ckpt` if set, else model.path, else builds model.config with random weights (seeded by
/// the caller). The tokenizer gets the folder's added tokens and <image>; the image settings come
/// from the folder's preprocessor_config.json when present, else from `image`. Freezes
/// model.freeze, moves to device/dtype, train mode. Throws Error(kUsage) for a tokenizer that does
/// not fit the model's vocabulary. `stage` prefixes the log lines.
/// Refuses (Error kUsage, before anything is allocated) a model whose training state (weights,
/// gradients, AdamW moments: model::training_state_bytes for `dtype`, frozen parts excluded) is
/// over model.max_memory_gb, or whose host-side need exceeds `available_host` bytes (-1:
/// unknown). The message gives the parameter
/// counts per part and the sizes; `what` names the config ("model.config", a config.json path).
void check_memory_fits(const model::VlmConfig& c, const config::ModelSection& m,
                       const torch::Device& device, torch::Dtype dtype, const std::string& what,
                       int64_t available_host);

/// With lora.r > 0 every base parameter is frozen except the lora.modules_to_save parts, and
/// LoRA adapters are attached (trainable, float32); on resume (`ckpt`) the checkpoint's adapter
/// is loaded into them, otherwise a LoRA adapter found in the source folder is merged first.
StageModel load_stage_model(const config::ModelSection& m, const config::ImageSection& image,
                            const std::optional<std::filesystem::path>& ckpt,
                            const torch::Device& device, torch::Dtype dtype,
                            const std::string& stage, const config::LoraSection& lora = {});

/// The trainable tensors of a stage model: the model's named parameters followed by the LoRA
/// adapter tensors under their PEFT keys.
std::vector<std::pair<std::string, torch::Tensor>> trainable_named(const StageModel& sm);

/// The tensors of `named` (e.g. trainable_named) that require grad, in its order (what
/// backward_shards differentiates).
std::vector<torch::Tensor> trainable_tensors(
    const std::vector<std::pair<std::string, torch::Tensor>>& named);

/// train.cpu_shards for this stage's run (train::resolve_cpu_shards, train/shards.h) training
/// `trainable`: blocked by `lora_dropout` > 0, compute other than float32, several processes,
/// or `stage_blocker` (the stage's own reason, "" for none). Logs the count when above 1.
/// Throws as resolve_cpu_shards.
int64_t stage_cpu_shards(int64_t requested, const std::vector<torch::Tensor>& trainable,
                         const train::Run& run, double lora_dropout,
                         const std::string& stage_blocker, const std::string& stage);

/// The frozen reference of dpo and rlhf (implicit rewards, KL). Either a model of its own, or,
/// under LoRA, the policy itself with its adapters switched off around each reference forward
/// (`model::AdaptersDisabled off(ref.adapters_off)`), as TRL does with a PEFT model: no second
/// copy of the weights.
struct StageReference {
  model::Vlm model{nullptr};
  model::LoraAdapters* adapters_off = nullptr;  // non-null: `model` is the policy
  explicit operator bool() const { return static_cast<bool>(model); }
};

/// Loads the reference for `stage` from `src` in `dtype`, frozen and in eval mode. Under LoRA
/// it is the policy with adapters off instead, unless `own_copy_reason` is non-empty (a separate
/// reference model or dtype was asked for) or lora.modules_to_save trains whole parts (their
/// original weights are gone from the policy): then a copy is loaded and the log says why.
StageReference load_reference(StageModel& sm, const config::LoraSection& lora,
                              const std::filesystem::path& src, const std::string& own_copy_reason,
                              const torch::Device& device, torch::Dtype dtype,
                              const std::string& stage);

/// Freezes the named parts ("vision_tower", "projector", "language_model").
void freeze_parts(model::Vlm& m, const std::vector<std::string>& parts);

/// Parameter count (all, or only those with requires_grad).
int64_t count_params(const model::Vlm& m, bool trainable_only);

/// Sample context for `path` (images resolve relative to its folder) from a loaded model.
data::SampleContext make_sample_context(const StageModel& sm, const config::DataSection& data,
                                        const std::string& path);

/// Loader options for the training stream of a recipe: data.train, train.batch_size (per rank),
/// the data section's workers, shuffle buffer and prefetch, the seed, on_bad_sample, endless
/// repetition, and this process's rank and world size (each rank gets its share of every window
/// of batch_size * world_size records); the sample cache (data.cache_gb) unless
/// data.image.random_shift augments.
data::LoaderOptions train_loader_options(const config::CommonConfig& cfg,
                                         const dist::WorldInfo& world);

/// The micro-batches of one optimizer step, fetched before any forward so that each loss can be
/// normalized by its micro-batch's sample count over all ranks (a rank's share may be empty).
template <class Sample>
struct StepBatches {
  std::vector<std::vector<Sample>> micro;  // [n_micro] this rank's samples of each window
  std::vector<double> global_counts;       // [n_micro] samples of each window over all ranks
};

/// Fetches `n_micro` batches from the endless training `loader` and sums their sizes over the
/// ranks of `run` (one small all-reduce). Throws Error(kData) naming `path` when the loader ends,
/// dist::DistError when a peer fails.
template <class Sample>
StepBatches<Sample> next_step_batches(data::StreamingLoader<Sample>& loader, int64_t n_micro,
                                      const train::Run& run, const std::string& path) {
  StepBatches<Sample> s;
  for (int64_t a = 0; a < n_micro; ++a) {
    auto samples = loader.next_batch();
    MMPOST_CHECK_DATA(samples.has_value(), path, ": no training samples");
    s.global_counts.push_back(static_cast<double>(samples->size()));
    s.micro.push_back(std::move(*samples));
  }
  s.global_counts = run.all_sum(std::move(s.global_counts));
  return s;
}

/// This process's place in a torchrun / srun launch, for the commands without a train::Run
/// (eval, generate): the process group when there is more than one process, and the device
/// (cuda:LOCAL_RANK for a CUDA device without an index).
struct DataParallelContext {
  dist::WorldInfo world;
  std::unique_ptr<dist::ProcessGroup> pg;  // nullptr for one process
  torch::Device device{torch::kCPU};
};

/// Reads the launcher environment, sets the log rank and joins the group (Gloo on CPU, NCCL on
/// CUDA) with `timeout_s`. Throws Error(kUsage) naming the variable for a malformed environment,
/// dist::DistError when the peers do not meet in time.
DataParallelContext join_process_group(const std::string& device, double timeout_s,
                                       const std::string& command);

/// Template options for `m`: the chat template (`chat_template` "auto": the tokenizer's; a
/// Qwen2-VL model whose tokenizer has none: qwen2_vl), the image token id, and per image
/// config.n_image_tokens() ids (LLaVA) or the image's own count of <|image_pad|> (Qwen2-VL).
/// Throws Error(kUsage) for an unknown or unrecognised template.
data::TemplateOptions template_options_for(const model::VlmImpl& m, const data::Tokenizer& tok,
                                           const std::string& chat_template,
                                           bool add_generation_prompt);

/// The tokenizer of a loaded folder `dir` for `m`: LLaVA gets <image> as its image token;
/// Qwen2-VL tokenizers already hold <|image_pad|>. Throws Error(kUsage) when the folder has no
/// tokenizer.model / tokenizer.json.
std::unique_ptr<data::Tokenizer> load_folder_tokenizer(const model::VlmImpl& m,
                                                       const std::filesystem::path& tokenizer_path,
                                                       const std::string& dir);

/// Pad id for collation: the tokenizer's pad, else EOS.
int64_t pad_id_of(const data::Tokenizer& tok);

/// Short decimal formatting for log lines (`prec` significant digits).
std::string fmt(double v, int prec = 4);

}  // namespace mmpost::cli
