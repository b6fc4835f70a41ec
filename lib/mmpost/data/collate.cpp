// Batch collation (see collate.h).
#include "mmpost/data/collate.h"

#include <algorithm>
#include <stdexcept>

#include "mmpost/algo/ignore_index.h"

namespace mmpost::data {
namespace {
/// [b, t] ids of pad_id, mask 0, labels algo::kIgnoreIndex.
Batch blank_batch(int64_t b, int64_t t, int64_t pad_id) {
  Batch out;
  out.input_ids = torch::full({b, t}, pad_id, torch::kInt64);
  out.attention_mask = torch::zeros({b, t}, torch::kInt64);
  out.labels = torch::full({b, t}, algo::kIgnoreIndex, torch::kInt64);
  return out;
}

Batch pad_rows(const std::vector<std::vector<int64_t>>& ids,
               const std::vector<std::vector<int64_t>>& labels, int64_t pad_id, bool left_pad) {
  const int64_t b = static_cast<int64_t>(ids.size());
  int64_t t = 0;
  for (const auto& r : ids) t = std::max<int64_t>(t, r.size());
  Batch out = blank_batch(b, t, pad_id);
  auto ids_a = out.input_ids.accessor<int64_t, 2>();
  auto mask_a = out.attention_mask.accessor<int64_t, 2>();
  auto lab_a = out.labels.accessor<int64_t, 2>();
  for (int64_t i = 0; i < b; ++i) {
    const int64_t n = static_cast<int64_t>(ids[i].size());
    const int64_t off = left_pad ? t - n : 0;
    for (int64_t j = 0; j < n; ++j) {
      ids_a[i][off + j] = ids[i][j];
      mask_a[i][off + j] = 1;
      if (j < static_cast<int64_t>(labels[i].size())) {
        lab_a[i][off + j] = labels[i][j];
        if (labels[i][j] != algo::kIgnoreIndex) ++out.n_supervised;
      }
    }
    out.n_tokens += n;
  }
  return out;
}

torch::Tensor stack_images(const std::vector<SftSample>& samples) {
  std::vector<torch::Tensor> pix;
  for (const auto& s : samples) {
    if (s.pixel_values.defined() && s.pixel_values.size(0) > 0) pix.push_back(s.pixel_values);
  }
  return pix.empty() ? torch::Tensor() : torch::cat(pix, /*dim=*/0);
}

// Qwen2-VL: the samples' image_grid_thw rows in order, [N, 3] (undefined without any).
torch::Tensor stack_grids(const std::vector<SftSample>& samples) {
  std::vector<torch::Tensor> grids;
  for (const auto& s : samples) {
    if (s.image_grid_thw.defined() && s.image_grid_thw.size(0) > 0) grids.push_back(s.image_grid_thw);
  }
  return grids.empty() ? torch::Tensor() : torch::cat(grids, /*dim=*/0);
}
}  // namespace

Batch Batch::to(const torch::Device& device, torch::Dtype pixel_dtype) const {
  Batch b = *this;
  b.input_ids = input_ids.to(device);
  b.attention_mask = attention_mask.to(device);
  b.labels = labels.to(device);
  if (pixel_values.defined()) b.pixel_values = pixel_values.to(device, pixel_dtype);
  if (image_grid_thw.defined()) b.image_grid_thw = image_grid_thw.to(device);
  if (position_ids.defined()) b.position_ids = position_ids.to(device);
  return b;
}

Batch collate(const std::vector<SftSample>& samples, int64_t pad_id, bool left_pad) {
  if (samples.empty()) throw std::invalid_argument("collate: no samples");
  std::vector<std::vector<int64_t>> ids, labels;
  for (const auto& s : samples) {
    ids.push_back(s.input_ids);
    labels.push_back(s.labels);
  }
  Batch out = pad_rows(ids, labels, pad_id, left_pad);
  out.pixel_values = stack_images(samples);
  out.image_grid_thw = stack_grids(samples);
  for (const auto& s : samples) out.ids.push_back(s.id);
  return out;
}

Batch collate_packed(const std::vector<SftSample>& samples, int64_t pad_id, int64_t capacity) {
  if (samples.empty()) throw std::invalid_argument("collate_packed: no samples");
  const int64_t n = static_cast<int64_t>(samples.size());
  std::vector<int64_t> order(n);
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  auto len = [&](int64_t i) { return static_cast<int64_t>(samples[i].input_ids.size()); };
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return len(a) > len(b); });
  capacity = std::max(capacity, len(order.front()));
  std::vector<std::vector<int64_t>> rows;  // sample indices per row, in placement order
  std::vector<int64_t> used;
  for (int64_t i : order) {
    int64_t best = -1;
    for (size_t r = 0; r < rows.size(); ++r) {
      const int64_t room = capacity - used[r];
      if (room >= len(i) && (best < 0 || room < capacity - used[best])) best = static_cast<int64_t>(r);
    }
    if (best < 0) {
      rows.emplace_back();
      used.push_back(0);
      best = static_cast<int64_t>(rows.size()) - 1;
    }
    rows[best].push_back(i);
    used[best] += len(i);
  }
  const int64_t R = static_cast<int64_t>(rows.size());
  const int64_t T = *std::max_element(used.begin(), used.end());
  Batch out = blank_batch(R, T, pad_id);
  auto ids_a = out.input_ids.accessor<int64_t, 2>();
  auto mask_a = out.attention_mask.accessor<int64_t, 2>();
  auto lab_a = out.labels.accessor<int64_t, 2>();
  std::vector<SftSample> placed;  // samples in packed order, for the images
  for (int64_t r = 0; r < R; ++r) {
    int64_t t = 0;
    for (size_t k = 0; k < rows[r].size(); ++k) {
      const auto& s = samples[rows[r][k]];
      for (size_t j = 0; j < s.input_ids.size(); ++j, ++t) {
        ids_a[r][t] = s.input_ids[j];
        mask_a[r][t] = static_cast<int64_t>(k) + 1;
        const int64_t label = j == 0 || j >= s.labels.size() ? algo::kIgnoreIndex : s.labels[j];
        lab_a[r][t] = label;
        if (label != algo::kIgnoreIndex) ++out.n_supervised;
      }
      out.n_tokens += static_cast<int64_t>(s.input_ids.size());
      placed.push_back(s);
      out.ids.push_back(s.id);
    }
  }
  out.pixel_values = stack_images(placed);
  out.image_grid_thw = stack_grids(placed);
  return out;
}

Batch collate_prompts(const std::vector<SftSample>& samples, int64_t pad_id) {
  if (samples.empty()) throw std::invalid_argument("collate_prompts: no samples");
  std::vector<std::vector<int64_t>> ids, labels;
  for (const auto& s : samples) {
    size_t k = 0;
    while (k < s.labels.size() && s.labels[k] == algo::kIgnoreIndex) ++k;
    ids.emplace_back(s.input_ids.begin(), s.input_ids.begin() + k);
    labels.emplace_back();
  }
  Batch out = pad_rows(ids, labels, pad_id, /*left_pad=*/true);
  out.pixel_values = stack_images(samples);
  out.image_grid_thw = stack_grids(samples);
  for (const auto& s : samples) out.ids.push_back(s.id);
  return out;
}

}  // namespace mmpost::data
