// Generation-based evaluation shared by `mmpost eval` and the periodic eval of training stages:
// greedy decoding with the KV cache, exact match of the trimmed prediction against the final
// assistant turn, optional per-sample predictions as JSONL.
#pragma once

#include <torch/torch.h>

#include <string>

#include "mmpost/algo/rewards.h"
#include "mmpost/data/sft_dataset.h"
#include "mmpost/dist/process_group.h"
#include "mmpost/io/jsonl.h"
#include "mmpost/model/vlm.h"

namespace mmpost::train {

/// Evaluation settings.
struct ExactMatchOptions {
  int64_t batch_size = 32;
  int64_t max_new_tokens = 16;
  int64_t max_samples = 0;  // 0 = all
  int64_t num_workers = 2;
  bool skip_bad = false;    // count and skip bad records instead of failing
  bool show_progress = true;
  /// Reward functions also scored on each prediction (their means go to reward_means); the
  /// reference given to them is the record's "answer" field, else the <answer> of the final
  /// assistant turn, else that turn's text (the same rule as `mmpost rlhf`).
  std::vector<algo::RewardSpec> rewards;
  /// Data parallel: each rank of `pg` evaluates its share of the records (positions p % world ==
  /// rank), the counts are summed and the predictions go to rank 0's writer in input (line)
  /// order. Every rank must call evaluate_exact_match; nullptr = this process evaluates all.
  dist::ProcessGroup* pg = nullptr;
  /// With pg: gather the prediction rows to rank 0 (set on every rank when rank 0 writes them).
  bool gather_predictions = false;
};

/// Aggregate result.
struct ExactMatchResult {
  int64_t n = 0;          // samples evaluated
  int64_t n_correct = 0;
  int64_t n_skipped = 0;  // bad records skipped
  double accuracy = 0.0;  // n_correct / n
  double seconds = 0.0;
  double samples_per_s = 0.0;
  std::map<std::string, double> reward_means;  // per reward function name (opts.rewards)
};

/// Strips leading/trailing whitespace (the comparison rule of exact match).
std::string trim(const std::string& s);

/// Runs greedy generation over the JSONL at `path` (records as for SFT; the final assistant turn
/// is the reference) and scores exact match. `ctx` supplies tokenizer, template and image
/// settings; the model runs on `device` with pixel_values cast to `dtype`. Each prediction goes to
/// `preds` (if not null) as {"id", "prediction", "prediction_ids", "reference", "correct"}.
/// At most opts.max_samples records are read (bad ones count). Throws Error(kData) for bad
/// records unless opts.skip_bad, dist::DistError when a peer fails.
ExactMatchResult evaluate_exact_match(model::Vlm& model, const data::SampleContext& ctx,
                                      const std::string& path, const ExactMatchOptions& opts,
                                      const torch::Device& device, torch::Dtype dtype,
                                      io::JsonlWriter* preds);

/// Settings of evaluate_loss.
struct LossEvalOptions {
  int64_t batch_size = 8;
  int64_t max_samples = 0;  // 0 = all
  int64_t num_workers = 2;
  bool skip_bad = false;
  bool show_progress = true;
  dist::ProcessGroup* pg = nullptr;  // as ExactMatchOptions::pg; the sums are all-reduced
};

/// Teacher-forced loss over a JSONL of conversations.
struct LossEvalResult {
  int64_t n = 0;          // conversations
  int64_t n_tokens = 0;   // supervised targets (assistant replies and their end tokens)
  int64_t n_skipped = 0;
  double loss = 0.0;        // mean next-token cross-entropy per supervised target, nats
  double perplexity = 0.0;  // exp(loss)
  double seconds = 0.0;
};

/// Mean cross-entropy and perplexity of the model on the assistant turns of the JSONL at `path`
/// (records as for SFT, labels as SFT builds them; the same quantity as the SFT loss, summed over
/// every supervised token of the file and then divided, so batches of any size give one number).
/// Throws Error(kData) for bad records unless opts.skip_bad, or when no token is supervised.
LossEvalResult evaluate_loss(model::Vlm& model, const data::SampleContext& ctx,
                             const std::string& path, const LossEvalOptions& opts,
                             const torch::Device& device, torch::Dtype dtype);

}  // namespace mmpost::train
