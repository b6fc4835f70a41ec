// Generation loop (see generation.h). The loop stays explicit: prefill, then pick -> append ->
// decode one token, with one host sync per step to stop early once all rows are done (stop
// sequences and stop_check are evaluated on the host, from the same synced step).
#include "mmpost/model/generation.h"

#include <cmath>

#include "mmpost/core/check.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <mutex>

namespace mmpost::model {
namespace {
bool ends_with(const std::vector<int64_t>& ids, const std::vector<int64_t>& tail) {
  return ids.size() >= tail.size() && std::equal(tail.rbegin(), tail.rend(), ids.rbegin());
}

// Host-side stop criteria: keeps each running row's new ids and reports which rows just hit a
// stop sequence or the caller's stop_check. Idle (no copies) when neither is configured.
class StopTracker {
 public:
  StopTracker(const GenerationConfig& cfg, int64_t batch)
      : cfg_(cfg), active_(!cfg.stop_token_sequences.empty() || bool(cfg.stop_check)) {
    for (const auto& seq : cfg.stop_token_sequences) {
      MMPOST_CHECK_USAGE(!seq.empty(), "generation: empty stop sequence (a stop string that "
                                       "tokenizes to nothing?)");
    }
    if (active_) rows_.resize(batch);
  }

  // next [B] int64 (already padded where `running` is false), running [B] bool -> hits [B] bool.
  torch::Tensor update(const torch::Tensor& next, const torch::Tensor& running) {
    if (!active_) return torch::zeros_like(running);
    auto next_cpu = next.to(torch::kCPU);
    auto running_cpu = running.to(torch::kCPU);
    auto hits = torch::zeros({next_cpu.size(0)}, torch::kBool);
    auto n = next_cpu.accessor<int64_t, 1>();
    auto r = running_cpu.accessor<bool, 1>();
    auto h = hits.accessor<bool, 1>();
    for (int64_t i = 0; i < next_cpu.size(0); ++i) {
      if (!r[i]) continue;
      rows_[i].push_back(n[i]);
      h[i] = std::any_of(cfg_.stop_token_sequences.begin(), cfg_.stop_token_sequences.end(),
                         [&](const auto& seq) { return ends_with(rows_[i], seq); }) ||
             (cfg_.stop_check && cfg_.stop_check(rows_[i]));
    }
    return hits.to(next.device());
  }

 private:
  const GenerationConfig& cfg_;
  bool active_;
  std::vector<std::vector<int64_t>> rows_;
};
}  // namespace

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kEos: return "eos";
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
  }
  return "unknown";
}

RepeatedBatch repeat_interleave_batch(const torch::Tensor& input_ids,
                                      const torch::Tensor& attention_mask, const Images& images,
                                      const std::vector<int64_t>& image_counts,
                                      int64_t num_generations) {
  MMPOST_CHECK_USAGE(num_generations >= 1, "num_generations must be >= 1, got ",
                     num_generations);
  const int64_t B = input_ids.size(0);
  TORCH_CHECK(static_cast<int64_t>(image_counts.size()) == B, "repeat_interleave_batch: ",
              image_counts.size(), " image counts for ", B, " samples");
  const auto& pixel_values = images.pixel_values;
  const bool grids = images.image_grid_thw.defined();
  const int64_t n_images = grids ? images.image_grid_thw.size(0)
                                 : (pixel_values.defined() ? pixel_values.size(0) : 0);
  // Rows of pixel_values each image owns: one (LLaVA) or its t*h*w patches (Qwen2-VL).
  std::vector<int64_t> row0(n_images + 1, 0);
  if (grids) {
    auto g = images.image_grid_thw.to(torch::kCPU).contiguous();
    auto acc = g.accessor<int64_t, 2>();
    for (int64_t i = 0; i < n_images; ++i) row0[i + 1] = row0[i] + acc[i][0] * acc[i][1] * acc[i][2];
  } else {
    for (int64_t i = 0; i < n_images; ++i) row0[i + 1] = i + 1;
  }
  RepeatedBatch out;
  out.input_ids = input_ids.repeat_interleave(num_generations, /*dim=*/0);        // [B*G, T]
  out.attention_mask = attention_mask.repeat_interleave(num_generations, /*dim=*/0);
  // Image rows of the output: sample i's block of images, G times, then sample i+1's.
  std::vector<int64_t> rows, image_index;
  int64_t first = 0;
  for (int64_t count : image_counts) {
    TORCH_CHECK(count >= 0, "repeat_interleave_batch: negative image count");
    TORCH_CHECK(first + count <= n_images, "repeat_interleave_batch: image counts exceed the ",
                n_images, " images given");
    for (int64_t g = 0; g < num_generations; ++g) {
      for (int64_t k = first; k < first + count; ++k) {
        image_index.push_back(k);
        for (int64_t r = row0[k]; r < row0[k + 1]; ++r) rows.push_back(r);
      }
    }
    first += count;
  }
  TORCH_CHECK(first == n_images, "repeat_interleave_batch: image counts sum to ", first,
              " but pixel_values holds ", n_images, " images");
  if (n_images > 0) {
    const auto opts = torch::dtype(torch::kInt64).device(pixel_values.device());
    out.pixel_values = pixel_values.index_select(/*dim=*/0, torch::tensor(rows, opts));
    if (grids) {
      out.image_grid_thw = images.image_grid_thw.index_select(
          0, torch::tensor(image_index, opts.device(images.image_grid_thw.device())));
    }
  }
  return out;
}

torch::Tensor select_next_token(const torch::Tensor& logits, const GenerationConfig& cfg,
                                torch::Generator& generator,
                                std::vector<torch::Generator>* row_generators) {
  if (cfg.temperature <= 0.0) return logits.argmax(/*dim=*/-1);
  auto scores = logits.to(torch::kFloat32) / cfg.temperature;  // [B, V]
  const double neg_inf = -std::numeric_limits<double>::infinity();
  if (cfg.top_k > 0 && cfg.top_k < scores.size(-1)) {
    auto kth = std::get<0>(scores.topk(cfg.top_k, /*dim=*/-1)).narrow(-1, cfg.top_k - 1, 1);
    scores = scores.masked_fill(scores < kth, neg_inf);
  }
  if (cfg.top_p < 1.0) {
    // HF TopPLogitsWarper: sort ascending, drop the low tail whose cumulative mass <= 1 - top_p,
    // always keeping the most likely token.
    auto [sorted, idx] = scores.sort(/*dim=*/-1, /*descending=*/false);
    auto cum = sorted.softmax(/*dim=*/-1).cumsum(/*dim=*/-1);
    auto drop_sorted = cum <= (1.0 - cfg.top_p);
    drop_sorted.narrow(-1, drop_sorted.size(-1) - 1, 1).fill_(false);
    auto drop = torch::zeros_like(drop_sorted).scatter(/*dim=*/-1, idx, drop_sorted);
    scores = scores.masked_fill(drop, neg_inf);
  }
  // Draw on the CPU generator so a seed gives the same tokens on every device.
  auto probs = scores.softmax(/*dim=*/-1).to(torch::kCPU);
  if (row_generators != nullptr && !row_generators->empty()) {
    // Inverse CDF, one 53-bit uniform u in (0, 1] per row from the row's own generator: the token
    // is the first whose cumulative probability reaches u * total. An exact draw from the
    // categorical (a zero-probability token is never chosen) with one random number per row,
    // instead of a torch.multinomial call per row, each an exponential race over the whole
    // vocabulary (V log1p per row and token: a quarter of a small model's rollout).
    const int64_t B = probs.size(0), V = probs.size(1);
    TORCH_CHECK(static_cast<int64_t>(row_generators->size()) == B, "select_next_token: ",
                row_generators->size(), " row generators for ", B, " rows");
    auto cdf = probs.to(torch::kFloat64).cumsum(/*dim=*/-1).contiguous();
    auto next = torch::empty({B}, torch::kInt64);
    const double* c = cdf.data_ptr<double>();
    int64_t* out = next.data_ptr<int64_t>();
    for (int64_t i = 0; i < B; ++i) {
      auto& gen = (*row_generators)[i];
      uint64_t r = 0;
      {
        std::lock_guard<std::mutex> lock(gen.mutex());
        r = gen.get<at::CPUGeneratorImpl>()->random64();
      }
      const double u = (static_cast<double>(r >> 11) + 1.0) * 0x1.0p-53;
      const double* row = c + i * V;
      const double total = row[V - 1];
      MMPOST_CHECK(std::isfinite(total) && total > 0, "generation: row ", i,
                   " has no valid token probabilities (NaN or infinite logits)");
      const int64_t k = std::lower_bound(row, row + V, u * total) - row;  // first cdf >= u * total
      out[i] = std::min(k, V - 1);
    }
    return next.to(logits.device());
  }
  auto next = torch::multinomial(probs, /*num_samples=*/1, /*replacement=*/false, generator);
  return next.squeeze(-1).to(logits.device());
}

GenerationOutput generate(const DecoderSteps& model, const torch::Tensor& input_ids,
                          const torch::Tensor& attention_mask, const GenerationConfig& cfg,
                          bool use_cache) {
  MMPOST_CHECK_USAGE(cfg.max_new_tokens > 0, "generation: max_new_tokens must be positive, got ",
                     cfg.max_new_tokens);
  MMPOST_CHECK_USAGE(cfg.top_p > 0.0 && cfg.top_p <= 1.0,
                     "generation: top_p must be in (0, 1], got ", cfg.top_p);
  MMPOST_CHECK_USAGE(std::isfinite(cfg.temperature) && cfg.temperature >= 0.0,
                     "generation: temperature must be a finite number >= 0, got ", cfg.temperature);
  TORCH_CHECK(input_ids.dim() == 2 && attention_mask.sizes() == input_ids.sizes(),
              "input_ids and attention_mask must both be [B, T]");
  torch::NoGradGuard no_grad;
  const auto device = input_ids.device();
  const int64_t B = input_ids.size(0);
  auto generator = at::make_generator<at::CPUGeneratorImpl>(cfg.seed);
  MMPOST_CHECK_USAGE(cfg.row_seeds.empty() || static_cast<int64_t>(cfg.row_seeds.size()) == B,
                     "generation: ", cfg.row_seeds.size(), " row seeds for ", B, " rows");
  std::vector<torch::Generator> row_generators;
  for (uint64_t s : cfg.row_seeds) row_generators.push_back(at::make_generator<at::CPUGeneratorImpl>(s));
  auto eos = torch::tensor(cfg.eos_token_ids.empty() ? std::vector<int64_t>{-1} : cfg.eos_token_ids,
                           torch::dtype(torch::kInt64).device(device));
  auto ones = torch::ones({B, 1}, attention_mask.options());

  torch::Tensor banned;  // never_generate's ids inside the vocabulary (set at step 0)
  const double neg_inf = -std::numeric_limits<double>::infinity();
  KVCache cache;
  auto mask = attention_mask;
  auto ids = input_ids;  // prompt + generated so far (for use_cache = false)
  auto hidden = model.prompt_hidden(input_ids, mask, use_cache ? &cache : nullptr);
  auto finished = torch::zeros({B}, torch::dtype(torch::kBool).device(device));
  auto reason = torch::full({B}, static_cast<int64_t>(FinishReason::kLength),
                            torch::dtype(torch::kInt64).device(device));
  auto lengths = torch::zeros({B}, torch::dtype(torch::kInt64).device(device));
  StopTracker stops(cfg, B);
  std::vector<torch::Tensor> tokens, logps;
  for (int64_t step = 0; step < cfg.max_new_tokens; ++step) {
    auto logits = model.logits(hidden.select(/*dim=*/1, /*index=*/-1));  // [B, V] float32
    // Image placeholders are never valid outputs: fed back they would be spliced as images.
    if (!banned.defined()) {
      std::vector<int64_t> ids_in_vocab;
      for (int64_t id : model.never_generate) {
        if (id >= 0 && id < logits.size(-1)) ids_in_vocab.push_back(id);
      }
      banned = torch::tensor(ids_in_vocab, torch::dtype(torch::kInt64).device(device));
    }
    auto allowed = banned.numel() > 0 ? logits.index_fill(/*dim=*/-1, banned, neg_inf) : logits;
    auto next = select_next_token(allowed, cfg, generator, &row_generators);  // [B]
    auto logp = logits.log_softmax(/*dim=*/-1).gather(/*dim=*/-1, next.unsqueeze(-1)).squeeze(-1);
    next = next.masked_fill(finished, cfg.pad_token_id);
    tokens.push_back(next);
    logps.push_back(logp.masked_fill(finished, 0.0));
    auto running = finished.logical_not();
    lengths += running.to(torch::kInt64);
    auto hit_eos = torch::isin(next, eos) & running;
    auto hit_stop = stops.update(next, running) & hit_eos.logical_not();
    reason.masked_fill_(hit_eos, static_cast<int64_t>(FinishReason::kEos));
    reason.masked_fill_(hit_stop, static_cast<int64_t>(FinishReason::kStop));
    finished = finished | hit_eos | hit_stop;
    if (finished.all().item<bool>() || step + 1 == cfg.max_new_tokens) break;
    mask = torch::cat({mask, ones}, /*dim=*/1);
    if (use_cache) {
      hidden = model.step_hidden(next.unsqueeze(1), mask, &cache);
    } else {
      ids = torch::cat({ids, next.unsqueeze(1)}, /*dim=*/1);
      hidden = model.prompt_hidden(ids, mask, nullptr);
    }
  }
  GenerationOutput out;
  out.sequences = torch::stack(tokens, /*dim=*/1);
  out.logps = torch::stack(logps, /*dim=*/1);
  out.lengths = lengths;  // index of the stopping token + 1, or T_new when a row never stopped
  out.finish_reason = reason;
  out.truncated = reason == static_cast<int64_t>(FinishReason::kLength);
  return out;
}

GenerationOutput generate(Vlm& model, const torch::Tensor& input_ids,
                          const torch::Tensor& attention_mask, const Images& images,
                          const GenerationConfig& cfg, bool use_cache) {
  if (model->is_qwen2_vl()) {
    return generate(*model->qwen2_vl, input_ids, attention_mask, images.pixel_values,
                    images.image_grid_thw, cfg, use_cache);
  }
  DecoderSteps steps;
  steps.prompt_hidden = [&](const torch::Tensor& ids, const torch::Tensor& mask, KVCache* cache) {
    return model->forward_hidden(ids, images, mask, cache);
  };
  steps.step_hidden = [&](const torch::Tensor& ids, const torch::Tensor& mask, KVCache* cache) {
    return model->forward_hidden(ids, /*pixel_values=*/{}, mask, cache);
  };
  steps.logits = [&](const torch::Tensor& hidden) { return model->logits(hidden); };
  steps.never_generate = {model->config().image_token_index};
  return generate(steps, input_ids, attention_mask, cfg, use_cache);
}

GenerationOutput generate(Qwen2VLImpl& model, const torch::Tensor& input_ids,
                          const torch::Tensor& attention_mask, const torch::Tensor& pixel_values,
                          const torch::Tensor& image_grid_thw, const GenerationConfig& cfg,
                          bool use_cache) {
  DecoderSteps steps;
  steps.prompt_hidden = [&](const torch::Tensor& ids, const torch::Tensor& mask, KVCache* cache) {
    return model.forward_hidden(ids, pixel_values, image_grid_thw, mask, cache);
  };
  steps.step_hidden = [&](const torch::Tensor& ids, const torch::Tensor& mask, KVCache* cache) {
    return model.forward_hidden(ids, {}, {}, mask, cache);
  };
  steps.logits = [&](const torch::Tensor& hidden) { return model.logits(hidden); };
  const auto& c = model.config();
  steps.never_generate = {c.image_token_id, c.video_token_id, c.vision_start_token_id,
                          c.vision_end_token_id};
  return generate(steps, input_ids, attention_mask, cfg, use_cache);
}

}  // namespace mmpost::model
