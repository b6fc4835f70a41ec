// Concatenated preference forward, reward-accuracy evaluation and the reference-logps cache
// (see preference.h).
#include "mmpost/train/preference.h"

#include "mmpost/algo/chunked_logps.h"

#include "mmpost/core/check.h"
#include "mmpost/io/jsonl.h"
#include "mmpost/core/log.h"
#include "mmpost/data/loader.h"
#include "mmpost/dist/process_group.h"
#include "mmpost/io/safetensors.h"

namespace mmpost::train {
namespace {

/// A streaming loader over a preference JSONL in file order (eval / precompute).
std::unique_ptr<data::StreamingLoader<data::PreferenceSample>> file_order_loader(
    data::SampleContext& c, const std::string& path, const PreferenceEvalOptions& opts,
    int rank = 0, int world_size = 1) {
  c.source = io::display_name(path);
  c.base_dir = io::relative_base(path);
  c.random_shift = 0;
  data::LoaderOptions lo;
  lo.path = path;
  lo.batch_size = opts.batch_size;
  lo.num_workers = opts.num_workers;
  lo.skip_bad = opts.skip_bad;
  lo.rank = rank;
  lo.world_size = world_size;
  lo.max_records = opts.max_samples;
  auto limits = opts.limits;
  return std::make_unique<data::StreamingLoader<data::PreferenceSample>>(
      lo, [&c, limits](const nlohmann::json& rec, int64_t line) {
        return data::make_preference_sample(rec, line, c, limits);
      });
}

}  // namespace

namespace {
/// token_stats of each row run alone: row r's first L_r = attention_mask[r].sum() tokens (the
/// batch is right-padded) with its own images' features (`features_of_row[r]`, from the vision
/// tower run on that sample's images only, and their grids `grids_of_row[r]` for the Qwen2-VL
/// family; undefined for none), padded back to [R, T-1]. Nothing of another row or of the
/// padding enters a row's arithmetic, so its values do not depend on the batch it came in.
algo::TokenStats padding_free_stats(model::Vlm& model, const torch::Tensor& ids,
                                    const torch::Tensor& mask, const torch::Tensor& labels,
                                    const std::vector<torch::Tensor>& features_of_row,
                                    const std::vector<torch::Tensor>& grids_of_row,
                                    bool with_log_sum_sq) {
  const int64_t R = ids.size(0), T = ids.size(1);
  const auto lengths = mask.sum(/*dim=*/1).to(torch::kCPU, torch::kInt64);
  std::vector<torch::Tensor> logps, masks, lss, sums;
  for (int64_t r = 0; r < R; ++r) {
    const int64_t L = std::max<int64_t>(1, lengths[r].item<int64_t>());
    auto logits = model->forward_features(ids[r].narrow(0, 0, L).unsqueeze(0), features_of_row[r],
                                          mask[r].narrow(0, 0, L).unsqueeze(0),
                                          grids_of_row[r]);  // [1, L, V]
    auto st = algo::token_stats(logits, labels[r].narrow(0, 0, L).unsqueeze(0), with_log_sum_sq);
    const int64_t pad = (T - 1) - st.logps.size(1);
    namespace F = torch::nn::functional;
    logps.push_back(F::pad(st.logps, F::PadFuncOptions({0, pad})));
    masks.push_back(F::pad(st.mask, F::PadFuncOptions({0, pad})));
    if (with_log_sum_sq) lss.push_back(F::pad(st.log_sum_sq, F::PadFuncOptions({0, pad})));
    sums.push_back(st.logits_sum);
  }
  algo::TokenStats out;
  out.logps = torch::cat(logps);
  out.mask = torch::cat(masks);
  if (with_log_sum_sq) out.log_sum_sq = torch::cat(lss);
  out.logits_sum = torch::cat(sums);
  return out;
}

/// Pair i's images of a batch (b.n_images[i] of them, pairs in order): LLaVA rows of
/// pixel_values; Qwen2-VL family patches (t * h * w per image) with their grid rows.
struct PairImages {
  model::Images images, corrupted;
};
std::vector<PairImages> images_per_pair(const data::PreferenceBatch& b) {
  std::vector<PairImages> out(b.batch_size);
  if (!b.pixel_values.defined()) return out;
  TORCH_CHECK(static_cast<int64_t>(b.n_images.size()) == b.batch_size,
              "preference batch: n_images has ", b.n_images.size(), " entries for ", b.batch_size,
              " pairs (build batches with data::collate_preference)");
  const bool qwen = b.image_grid_thw.defined();
  torch::Tensor patches;  // [N] patches per image (Qwen2-VL)
  if (qwen) patches = b.image_grid_thw.prod(/*dim=*/1).to(torch::kCPU, torch::kInt64);
  int64_t image = 0, row = 0;  // first image / pixel_values row of pair i
  for (int64_t i = 0; i < b.batch_size; ++i) {
    const int64_t k = b.n_images[i];
    if (k == 0) continue;
    const int64_t rows = qwen ? patches.narrow(0, image, k).sum().item<int64_t>() : k;
    out[i].images.pixel_values = b.pixel_values.narrow(0, row, rows);
    if (qwen) out[i].images.image_grid_thw = b.image_grid_thw.narrow(0, image, k);
    if (b.corrupted_pixel_values.defined()) {
      out[i].corrupted = out[i].images;
      out[i].corrupted.pixel_values = b.corrupted_pixel_values.narrow(0, row, rows);
    }
    image += k;
    row += rows;
  }
  TORCH_CHECK(row == b.pixel_values.size(0), "preference batch: n_images covers ", row,
              " pixel_values rows of ", b.pixel_values.size(0));
  return out;
}
}  // namespace

PreferenceForward preference_forward(model::Vlm& model, const data::PreferenceBatch& b,
                                     bool with_log_sum_sq, bool with_corrupted, bool padding_free,
                                     int64_t chunk_rows) {
  const int64_t B = b.batch_size;
  auto ids = b.input_ids, mask = b.attention_mask, labels = b.labels;  // [2B, T]
  if (with_corrupted) {
    TORCH_CHECK(!b.pixel_values.defined() || b.corrupted_pixel_values.defined(),
                "preference_forward: mDPO needs corrupted_pixel_values");
    ids = torch::cat({ids, b.input_ids.narrow(0, 0, B)});  // [3B, T]
    mask = torch::cat({mask, b.attention_mask.narrow(0, 0, B)});
    labels = torch::cat({labels, b.labels.narrow(0, 0, B)});
  }
  const int64_t R = ids.size(0);
  algo::TokenStats stats;
  if (padding_free) {
    // One vision pass per sample (its images alone), shared by its chosen and rejected rows.
    std::vector<torch::Tensor> features(R), grids(R);
    const auto pairs = images_per_pair(b);
    for (int64_t i = 0; i < B; ++i) {
      if (pairs[i].images.empty()) continue;
      features[i] = features[B + i] = model->image_features(pairs[i].images);
      grids[i] = grids[B + i] = pairs[i].images.image_grid_thw;
      if (with_corrupted) {
        features[2 * B + i] = model->image_features(pairs[i].corrupted);
        grids[2 * B + i] = pairs[i].corrupted.image_grid_thw;
      }
    }
    stats = padding_free_stats(model, ids, mask, labels, features, grids, with_log_sum_sq);
  } else {
    // Image features once per image ([N, P, C] LLaVA, [K, C] Qwen2-VL), repeated for the rows.
    torch::Tensor row_features, row_grids;
    if (b.pixel_values.defined()) {
      auto features = model->image_features(model::Images(b.pixel_values, b.image_grid_thw));
      row_features = torch::cat({features, features});
      if (b.image_grid_thw.defined()) row_grids = torch::cat({b.image_grid_thw, b.image_grid_thw});
      if (with_corrupted) {
        row_features = torch::cat(
            {row_features,
             model->image_features(model::Images(b.corrupted_pixel_values, b.image_grid_thw))});
        if (row_grids.defined()) row_grids = torch::cat({row_grids, b.image_grid_thw});
      }
    }
    if (chunk_rows > 0 && !with_log_sum_sq) {
      auto hidden = model->forward_hidden_features(ids, row_features, mask, row_grids);  // [R, T, C]
      stats = algo::token_stats_from_hidden(hidden, model->language_model->output_weight(), labels,
                                            chunk_rows);
    } else {
      auto logits = model->forward_features(ids, row_features, mask, row_grids);  // [R, T, V] f32
      stats = algo::token_stats(logits, labels, with_log_sum_sq);
    }
  }
  PreferenceForward out;
  out.logps = algo::preference_logps(stats, B);
  const double V = static_cast<double>(model->config().text_config.vocab_size);
  auto n = stats.mask.sum(/*dim=*/-1).to(torch::kFloat32).clamp_min(1) * V;  // [rows]
  auto logits_mean = stats.logits_sum / n;
  out.logits_mean_chosen = logits_mean.narrow(0, 0, B);
  out.logits_mean_rejected = logits_mean.narrow(0, B, B);
  if (with_corrupted) out.chosen_corrupted = stats.logps.narrow(0, 2 * B, B).sum(/*dim=*/-1);
  return out;
}

PreferenceEvalResult evaluate_preferences(model::Vlm& policy, model::Vlm* reference,
                                          const data::SampleContext& ctx, const std::string& path,
                                          const PreferenceEvalOptions& opts,
                                          const torch::Device& device, torch::Dtype dtype,
                                          const ReferenceLogpsCache* ref_cache) {
  data::SampleContext c = ctx;
  const int rank = opts.pg ? opts.pg->rank() : 0, world = opts.pg ? opts.pg->world_size() : 1;
  auto loader = file_order_loader(c, path, opts, rank, world);
  int64_t total = data::count_records(path);
  if (opts.max_samples > 0) total = std::min(total, opts.max_samples);
  Progress progress("eval", total);
  const int64_t pad_id = ctx.tokenizer->pad_id() >= 0 ? ctx.tokenizer->pad_id()
                                                       : ctx.tokenizer->eos_id();
  const bool was_training = policy->is_training();
  policy->eval();
  torch::NoGradGuard no_grad;
  // Sums over this rank's pairs: n, correct, margin, rewards chosen/rejected, logps chosen/rejected.
  std::vector<double> sums(7, 0.0);
  while (auto samples = loader->next_batch()) {
    if (samples->empty()) continue;  // a window whose records were all skipped (or another rank's)
    auto b = data::collate_preference(*samples, pad_id).to(device, dtype);
    auto p = preference_forward(policy, b, false, false, opts.padding_free).logps;
    auto chosen = p.chosen, rejected = p.rejected;
    if (reference != nullptr || ref_cache != nullptr) {
      algo::PreferenceLogps q;
      if (reference != nullptr) {
        model::AdaptersDisabled adapters_off(opts.reference_adapters_off);
        q = preference_forward(*reference, b, false, false, opts.padding_free).logps;
      } else {
        q = ref_cache->lookup(b, device);
      }
      chosen = chosen - q.chosen.to(chosen.device());
      rejected = rejected - q.rejected.to(rejected.device());
    }
    auto reward_c = (opts.beta * chosen).to(torch::kFloat64).cpu();
    auto reward_r = (opts.beta * rejected).to(torch::kFloat64).cpu();
    sums[0] += static_cast<double>(b.batch_size);
    sums[1] += (reward_c > reward_r).sum().item<double>();
    sums[2] += (reward_c - reward_r).sum().item<double>();
    sums[3] += reward_c.sum().item<double>();
    sums[4] += reward_r.sum().item<double>();
    sums[5] += p.chosen.to(torch::kFloat64).sum().item<double>();
    sums[6] += p.rejected.to(torch::kFloat64).sum().item<double>();
    if (opts.show_progress) {
      progress.update(static_cast<int64_t>(sums[0]) * world, "acc " + std::to_string(sums[1] / sums[0]));
    }
  }
  progress.finish();
  if (was_training) policy->train();
  sums.push_back(static_cast<double>(loader->n_skipped()));
  sums = dist::sum_over_ranks(opts.pg, std::move(sums));
  PreferenceEvalResult r;
  r.n = static_cast<int64_t>(sums[0]);
  r.n_skipped = static_cast<int64_t>(sums[7]);
  if (r.n > 0) {
    r.accuracy = sums[1] / sums[0];
    r.margin = sums[2] / sums[0];
    r.reward_chosen = sums[3] / sums[0];
    r.reward_rejected = sums[4] / sums[0];
    r.logps_chosen = sums[5] / sums[0];
    r.logps_rejected = sums[6] / sums[0];
  }
  return r;
}

algo::PreferenceLogps ReferenceLogpsCache::lookup(const data::PreferenceBatch& b,
                                                  const torch::Device& device) const {
  const int64_t B = b.batch_size;
  auto t = torch::empty({4, B}, torch::kFloat32);
  auto a = t.accessor<float, 2>();
  for (int64_t i = 0; i < B; ++i) {
    auto it = by_line.find(b.lines[i]);
    MMPOST_CHECK(it != by_line.end(), "reference log-probs cache: no entry for line ", b.lines[i],
                 " (id ", b.ids[i], ")",
                 "\n  hint: the training data changed; delete ref_logps.safetensors in the output "
                 "folder to recompute");
    for (int k = 0; k < 4; ++k) a[k][i] = it->second[k];
  }
  t = t.to(device);
  algo::PreferenceLogps p;
  p.chosen = t[0];
  p.rejected = t[1];
  p.chosen_tail = t[2];
  p.rejected_tail = t[3];
  return p;
}

ReferenceLogpsCache precompute_reference_logps(model::Vlm& reference,
                                               const data::SampleContext& ctx,
                                               const std::string& path,
                                               const PreferenceEvalOptions& opts,
                                               const torch::Device& device, torch::Dtype dtype,
                                               const std::filesystem::path& cache_file,
                                               const std::string& key, dist::ProcessGroup* pg) {
  ReferenceLogpsCache cache;
  if (std::filesystem::exists(cache_file)) {
    auto contents = io::read_safetensors(cache_file);
    auto it = contents.metadata.find("key");
    if (it != contents.metadata.end() && it->second == key) {
      auto lines = contents.tensors.at("line").contiguous();
      auto vals = torch::stack({contents.tensors.at("chosen"), contents.tensors.at("rejected"),
                                contents.tensors.at("chosen_tail"),
                                contents.tensors.at("rejected_tail")})
                      .contiguous();
      auto la = lines.accessor<int64_t, 1>();
      auto va = vals.accessor<float, 2>();
      for (int64_t i = 0; i < lines.size(0); ++i) {
        cache.by_line[la[i]] = {va[0][i], va[1][i], va[2][i], va[3][i]};
      }
      log_info("dpo: reference log-probs loaded from " + cache_file.string() + " (" +
               std::to_string(cache.by_line.size()) + " pairs)");
      return cache;
    }
    log_warn("dpo: " + cache_file.string() + " was computed for other settings; recomputing");
  }
  // Each rank scores its share of the records (positions p % world == rank); the rows are then
  // gathered on every rank, and rank 0 writes the file.
  const int rank = pg ? pg->rank() : 0, world = pg ? pg->world_size() : 1;
  data::SampleContext c = ctx;
  auto loader = file_order_loader(c, path, opts, rank, world);
  Progress progress("ref logps", data::count_records(path));
  const int64_t pad_id = ctx.tokenizer->pad_id() >= 0 ? ctx.tokenizer->pad_id()
                                                       : ctx.tokenizer->eos_id();
  const bool was_training = reference->is_training();  // the policy, under LoRA
  reference->eval();
  model::AdaptersDisabled adapters_off(opts.reference_adapters_off);
  torch::NoGradGuard no_grad;
  std::vector<double> rows;  // line, chosen, rejected, chosen_tail, rejected_tail per pair
  while (auto samples = loader->next_batch()) {
    if (samples->empty()) continue;  // a window whose records were all skipped (or another rank's)
    auto b = data::collate_preference(*samples, pad_id).to(device, dtype);
    auto p = preference_forward(reference, b, false, false, opts.padding_free).logps;
    auto v = torch::stack({p.chosen, p.rejected, p.chosen_tail, p.rejected_tail})
                 .to(torch::kCPU, torch::kFloat32)
                 .contiguous();
    auto va = v.accessor<float, 2>();
    for (int64_t i = 0; i < v.size(1); ++i) {
      rows.insert(rows.end(), {static_cast<double>(b.lines[i]), va[0][i], va[1][i], va[2][i],
                               va[3][i]});
    }
    progress.update(static_cast<int64_t>(rows.size() / 5) * world);
  }
  progress.finish();
  if (was_training) reference->train();
  if (pg) {
    auto parts = pg->all_gather_object(rows);
    rows.clear();
    for (const auto& part : parts) rows.insert(rows.end(), part.begin(), part.end());
  }
  for (size_t i = 0; i < rows.size(); i += 5) {
    const auto line = static_cast<int64_t>(rows[i]);
    cache.by_line[line] = {static_cast<float>(rows[i + 1]), static_cast<float>(rows[i + 2]),
                           static_cast<float>(rows[i + 3]), static_cast<float>(rows[i + 4])};
  }
  MMPOST_CHECK_DATA(!cache.by_line.empty(), path, ": no preference pairs to score");
  if (rank == 0) {  // in line order, whatever the world size
    std::vector<int64_t> lines;
    std::vector<float> cols[4];
    for (const auto& [line, v] : cache.by_line) {
      lines.push_back(line);
      for (int k = 0; k < 4; ++k) cols[k].push_back(v[k]);
    }
    const auto n = static_cast<int64_t>(lines.size());
    auto col = [&](int k) { return torch::from_blob(cols[k].data(), {n}, torch::kFloat32).clone(); };
    io::save_safetensors(cache_file,
                         {{"line", torch::tensor(lines, torch::kInt64)},
                          {"chosen", col(0)},
                          {"rejected", col(1)},
                          {"chosen_tail", col(2)},
                          {"rejected_tail", col(3)}},
                         {{"format", "pt"}, {"key", key}});
  }
  log_info("dpo: reference log-probs of " + std::to_string(cache.by_line.size()) + " pairs written to " +
           cache_file.string() + " (" + std::to_string(loader->n_skipped()) + " skipped)");
  return cache;
}

}  // namespace mmpost::train
