// Rollouts for online RL (`mmpost rlhf`): P prompts x G sampled completions with the KV cache,
// their sampled-token log-probs, and the teacher-forced forward over a slice of prompts that the
// update, the reference and a value head share. One vision pass per prompt image serves all G
// completions (features repeated per row), as in TRL's GRPOTrainer with one image per prompt.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "mmpost/data/sft_dataset.h"
#include "mmpost/model/generation.h"
#include "mmpost/model/vlm.h"

namespace mmpost::train {

/// One generation batch: P prompts x G completions, rows grouped by prompt (row p*G + g).
struct Rollout {
  int64_t P = 0, G = 0;
  torch::Tensor prompt_ids, prompt_mask;     // [P*G, Tp] int64, left padded
  torch::Tensor pixel_values;                // [N, 3, H, W] the P prompts' images once (or undefined);
                                             // Qwen2-VL: [patches, D] with image_grid_thw
  torch::Tensor image_grid_thw;              // Qwen2-VL: [N, 3] int64 (else undefined)
  std::vector<int64_t> image_counts;         // [P] images per prompt
  torch::Tensor row_pixel_values;            // [N*G, 3, H, W] images repeated per row (reward models)
  torch::Tensor row_image_grid_thw;          // Qwen2-VL: [N*G, 3] (else undefined)
  torch::Tensor completion;                  // [P*G, Tc] int64 sampled ids (pad after the end)
  torch::Tensor mask;                        // [P*G, Tc] float32, 1 on completion tokens (EOS/stop incl.)
  torch::Tensor lengths;                     // [P*G] int64 completion lengths (CPU)
  torch::Tensor truncated;                   // [P*G] bool, hit max_new_tokens (CPU)
  torch::Tensor old_logps, ref_logps, old_values, returns;  // [P*G, Tc] float32
  torch::Tensor advantages;                  // [P*G] or [P*G, Tc] float32
  std::vector<int64_t> prompt_index;         // [P] pool indices
};

/// Samples G completions for each prompt of `samples` (prompt-only, from the same pool indices
/// `prompt_index`) with the KV cache in eval mode without grad, then puts `model` back in train
/// mode. Fills everything up to old_logps (the log-probs of the sampled tokens, 0 off the mask).
Rollout sample_rollout(model::Vlm& model, const std::vector<data::SftSample>& samples,
                       std::vector<int64_t> prompt_index, int64_t G,
                       const model::GenerationConfig& gen, int64_t pad_id,
                       const torch::Device& device, torch::Dtype dtype);

/// Keeps the prompts `keep` (indices into 0..P-1) of a rollout, with their G rows and images.
Rollout select_prompts(const Rollout& r, const std::vector<int64_t>& keep);

/// Per-token outputs of completion_forward for rows [p0*G, p1*G).
struct TokenForward {
  torch::Tensor logps;   // [rows, Tc] float32, 0 off the mask
  torch::Tensor hidden;  // [rows, Tc, C] states that predict each completion token (value heads)
  torch::Tensor logits;  // [rows, Tc, V] float32 (only with keep_logits)
};

/// Teacher-forced forward of the completions of prompts [p0, p1) of `r` under `m`: one vision
/// pass per prompt image, features repeated for the G rows; position Tp-1+t predicts token t.
/// chunk_rows > 0 without keep_logits: only the completion tokens go through the LM head,
/// chunk_rows at a time (algo::linear_token_logps), so [rows, Tc, V] logits never exist whole.
TokenForward completion_forward(model::Vlm& m, const Rollout& r, int64_t p0, int64_t p1,
                                bool keep_logits = false, int64_t chunk_rows = 0);

/// Mean entropy -sum_v p log p over the completion tokens (mask [rows, Tc]) of logits
/// [rows, Tc, V], row by row to bound memory; no grad.
double mean_entropy(const torch::Tensor& logits, const torch::Tensor& mask);

/// Sample standard deviation of a tensor's elements (0 for fewer than two), as float64.
double std_of(const torch::Tensor& t);

}  // namespace mmpost::train
