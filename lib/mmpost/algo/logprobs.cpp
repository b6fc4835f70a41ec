// Log-prob gathering (see logprobs.h).
#include "mmpost/algo/logprobs.h"

namespace mmpost::algo {

std::pair<torch::Tensor, torch::Tensor> shift_for_causal_lm(const torch::Tensor& logits,
                                                            const torch::Tensor& labels) {
  TORCH_CHECK(logits.dim() == 3 && labels.dim() == 2, "expected logits [B,T,V], labels [B,T]");
  TORCH_CHECK(logits.size(0) == labels.size(0) && logits.size(1) == labels.size(1),
              "logits/labels shape mismatch");
  auto t = logits.size(1);
  return {logits.narrow(1, 0, t - 1), labels.narrow(1, 1, t - 1)};
}

torch::Tensor selective_log_softmax(const torch::Tensor& logits, const torch::Tensor& labels) {
  auto mask = labels.ne(kIgnoreIndex);
  auto safe = labels.masked_fill(~mask, 0);
  // Loop over the batch dimension so only one row's float32 copy exists at a time.
  std::vector<torch::Tensor> rows;
  auto lg = logits.dim() == labels.dim() + 1 ? logits : logits.unsqueeze(0);
  auto lb = logits.dim() == labels.dim() + 1 ? safe : safe.unsqueeze(0);
  for (int64_t i = 0; i < lg.size(0); ++i) {
    auto row = lg[i].to(torch::kFloat32);
    auto picked = row.gather(/*dim=*/-1, lb[i].unsqueeze(-1)).squeeze(-1);
    rows.push_back(picked - row.logsumexp(/*dim=*/-1));
  }
  auto out = torch::stack(rows);
  if (logits.dim() != labels.dim() + 1) out = out.squeeze(0);
  return out.masked_fill(~mask, 0.0);
}

std::pair<torch::Tensor, torch::Tensor> sequence_logps(const torch::Tensor& logits,
                                                       const torch::Tensor& labels) {
  auto [lg, lb] = shift_for_causal_lm(logits, labels);
  auto per_token = selective_log_softmax(lg, lb);  // [B, T-1]
  auto n = lb.ne(kIgnoreIndex).sum(/*dim=*/-1).to(torch::kFloat32);
  return {per_token.sum(/*dim=*/-1), n};
}

TokenStats token_stats(const torch::Tensor& logits, const torch::Tensor& labels,
                       bool with_log_sum_sq) {
  auto [lg, lb] = shift_for_causal_lm(logits, labels);  // [R, T-1, V], [R, T-1]
  TokenStats s;
  s.mask = lb.ne(kIgnoreIndex);
  auto safe = lb.masked_fill(~s.mask, 0);
  std::vector<torch::Tensor> logps, sum_sq, logit_sums;
  for (int64_t i = 0; i < lg.size(0); ++i) {
    auto logp = torch::log_softmax(lg[i].to(torch::kFloat32), /*dim=*/-1);  // [T-1, V]
    logps.push_back(logp.gather(/*dim=*/-1, safe[i].unsqueeze(-1)).squeeze(-1));
    if (with_log_sum_sq) sum_sq.push_back(torch::logsumexp(2 * logp, /*dim=*/-1));
    auto m = s.mask[i].unsqueeze(-1).to(torch::kFloat32);
    logit_sums.push_back((lg[i].to(torch::kFloat32) * m).sum());
  }
  s.logps = torch::stack(logps).masked_fill(~s.mask, 0.0);
  if (with_log_sum_sq) s.log_sum_sq = torch::stack(sum_sq).masked_fill(~s.mask, 0.0);
  s.logits_sum = torch::stack(logit_sums);
  return s;
}

}  // namespace mmpost::algo
