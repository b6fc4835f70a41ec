// Autoregressive generation for the VLM: one prefill over the KV cache, then one token per step;
// greedy or seeded sampling (temperature, top-k, top-p), a row stopping at EOS or a stop
// sequence, the batch when every row has stopped. Semantics follow HF generate (left-padded
// prompts, position ids from the attention mask); repeat_interleave_batch lays out G rollouts
// per prompt for GRPO/RLOO.
#pragma once

#include "mmpost/model/qwen2_vl.h"
#include "mmpost/model/vlm.h"

#include <torch/torch.h>

#include <cstdint>
#include <functional>
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
  /// Optional per-row seeds ([B] when set): row i then samples from its own CPU generator seeded
  /// with row_seeds[i], so a row's tokens do not depend on which other rows share the batch (a
  /// data-parallel rollout gives each prompt the tokens one big batch would). Empty: one stream.
  std::vector<uint64_t> row_seeds;
  /// A row stops once its new tokens END with one of these id sequences (the sequence is kept
  /// in the output). Empty sequences are refused (Error kUsage).
  std::vector<std::vector<int64_t>> stop_token_sequences;
  /// Optional text-level stop (HF StopStringCriteria): called after each step for every running
  /// row with its new token ids so far; returning true stops the row, keeping the last token, so
  /// the stop string stays in the output as in HF. Called on the generating thread.
  std::function<bool(const std::vector<int64_t>& new_ids)> stop_check;
};

/// Why a row ended (the names are what `mmpost generate` prints).
enum class FinishReason : int64_t { kEos = 0, kStop = 1, kLength = 2 };

/// "eos" | "stop" | "length".
const char* finish_reason_name(FinishReason reason);

/// What generate returns. Positions after a row's last token hold pad_token_id and log-prob 0.
struct GenerationOutput {
  torch::Tensor sequences;      // [B, T_new] int64, new tokens only
  torch::Tensor logps;          // [B, T_new] float32, log softmax of the raw logits at each token
  torch::Tensor lengths;        // [B] int64, tokens up to and including EOS / the stop sequence
  torch::Tensor finish_reason;  // [B] int64, FinishReason values
  torch::Tensor truncated;      // [B] bool, hit max_new_tokens without EOS or a stop
};

/// Generates up to cfg.max_new_tokens tokens per row. input_ids [B, T] LEFT-padded int64,
/// attention_mask [B, T] (1 = real token), `images` (LLaVA pixel_values [N, 3, H, W], or a
/// Qwen2-VL model's patches and grids; empty = text only). A Qwen2-VL family model generates as
/// the Qwen2VLImpl overload below.
/// A row ends with its first EOS, stop_token_sequences match or stop_check hit (finish_reason
/// says which; EOS wins when one token does both); the loop ends when every row has.
/// The image token (config.image_token_index) is never generated (its logit is masked).
/// With use_cache=false every step recomputes the whole sequence (a test reference).
/// Sampling draws from a CPU torch::Generator seeded with cfg.seed (or one per row from
/// cfg.row_seeds), so results are reproducible on any device. `logps` score the chosen token under the unmodified model distribution
/// (temperature 1, no top-k/top-p), the quantity policy-gradient losses need.
/// Throws mmpost::Error (kUsage) for invalid settings, (kData) for image-token mismatches.
GenerationOutput generate(Vlm& model, const torch::Tensor& input_ids,
                          const torch::Tensor& attention_mask, const Images& images,
                          const GenerationConfig& cfg, bool use_cache = true);

/// As above for Qwen2-VL / Qwen2.5-VL: images as the processor's pixel_values [L, D] with
/// image_grid_thw [N, 3]; M-RoPE positions from the prompt, later tokens at their 1-D position +
/// the prompt's rope delta (HF generate). <|image_pad|>, <|video_pad|>, <|vision_start|> and
/// <|vision_end|> are never generated.
GenerationOutput generate(Qwen2VLImpl& model, const torch::Tensor& input_ids,
                          const torch::Tensor& attention_mask, const torch::Tensor& pixel_values,
                          const torch::Tensor& image_grid_thw, const GenerationConfig& cfg,
                          bool use_cache = true);

/// What the decoding loop needs from a model: hidden states [B, T, C] of a prompt (with its
/// images; cache null = recompute without one) and of one new token per row against the cache,
/// the LM head (hidden [B, C] -> logits [B, V] float32), and token ids never to generate.
struct DecoderSteps {
  std::function<torch::Tensor(const torch::Tensor& ids, const torch::Tensor& mask, KVCache*)>
      prompt_hidden, step_hidden;
  std::function<torch::Tensor(const torch::Tensor& hidden)> logits;
  std::vector<int64_t> never_generate;
};

/// The decoding loop behind both generate overloads (same arguments and semantics).
GenerationOutput generate(const DecoderSteps& model, const torch::Tensor& input_ids,
                          const torch::Tensor& attention_mask, const GenerationConfig& cfg,
                          bool use_cache = true);

/// A prompt batch with every sample repeated G times (see repeat_interleave_batch).
struct RepeatedBatch {
  torch::Tensor input_ids;       // [B*G, T]
  torch::Tensor attention_mask;  // [B*G, T]
  torch::Tensor pixel_values;    // [N*G, 3, H, W], or undefined when N = 0 (Qwen2-VL: patches)
  torch::Tensor image_grid_thw;  // Qwen2-VL: [N*G, 3]; else undefined
};

/// Repeats each sample num_generations (G) times, grouped: rows i*G .. i*G+G-1 are sample i
/// (TRL GRPO layout; torch.repeat_interleave on dim 0). pixel_values [N, 3, H, W] holds every
/// sample's images in sample order, image_counts[i] (0 allowed) of them for sample i; the output
/// keeps images in the new row order, so image-token splicing stays aligned. Qwen2-VL images
/// (with image_grid_thw) repeat each image's block of t*h*w patch rows and its grid row.
/// Throws Error(kUsage) for G < 1; TORCH_CHECKs that image_counts has B entries summing to N.
RepeatedBatch repeat_interleave_batch(const torch::Tensor& input_ids,
                                      const torch::Tensor& attention_mask, const Images& images,
                                      const std::vector<int64_t>& image_counts,
                                      int64_t num_generations);

/// Picks the next token per row from logits [B, V] float32: argmax when temperature == 0, else
/// a draw from softmax(logits / temperature) restricted to the top_k tokens and to the smallest
/// set whose probability mass reaches top_p (HF TopK/TopP warpers). Draws on `generator`
/// (torch.multinomial), or, when row_generators is given and non-empty ([B] of them), row i by
/// inverse CDF with one uniform from (*row_generators)[i]. Returns [B] int64. Throws
/// mmpost::Error when a sampled row's probabilities are NaN or infinite.
torch::Tensor select_next_token(const torch::Tensor& logits, const GenerationConfig& cfg,
                                torch::Generator& generator,
                                std::vector<torch::Generator>* row_generators = nullptr);

}  // namespace mmpost::model
