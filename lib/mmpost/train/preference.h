// Model-side pieces of preference optimization shared by `mmpost dpo`, `mmpost eval` on
// preference data and the reference precompute: the concatenated forward (one vision pass per
// image for chosen and rejected rows), reward-accuracy evaluation and the cached reference
// log-probs of `precompute_ref_log_probs`.
#pragma once

#include <torch/torch.h>

#include <filesystem>
#include <map>
#include <string>

#include "mmpost/algo/dpo_loss.h"
#include "mmpost/data/preference_dataset.h"
#include "mmpost/dist/process_group.h"
#include "mmpost/model/lora.h"
#include "mmpost/model/vlm.h"

namespace mmpost::train {

/// Output of one concatenated forward over a PreferenceBatch of B pairs.
struct PreferenceForward {
  algo::PreferenceLogps logps;  // [B] sums, counts, LD-DPO tails, WPO sums (when requested)
  torch::Tensor logits_mean_chosen, logits_mean_rejected;  // [B] mean logit over tokens x vocab
  torch::Tensor chosen_corrupted;  // [B] mDPO: chosen logps given the corrupted image (or undefined)
};

/// Rows: [prompt+chosen (B), prompt+rejected (B), and with `with_corrupted` prompt+chosen again
/// (B) seen with b.corrupted_pixel_values]. The vision tower runs once on b.pixel_values (and once
/// on the corrupted images); its features are reused for every row of the same sample. Gradients
/// flow unless the caller holds a NoGradGuard. Throws Error(kData) on image-token mismatches.
/// `padding_free` (TRL's DPOConfig name): each row runs alone at its own length with its own
/// images through the vision tower, so its values do not depend on the rest of the batch or on
/// padding (bit-identical across batchings; what makes precomputed reference log-probs equal the
/// live ones); slower, as rows are not batched.
/// chunk_rows > 0 (the batched forward without WPO): only the completion tokens go through
/// the LM head, chunk_rows at a time (algo::token_stats_from_hidden), so the [2B, T, V] float32
/// logits never exist whole; 0: whole logits.
PreferenceForward preference_forward(model::Vlm& model, const data::PreferenceBatch& b,
                                     bool with_log_sum_sq, bool with_corrupted,
                                     bool padding_free = false, int64_t chunk_rows = 0);

/// Summary of a policy vs its reference on preference pairs (TRL's eval metrics).
struct PreferenceEvalResult {
  int64_t n = 0, n_skipped = 0;
  double accuracy = 0;        // mean(rewards/chosen > rewards/rejected)
  double margin = 0;          // mean(rewards/chosen - rewards/rejected)
  double reward_chosen = 0, reward_rejected = 0;
  double logps_chosen = 0, logps_rejected = 0;  // policy, mean over pairs
};

/// Options for evaluate_preferences and precompute_reference_logps.
struct PreferenceEvalOptions {
  double beta = 0.1;
  int64_t batch_size = 16;
  int64_t max_samples = 0;  // 0 = all
  int64_t num_workers = 2;
  bool skip_bad = false;
  bool show_progress = true;
  data::PreferenceLimits limits;
  bool padding_free = false;  // see preference_forward
  /// evaluate_preferences under torchrun / srun: each rank scores its share of the records
  /// (positions p % world == rank), the sums are all-reduced and every rank gets the result.
  dist::ProcessGroup* pg = nullptr;
  /// Set when the reference is the policy itself under LoRA: these adapters are switched off
  /// around each reference forward (model::AdaptersDisabled).
  model::LoraAdapters* reference_adapters_off = nullptr;
};

/// Reference log-probs per JSONL line: chosen, rejected, chosen_tail, rejected_tail (float32).
struct ReferenceLogpsCache {
  std::map<int64_t, std::array<float, 4>> by_line;
  /// Looks the batch up -> PreferenceLogps [B] on `device`. Throws Error(kRuntime) for a line
  /// missing from the cache (the data changed since it was computed).
  algo::PreferenceLogps lookup(const data::PreferenceBatch& b, const torch::Device& device) const;
};

/// Rewards beta * (log pi - log ref) summed over completion tokens. The reference log-probs come
/// from `reference`, else from `ref_cache` (precomputed for this file); with both null the rewards
/// are beta * log pi (reference-free). Records as for `mmpost dpo`; `ctx` gives tokenizer,
/// template and images (source/base_dir are set from `path`). opts.max_samples caps the records
/// read (the first N lines' records; bad ones skipped under skip_bad). With opts.pg the ranks
/// share the records and return the same numbers as one process. Throws Error(kData) on bad
/// records unless opts.skip_bad, dist::DistError when a peer fails.
PreferenceEvalResult evaluate_preferences(model::Vlm& policy, model::Vlm* reference,
                                          const data::SampleContext& ctx, const std::string& path,
                                          const PreferenceEvalOptions& opts,
                                          const torch::Device& device, torch::Dtype dtype,
                                          const ReferenceLogpsCache* ref_cache = nullptr);

/// Scores every record of `path` with the reference model (one pass, no grad) and writes
/// `cache_file` (safetensors: line, chosen, rejected, chosen_tail, rejected_tail; metadata `key`).
/// When `cache_file` exists with the same `key` it is loaded instead (resume). With `pg` every
/// rank scores its share of the records, all ranks get every row, and rank 0 writes the file.
ReferenceLogpsCache precompute_reference_logps(model::Vlm& reference,
                                               const data::SampleContext& ctx,
                                               const std::string& path,
                                               const PreferenceEvalOptions& opts,
                                               const torch::Device& device, torch::Dtype dtype,
                                               const std::filesystem::path& cache_file,
                                               const std::string& key,
                                               dist::ProcessGroup* pg = nullptr);

}  // namespace mmpost::train
