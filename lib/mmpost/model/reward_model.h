// Reward model: the VLM (either family) with a scalar head, as HF *ForSequenceClassification with
// num_labels = 1 (a bias-free Linear `score` on the final hidden state of the last real token).
// Trained by `mmpost rm` (Bradley-Terry) and loaded by `mmpost rlhf` to score completions. Its
// folder format (VLM folder + reward_head.safetensors) lives in hub/reward_model_folder.h.
#pragma once

#include <torch/torch.h>

#include "mmpost/model/vlm.h"

namespace mmpost::model {

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

  /// Rewards [B] float32 from precomputed image features (undefined = no images; LLaVA
  /// [N, P, C], Qwen2-VL family [K, C] with the images' grids image_grid_thw [N, 3]; see
  /// VlmImpl::forward_hidden_features), input_ids / attention_mask [B, T].
  torch::Tensor forward_features(const torch::Tensor& input_ids, const torch::Tensor& features,
                                 const torch::Tensor& attention_mask,
                                 const torch::Tensor& image_grid_thw = {});

  /// Rewards [B] float32 from the rows' images (empty = none).
  torch::Tensor forward(const torch::Tensor& input_ids, const Images& images,
                        const torch::Tensor& attention_mask);

  Vlm model{nullptr};
  torch::nn::Linear score{nullptr};
};
TORCH_MODULE(RewardModel);

}  // namespace mmpost::model
