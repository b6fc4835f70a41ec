// Reward model: the LLaVA VLM with a scalar head, as HF *ForSequenceClassification with
// num_labels = 1 (a bias-free Linear `score` on the final hidden state of the last real token).
// Trained by `mmpost rm` (Bradley-Terry) and loaded by `mmpost rlhf` to score completions.
// Folder format: the VLM in HF layout (io::save_pretrained, so any VLM loader still reads it) plus
// `reward_head.safetensors` holding `score.weight` [1, C] float32 (a separate file, so
// io::load_pretrained, which refuses unexpected weights, still reads the folder as a VLM);
// config.json gains "num_labels": 1 and
// "mmpost_reward_model": {"format_version": 1, "head": "reward_head.safetensors"}.
#pragma once

#include <torch/torch.h>

#include <filesystem>

#include "mmpost/data/image.h"
#include "mmpost/data/tokenizer.h"
#include "mmpost/model/vlm.h"

namespace mmpost::model {

inline constexpr const char* kRewardHeadFile = "reward_head.safetensors";
inline constexpr int64_t kRewardModelFormatVersion = 1;

/// Hidden state of the last real token of each row: hidden [B, T, C], attention_mask [B, T]
/// (1 = token) -> [B, C]. The index is the rightmost position with mask 1 (= mask.sum(-1) - 1
/// for right padding; also right for left padding). It reads the mask, not pad ids, because the
/// pad id may equal EOS (pad_id_of), and the EOS ending a completion is the token we want.
torch::Tensor last_token_hidden(const torch::Tensor& hidden, const torch::Tensor& attention_mask);

/// VLM + `score` (Linear(C, 1, bias=false)). Parameter names: `model.<VLM hub names>` and
/// `score.weight` (the backbone/head split of HF LlamaForSequenceClassification).
class RewardModelImpl : public torch::nn::Module {
 public:
  /// Wraps `vlm` (shared, not copied) and creates `score` ~ N(0, init_std^2) on the VLM's
  /// device/dtype (HF initializer_range default 0.02; uses torch's global RNG: seed first).
  explicit RewardModelImpl(Vlm vlm, double init_std = 0.02);

  /// Rewards [B] float32 from precomputed image features [N, P, C] (undefined = no images; see
  /// VlmImpl::embed_features), input_ids / attention_mask [B, T].
  torch::Tensor forward_features(const torch::Tensor& input_ids, const torch::Tensor& features,
                                 const torch::Tensor& attention_mask);

  /// Rewards [B] float32 from pixel_values [N, 3, H, W] (undefined = no images).
  torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& pixel_values,
                        const torch::Tensor& attention_mask);

  Vlm model{nullptr};
  torch::nn::Linear score{nullptr};
};
TORCH_MODULE(RewardModel);

/// Writes a reward-model folder (format above): io::save_pretrained(dir, rm->model, ...), then
/// reward_head.safetensors, then config.json with the reward-model keys (atomic writes).
/// Throws Error(kRuntime) on write errors.
void save_reward_model(const std::filesystem::path& dir, RewardModel& rm,
                       const std::filesystem::path& tokenizer_path,
                       const data::ImageProcessorConfig& image,
                       const data::Tokenizer* tokenizer = nullptr);

/// True when `dir` holds reward_head.safetensors.
bool has_reward_head(const std::filesystem::path& dir);

/// Loads `dir`/reward_head.safetensors into rm->score (keeps its device/dtype). Throws
/// Error(kUsage) naming the folder when the file is missing, Error(kRuntime) for a missing or
/// mis-shaped score.weight.
void load_reward_head(RewardModel& rm, const std::filesystem::path& dir);

/// A reward-model folder, loaded (float32, CPU, eval mode).
struct PretrainedRewardModel {
  RewardModel model{nullptr};
  std::filesystem::path tokenizer_path;  // empty when the folder has no tokenizer.model
  data::ImageProcessorConfig image;
};

/// Loads a folder written by save_reward_model. Throws Error(kUsage) naming the folder when it has
/// no reward head (e.g. a plain SFT/DPO model folder), plus io::load_pretrained's errors.
PretrainedRewardModel load_reward_model(const std::filesystem::path& dir);

}  // namespace mmpost::model
