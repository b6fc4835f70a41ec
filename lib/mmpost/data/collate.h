// Collation: samples -> padded batch tensors (right padding for training, left for generation),
// labels padded with algo::kIgnoreIndex, images stacked in sample order.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "mmpost/data/sft_dataset.h"

namespace mmpost::data {

/// A training/eval batch. All tensors on CPU until moved with to().
struct Batch {
  torch::Tensor input_ids;       // [B, T] int64, padded with pad_id
  torch::Tensor attention_mask;  // [B, T] int64, 1 = token, 0 = padding; packed rows
                                 // (collate_packed): k = the row's k-th sample (1-based)
  torch::Tensor labels;          // [B, T] int64, algo::kIgnoreIndex on padding and unsupervised
  torch::Tensor pixel_values;    // [N, 3, H, W] float32, images of all samples in order; may be undefined
                                 // (Qwen2-VL: [sum of patches, D], concatenated in order)
  torch::Tensor image_grid_thw;  // Qwen2-VL: [N, 3] int64, one row per image in order; else undefined
  std::vector<std::string> ids;  // sample ids
  int64_t n_supervised = 0;      // labels != algo::kIgnoreIndex (before the causal shift)
  int64_t n_tokens = 0;          // real tokens (attention_mask != 0)
  torch::Tensor position_ids;    // packed rows: [B, T] (LLaVA) or [3, B, T] (Qwen2-VL M-RoPE)
                                 // restarting at each sample (model::packed_position_ids);
                                 // else undefined (positions from the mask)

  /// Copies the tensors to `device` (pixel_values also cast to `pixel_dtype`).
  Batch to(const torch::Device& device, torch::Dtype pixel_dtype = torch::kFloat32) const;
};

/// Pads samples to the longest one. `left_pad` puts padding first (for batched generation).
/// Throws std::invalid_argument on an empty sample list.
Batch collate(const std::vector<SftSample>& samples, int64_t pad_id, bool left_pad = false);

/// Packs samples into as few rows as fit: best-fit decreasing (longest sample first, each into
/// the row with the least room that still holds it, else a new row) with row capacity
/// max(capacity, the longest sample); a sample is never split, so its images stay whole. Rows
/// are right padded to the fullest row. attention_mask numbers the samples of a row 1, 2, ...
/// (0 = padding), which the decoder's mask turns into attention that never crosses samples
/// (model::causal_bias). Each sample's first label is algo::kIgnoreIndex: unpacked it is never a
/// target (the causal shift drops it), packed it would be predicted from the previous sample.
/// Images (and Qwen2-VL grids) follow the samples' packed order, row by row. position_ids is left
/// undefined (the model computes them per sample: model::packed_position_ids).
/// Same supervised targets as collate() on the same samples, so the summed loss is the same.
/// Throws std::invalid_argument on an empty sample list.
Batch collate_packed(const std::vector<SftSample>& samples, int64_t pad_id, int64_t capacity);

/// Collates only the prompt part: each sample's ids up to (excluding) its first supervised
/// token, left padded; for eval/generation. Labels hold the full reference ids.
Batch collate_prompts(const std::vector<SftSample>& samples, int64_t pad_id);

}  // namespace mmpost::data
