// Autoregressive generation for the VLM: one prefill over the KV cache, then one token per step;
// greedy or seeded sampling (temperature, top-k, top-p), stopping when every row has hit EOS.
// Semantics follow HF generate (left-padded prompts, position ids from the attention mask).
#pragma once

#include "mmpost/model/vlm.h"

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace mmpost::model {

/// Decoding settings (HF GenerationConfig names).
struct GenerationConfig {
  int64_t max_new_tokens = 64;
  double temperature = 0.0;  // 0 = greedy
  double top_p = 1.0;        // nucleus mass kept (1 = off)
  int64_t top_k = 0;         // 0 = off
  std::vector<int64_t> eos_token_ids;
  int64_t pad_token_id = 0;
  uint64_t seed = 0;
};

/// What generate returns. Positions after a row's EOS hold pad_token_id and log-prob 0.
struct GenerationOutput {
  torch::Tensor sequences;  // [B, T_new] int64, new tokens only
  torch::Tensor logps;      // [B, T_new] float32, log softmax of the raw logits at each token
  torch::Tensor lengths;    // [B] int64, tokens up to and including EOS
};

/// Generates up to cfg.max_new_tokens tokens per row. input_ids [B, T] LEFT-padded int64,
/// attention_mask [B, T] (1 = real token), pixel_values [N, 3, H, W] or undefined.
/// The image token (config.image_token_index) is never generated (its logit is masked).
/// With use_cache=false every step recomputes the whole sequence (a test reference).
/// Sampling draws from a CPU torch::Generator seeded with cfg.seed, so results are reproducible
/// on any device. `logps` score the chosen token under the unmodified model distribution
/// (temperature 1, no top-k/top-p), the quantity policy-gradient losses need.
/// Throws mmpost::Error (kUsage) for invalid settings, (kData) for image-token mismatches.
GenerationOutput generate(Vlm& model, const torch::Tensor& input_ids,
                          const torch::Tensor& attention_mask, const torch::Tensor& pixel_values,
                          const GenerationConfig& cfg, bool use_cache = true);

/// Picks the next token per row from logits [B, V] float32: argmax when temperature == 0, else
/// a draw from softmax(logits / temperature) restricted to the top_k tokens and to the smallest
/// set whose probability mass reaches top_p (HF TopK/TopP warpers). Returns [B] int64.
torch::Tensor select_next_token(const torch::Tensor& logits, const GenerationConfig& cfg,
                                torch::Generator& generator);

}  // namespace mmpost::model
