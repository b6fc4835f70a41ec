// Generation loop (see generation.h). The loop stays explicit: prefill, then pick -> append ->
// decode one token, with one host sync per step to stop early once all rows are done.
#include "mmpost/model/generation.h"

#include "mmpost/core/check.h"

#include <ATen/CPUGeneratorImpl.h>

namespace mmpost::model {

torch::Tensor select_next_token(const torch::Tensor& logits, const GenerationConfig& cfg,
                                torch::Generator& generator) {
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
  auto next = torch::multinomial(probs, /*num_samples=*/1, /*replacement=*/false, generator);
  return next.squeeze(-1).to(logits.device());
}

GenerationOutput generate(Vlm& model, const torch::Tensor& input_ids,
                          const torch::Tensor& attention_mask, const torch::Tensor& pixel_values,
                          const GenerationConfig& cfg, bool use_cache) {
  MMPOST_CHECK_USAGE(cfg.max_new_tokens > 0, "generation: max_new_tokens must be positive, got ",
                     cfg.max_new_tokens);
  MMPOST_CHECK_USAGE(cfg.top_p > 0.0 && cfg.top_p <= 1.0,
                     "generation: top_p must be in (0, 1], got ", cfg.top_p);
  TORCH_CHECK(input_ids.dim() == 2 && attention_mask.sizes() == input_ids.sizes(),
              "input_ids and attention_mask must both be [B, T]");
  torch::NoGradGuard no_grad;
  const auto device = input_ids.device();
  const int64_t B = input_ids.size(0);
  auto generator = at::make_generator<at::CPUGeneratorImpl>(cfg.seed);
  auto eos = torch::tensor(cfg.eos_token_ids.empty() ? std::vector<int64_t>{-1} : cfg.eos_token_ids,
                           torch::dtype(torch::kInt64).device(device));
  auto ones = torch::ones({B, 1}, attention_mask.options());

  const int64_t image_id = model->config().image_token_index;
  auto image_id_t = torch::tensor({image_id}, torch::dtype(torch::kInt64).device(device));
  const double neg_inf = -std::numeric_limits<double>::infinity();
  KVCache cache;
  auto mask = attention_mask;
  auto ids = input_ids;  // prompt + generated so far (for use_cache = false)
  auto hidden = model->forward_hidden(input_ids, pixel_values, mask, use_cache ? &cache : nullptr);
  auto finished = torch::zeros({B}, torch::dtype(torch::kBool).device(device));
  std::vector<torch::Tensor> tokens, logps;
  for (int64_t step = 0; step < cfg.max_new_tokens; ++step) {
    auto logits = model->logits(hidden.select(/*dim=*/1, /*index=*/-1));  // [B, V] float32
    // The image placeholder is never a valid output: fed back it would be spliced as an image.
    auto allowed = image_id < logits.size(-1)
                       ? logits.index_fill(/*dim=*/-1, image_id_t, neg_inf)
                       : logits;
    auto next = select_next_token(allowed, cfg, generator);                // [B]
    auto logp = logits.log_softmax(/*dim=*/-1).gather(/*dim=*/-1, next.unsqueeze(-1)).squeeze(-1);
    next = next.masked_fill(finished, cfg.pad_token_id);
    tokens.push_back(next);
    logps.push_back(logp.masked_fill(finished, 0.0));
    finished = finished | torch::isin(next, eos);
    if (finished.all().item<bool>() || step + 1 == cfg.max_new_tokens) break;
    mask = torch::cat({mask, ones}, /*dim=*/1);
    if (use_cache) {
      hidden = model->forward_hidden(next.unsqueeze(1), /*pixel_values=*/{}, mask, &cache);
    } else {
      ids = torch::cat({ids, next.unsqueeze(1)}, /*dim=*/1);
      hidden = model->forward_hidden(ids, pixel_values, mask);
    }
  }
  GenerationOutput out;
  out.sequences = torch::stack(tokens, /*dim=*/1);
  out.logps = torch::stack(logps, /*dim=*/1);
  // Length = index of the first EOS + 1, or T_new when a row never stopped.
  auto is_eos = torch::isin(out.sequences, eos);
  auto before_eos = (is_eos.to(torch::kInt64).cumsum(/*dim=*/1) - is_eos.to(torch::kInt64)) == 0;
  out.lengths = before_eos.sum(/*dim=*/1);
  return out;
}

}  // namespace mmpost::model
