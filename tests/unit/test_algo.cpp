// Loss and schedule math against hand-computed values.
#include <cmath>

#include "catch.h"
#include "mmpost/algo/logprobs.h"
#include "mmpost/algo/sft_loss.h"
#include "mmpost/core/check.h"
#include "mmpost/train/optimizer.h"

namespace unit_test_algo {

using namespace mmpost;

TEST_CASE("sft loss: shifted cross-entropy over supervised tokens", "[unit][algo]") {
  // B=1, T=3, V=2. logits[0] predicts labels[1] = 1, logits[1] predicts labels[2] = 0.
  // p(1 | [0, ln 3]) = 3/4 -> CE ln(4/3); p(0 | [0, 0]) = 1/2 -> CE ln 2.
  auto logits = torch::tensor({0.0f, std::log(3.0f), 0.0f, 0.0f, 5.0f, -5.0f}).view({1, 3, 2});
  auto labels = torch::tensor({-100, 1, 0}, torch::kInt64).view({1, 3});
  CHECK(algo::n_supervised_targets(labels) == 2);
  CHECK(algo::sft_loss_sum(logits, labels).item<double>() == Approx(std::log(8.0 / 3.0)));
  CHECK(algo::sft_loss_mean(logits, labels).item<double>() == Approx(std::log(8.0 / 3.0) / 2));
  // Sequence log-probs: sum of log p over the same targets.
  auto [sum, n] = algo::sequence_logps(logits, labels);
  CHECK(sum.item<double>() == Approx(-std::log(8.0 / 3.0)));
  CHECK(n.item<float>() == 2.0f);
  // A batch with nothing supervised is an error, never 0 or NaN.
  auto none = torch::full({1, 3}, -100, torch::kInt64);
  CHECK_THROWS_AS(algo::sft_loss_mean(logits, none), Error);
}

TEST_CASE("selective_log_softmax equals log_softmax + gather", "[unit][algo]") {
  torch::manual_seed(0);
  auto logits = torch::randn({3, 5, 11});
  auto labels = torch::randint(0, 11, {3, 5}, torch::kInt64);
  labels[1][2] = -100;
  auto ref = torch::log_softmax(logits, -1).gather(-1, labels.clamp_min(0).unsqueeze(-1)).squeeze(-1);
  ref[1][2] = 0;
  CHECK(torch::allclose(algo::selective_log_softmax(logits, labels), ref, 1e-6, 1e-6));
  CHECK(torch::allclose(algo::selective_log_softmax(logits.to(torch::kBFloat16), labels),
                        algo::selective_log_softmax(logits.to(torch::kBFloat16).to(torch::kFloat32), labels)));
}

TEST_CASE("lr schedules: warmup then cosine/linear/constant", "[unit][train]") {
  using train::lr_multiplier;
  // warmup 10, total 110 (100 decay steps), min ratio 0.
  CHECK(lr_multiplier("cosine", 0, 10, 110, 0.0) == 0.0);
  CHECK(lr_multiplier("cosine", 5, 10, 110, 0.0) == Approx(0.5));
  CHECK(lr_multiplier("cosine", 10, 10, 110, 0.0) == Approx(1.0));
  CHECK(lr_multiplier("cosine", 60, 10, 110, 0.0) == Approx(0.5));   // cos(pi/2) midpoint
  CHECK(lr_multiplier("cosine", 35, 10, 110, 0.0) == Approx(0.5 * (1 + std::cos(M_PI / 4))));
  CHECK(lr_multiplier("cosine", 110, 10, 110, 0.0) == Approx(0.0).margin(1e-12));
  CHECK(lr_multiplier("cosine", 110, 10, 110, 0.1) == Approx(0.1));
  CHECK(lr_multiplier("linear", 60, 10, 110, 0.0) == Approx(0.5));
  CHECK(lr_multiplier("linear", 85, 10, 110, 0.2) == Approx(0.2 + 0.8 * 0.25));
  CHECK(lr_multiplier("constant", 99, 10, 110, 0.0) == 1.0);
  CHECK_THROWS_AS(lr_multiplier("step", 1, 0, 10, 0.0), Error);
}

TEST_CASE("clip_grad_norm scales to the max norm", "[unit][train]") {
  auto a = torch::zeros({2}, torch::requires_grad());
  auto b = torch::zeros({1}, torch::requires_grad());
  a.mutable_grad() = torch::tensor({3.0f, 0.0f});
  b.mutable_grad() = torch::tensor({4.0f});
  double norm = train::clip_grad_norm({a, b}, 1.0);
  CHECK(norm == Approx(5.0));
  CHECK(a.grad()[0].item<float>() == Approx(0.6f).epsilon(1e-5));
  CHECK(b.grad()[0].item<float>() == Approx(0.8f).epsilon(1e-5));
}

}  // namespace unit_test_algo
