// Rollouts for online RL (see rollout.h).
#include "mmpost/train/rollout.h"

#include "mmpost/algo/chunked_logps.h"
#include "mmpost/algo/logprobs.h"
#include "mmpost/data/collate.h"

namespace mmpost::train {
using torch::Tensor;

namespace {

/// Row index that repeats each prompt's block of `counts[i]` items G times (GRPO layout).
Tensor repeat_index(const std::vector<int64_t>& counts, int64_t G, const torch::Device& device) {
  std::vector<int64_t> index;
  int64_t first = 0;
  for (int64_t c : counts) {
    for (int64_t g = 0; g < G; ++g) {
      for (int64_t k = 0; k < c; ++k) index.push_back(first + k);
    }
    first += c;
  }
  return torch::tensor(index, torch::kInt64).to(device);
}

/// Rows of pixel_values per image: 1 (LLaVA: [N, 3, H, W]) or t * h * w patches (Qwen2-VL
/// family, from image_grid_thw [N, 3]).
std::vector<int64_t> rows_per_image(const Tensor& pixel_values, const Tensor& image_grid_thw) {
  if (!pixel_values.defined()) return {};
  if (!image_grid_thw.defined()) return std::vector<int64_t>(pixel_values.size(0), 1);
  auto n = image_grid_thw.prod(/*dim=*/1).to(torch::kCPU, torch::kInt64).contiguous();
  return {n.data_ptr<int64_t>(), n.data_ptr<int64_t>() + n.numel()};
}

/// Sums consecutive groups of `per_item` (counts[i] items each) -> one total per group.
std::vector<int64_t> group_sums(const std::vector<int64_t>& per_item,
                                const std::vector<int64_t>& counts, int64_t first_item = 0) {
  std::vector<int64_t> out;
  int64_t k = first_item;
  for (int64_t c : counts) {
    int64_t sum = 0;
    for (int64_t j = 0; j < c; ++j) sum += per_item[k++];
    out.push_back(sum);
  }
  return out;
}

}  // namespace

Rollout sample_rollout(model::Vlm& model, const std::vector<data::SftSample>& samples,
                       std::vector<int64_t> prompt_index, int64_t G,
                       const model::GenerationConfig& gen, int64_t pad_id,
                       const torch::Device& device, torch::Dtype dtype) {
  Rollout r;
  r.P = static_cast<int64_t>(samples.size());
  r.G = G;
  r.prompt_index = std::move(prompt_index);
  auto pb = data::collate_prompts(samples, pad_id).to(device, dtype);
  for (const auto& s : samples) {
    const auto& images = s.image_grid_thw.defined() ? s.image_grid_thw : s.pixel_values;
    r.image_counts.push_back(images.defined() ? images.size(0) : 0);
  }
  r.pixel_values = pb.pixel_values;
  r.image_grid_thw = pb.image_grid_thw;
  auto rep = model::repeat_interleave_batch(pb.input_ids, pb.attention_mask,
                                            {pb.pixel_values, pb.image_grid_thw}, r.image_counts,
                                            G);
  r.prompt_ids = rep.input_ids;
  r.prompt_mask = rep.attention_mask;
  r.row_pixel_values = rep.pixel_values;
  r.row_image_grid_thw = rep.image_grid_thw;
  model->eval();
  model::GenerationOutput go;
  {
    torch::NoGradGuard no_grad;
    go = model::generate(model, rep.input_ids, rep.attention_mask,
                         {rep.pixel_values, rep.image_grid_thw}, gen);
  }
  model->train();
  const int64_t Tc = go.sequences.size(1);
  r.completion = go.sequences;
  r.lengths = go.lengths.cpu();
  r.truncated = go.truncated.cpu();
  auto lengths = go.lengths.to(device);
  r.mask = (torch::arange(Tc, device).unsqueeze(0) < lengths.unsqueeze(1)).to(torch::kFloat32);
  r.old_logps = go.logps.to(torch::kFloat32) * r.mask;
  return r;
}

/// Keeps the prompts `keep` (indices into 0..P-1) of a rollout, with their G rows and images.
Rollout select_prompts(const Rollout& r, const std::vector<int64_t>& keep) {
  Rollout o = r;
  o.P = static_cast<int64_t>(keep.size());
  // pixel_values rows of each prompt: its images (LLaVA) or their patches (Qwen2-VL).
  const auto pixel_rows = group_sums(rows_per_image(r.pixel_values, r.image_grid_thw),
                                     r.image_counts);
  std::vector<int64_t> rows, images, patches, firsts, patch_firsts;
  int64_t first = 0, patch_first = 0;
  for (size_t p = 0; p < r.image_counts.size(); ++p) {
    firsts.push_back(first), first += r.image_counts[p];
    if (!pixel_rows.empty()) patch_firsts.push_back(patch_first), patch_first += pixel_rows[p];
  }
  o.image_counts.clear();
  o.prompt_index.clear();
  for (int64_t p : keep) {
    for (int64_t g = 0; g < r.G; ++g) rows.push_back(p * r.G + g);
    for (int64_t k = 0; k < r.image_counts[p]; ++k) images.push_back(firsts[p] + k);
    if (!pixel_rows.empty()) {
      for (int64_t k = 0; k < pixel_rows[p]; ++k) patches.push_back(patch_firsts[p] + k);
    }
    o.image_counts.push_back(r.image_counts[p]);
    o.prompt_index.push_back(r.prompt_index[p]);
  }
  auto dev = r.prompt_ids.device();
  auto ri = torch::tensor(rows, torch::kInt64).to(dev);
  for (Tensor* t : {&o.prompt_ids, &o.prompt_mask, &o.completion, &o.mask, &o.old_logps,
                    &o.ref_logps, &o.old_values, &o.returns, &o.advantages}) {
    if (t->defined()) *t = t->index_select(0, ri);
  }
  auto ri_cpu = torch::tensor(rows, torch::kInt64);
  for (Tensor* t : {&o.lengths, &o.truncated}) {
    if (t->defined()) *t = t->index_select(0, ri_cpu.to(t->device()));
  }
  o.row_pixel_values = Tensor();  // per-row images are only needed before selection (rewards)
  o.row_image_grid_thw = Tensor();
  if (r.pixel_values.defined()) {
    o.pixel_values = patches.empty() ? Tensor()
                                     : r.pixel_values.index_select(
                                           0, torch::tensor(patches, torch::kInt64).to(dev));
  }
  if (r.image_grid_thw.defined()) {
    o.image_grid_thw = images.empty() ? Tensor()
                                      : r.image_grid_thw.index_select(
                                            0, torch::tensor(images, torch::kInt64).to(dev));
  }
  return o;
}

TokenForward completion_forward(model::Vlm& m, const Rollout& r, int64_t p0, int64_t p1,
                                bool keep_logits, int64_t chunk_rows) {
  const int64_t G = r.G, rows0 = p0 * G, rows = (p1 - p0) * G;
  Tensor features, grids;
  int64_t img0 = 0, n_img = 0;
  for (int64_t p = 0; p < p0; ++p) img0 += r.image_counts[p];
  std::vector<int64_t> counts(r.image_counts.begin() + p0, r.image_counts.begin() + p1);
  for (int64_t c : counts) n_img += c;
  if (n_img > 0 && r.image_grid_thw.defined()) {
    // Qwen2-VL family: features [K, C], t * h * w / merge^2 rows per image.
    const auto per_image = rows_per_image(r.pixel_values, r.image_grid_thw);
    const int64_t row0 = group_sums(per_image, {img0}).front();
    const int64_t n_rows = group_sums(per_image, {n_img}, img0).front();
    auto grid = r.image_grid_thw.narrow(0, img0, n_img);
    auto f = m->image_features(model::Images(r.pixel_values.narrow(0, row0, n_rows), grid));
    const int64_t unit = n_rows / f.size(0);  // merge^2 patches per feature row
    auto tokens = group_sums(per_image, counts, img0);
    for (auto& t : tokens) t /= unit;
    features = f.index_select(0, repeat_index(tokens, G, f.device()));
    grids = grid.index_select(0, repeat_index(counts, G, grid.device()));
  } else if (n_img > 0) {
    auto f = m->image_features(r.pixel_values.narrow(0, img0, n_img));  // [n, P, C] once
    features = f.index_select(0, repeat_index(counts, G, f.device()));
  }
  auto comp = r.completion.narrow(0, rows0, rows);
  auto cmask = r.mask.narrow(0, rows0, rows);
  auto ids = torch::cat({r.prompt_ids.narrow(0, rows0, rows), comp}, 1);  // [rows, Tp + Tc]
  auto mask = torch::cat({r.prompt_mask.narrow(0, rows0, rows), cmask.to(torch::kInt64)}, 1);
  auto h = m->forward_hidden_features(ids, features, mask, grids);  // [rows, Tp + Tc, C]
  const int64_t Tp = r.prompt_ids.size(1), Tc = comp.size(1);
  TokenForward out;
  out.hidden = h.narrow(1, Tp - 1, Tc);  // position Tp-1+t predicts completion token t
  if (chunk_rows > 0 && !keep_logits) {
    auto idx = cmask.reshape({-1}).ne(0).nonzero().squeeze(-1);
    auto hs = out.hidden.reshape({-1, out.hidden.size(2)}).index_select(0, idx);
    auto picked = algo::linear_token_logps(hs, m->language_model->output_weight(),
                                           comp.reshape({-1}).index_select(0, idx), chunk_rows);
    out.logps = torch::zeros({rows * Tc}, picked.options()).index_put({idx}, picked).view({rows, Tc});
    return out;
  }
  auto logits = m->logits(out.hidden);   // [rows, Tc, V] float32
  auto labels = comp.masked_fill(cmask.eq(0), algo::kIgnoreIndex);
  out.logps = algo::selective_log_softmax(logits, labels);
  if (keep_logits) out.logits = logits;
  return out;
}

double mean_entropy(const Tensor& logits, const Tensor& mask) {
  torch::NoGradGuard no_grad;
  double total = 0;
  for (int64_t i = 0; i < logits.size(0); ++i) {
    auto lp = torch::log_softmax(logits[i], -1);
    total += (-(lp.exp() * lp).sum(-1) * mask[i]).sum().item<double>();
  }
  return total / std::max(1.0, mask.sum().item<double>());
}

double std_of(const Tensor& t) {
  return t.numel() > 1 ? t.to(torch::kFloat64).std().item<double>() : 0.0;
}

}  // namespace mmpost::train
