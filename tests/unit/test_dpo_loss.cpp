// algo::dpo_loss against hand-computed values (sigmoid, hinge, ipo), its error messages, and the
// detached rewards. The TRL parity of every loss type is tests/golden/test_dpo_golden.cpp.
#include <cmath>

#include "catch.h"
#include "mmpost/algo/dpo_loss.h"
#include "mmpost/core/check.h"

namespace unit_test_dpo_loss {

using namespace mmpost;

namespace {

// Two pairs, B = 2:
//   policy    chosen [-1, -4]  rejected [-3, -2]
//   reference chosen [-2, -3]  rejected [-2, -3]
//   log-ratios: chosen [+1, -1], rejected [-1, +1], delta = chosen - rejected = [+2, -2].
// Token counts: n_chosen [1, 2], n_rejected [1, 4].
struct Batch {
  algo::PreferenceLogps policy, reference;
};

Batch make_batch(bool requires_grad = false) {
  auto opts = torch::TensorOptions().dtype(torch::kFloat64);
  Batch b;
  b.policy.chosen = torch::tensor({-1.0, -4.0}, opts).requires_grad_(requires_grad);
  b.policy.rejected = torch::tensor({-3.0, -2.0}, opts).requires_grad_(requires_grad);
  b.reference.chosen = torch::tensor({-2.0, -3.0}, opts);
  b.reference.rejected = torch::tensor({-2.0, -3.0}, opts);
  b.policy.n_chosen = b.reference.n_chosen = torch::tensor({1.0, 2.0}, opts);
  b.policy.n_rejected = b.reference.n_rejected = torch::tensor({1.0, 4.0}, opts);
  return b;
}

algo::DpoLossConfig config(algo::DpoLossType type, double beta) {
  algo::DpoLossConfig cfg;
  cfg.beta = beta;
  cfg.loss_types = {type};
  return cfg;
}

}  // namespace

TEST_CASE("dpo sigmoid loss: -log sigmoid(beta * delta)", "[unit][dpo]") {
  // beta = 0.5, beta * delta = [+1, -1]:
  //   pair 0: -log sigma(1)  = log(1 + e^-1) = 0.3132617
  //   pair 1: -log sigma(-1) = log(1 + e^+1) = 1.3132617
  // rewards = beta * log-ratios: chosen [0.5, -0.5], rejected [-0.5, 0.5].
  auto b = make_batch();
  auto out = algo::dpo_loss(b.policy, &b.reference, config(algo::DpoLossType::kSigmoid, 0.5));
  CHECK(out.losses[0].item<double>() == Approx(std::log1p(std::exp(-1.0))));
  CHECK(out.losses[1].item<double>() == Approx(std::log1p(std::exp(1.0))));
  CHECK(out.losses[0].item<double>() == Approx(0.3132617).epsilon(1e-6));
  CHECK(out.rewards_chosen[0].item<double>() == Approx(0.5));
  CHECK(out.rewards_chosen[1].item<double>() == Approx(-0.5));
  CHECK(out.rewards_rejected[0].item<double>() == Approx(-0.5));
  CHECK(out.rewards_rejected[1].item<double>() == Approx(0.5));
}

TEST_CASE("dpo hinge loss: relu(1 - beta * delta)", "[unit][dpo]") {
  // beta = 0.5: pair 0: relu(1 - 1) = 0; pair 1: relu(1 + 1) = 2.
  auto b = make_batch();
  auto out = algo::dpo_loss(b.policy, &b.reference, config(algo::DpoLossType::kHinge, 0.5));
  CHECK(out.losses[0].item<double>() == 0.0);
  CHECK(out.losses[1].item<double>() == Approx(2.0));
}

TEST_CASE("dpo ipo loss: (per-token delta - 1/(2 beta))^2", "[unit][dpo]") {
  // beta = 0.5 -> 1/(2 beta) = 1. Per-token averaged log-ratios:
  //   pair 0: +1/1 - (-1)/1 = 2      -> (2 - 1)^2     = 1
  //   pair 1: -1/2 - (+1)/4 = -0.75  -> (-0.75 - 1)^2 = 3.0625
  auto b = make_batch();
  auto out = algo::dpo_loss(b.policy, &b.reference, config(algo::DpoLossType::kIpo, 0.5));
  CHECK(out.losses[0].item<double>() == Approx(1.0));
  CHECK(out.losses[1].item<double>() == Approx(3.0625));
}

TEST_CASE("dpo loss weights combine per pair: losses = sum_k w_k * loss_k", "[unit][dpo]") {
  // 0.25 * sigmoid + 2 * hinge; pair 1: 0.25 * 1.3132617 + 2 * 2.
  auto b = make_batch();
  auto cfg = config(algo::DpoLossType::kSigmoid, 0.5);
  cfg.loss_types = {algo::DpoLossType::kSigmoid, algo::DpoLossType::kHinge};
  cfg.loss_weights = {0.25, 2.0};
  auto out = algo::dpo_loss(b.policy, &b.reference, cfg);
  CHECK(out.losses[1].item<double>() == Approx(0.25 * std::log1p(std::exp(1.0)) + 4.0));
}

TEST_CASE("dpo rewards are detached, the loss carries the gradient", "[unit][dpo]") {
  auto b = make_batch(/*requires_grad=*/true);
  auto out = algo::dpo_loss(b.policy, &b.reference, config(algo::DpoLossType::kSigmoid, 0.5));
  CHECK(out.losses.requires_grad());
  CHECK_FALSE(out.rewards_chosen.requires_grad());
  CHECK_FALSE(out.rewards_rejected.requires_grad());
  // d/d chosen of -log sigma(beta (c - ...)) = -beta * sigma(-beta delta); pair 0: -0.5 sigma(-1).
  out.losses.sum().backward();
  CHECK(b.policy.chosen.grad()[0].item<double>() == Approx(-0.5 / (1 + std::exp(1.0))));
}

TEST_CASE("dpo loss names: TRL's strings, unknown lists the valid values", "[unit][dpo]") {
  CHECK(algo::parse_dpo_loss_type("aot_unpaired") == algo::DpoLossType::kAotUnpaired);
  CHECK(algo::parse_dpo_loss_type("sigmoid_norm") == algo::DpoLossType::kSigmoidNorm);
  CHECK(algo::to_string(algo::DpoLossType::kExoPair) == "exo_pair");
  try {
    algo::parse_dpo_loss_type("aot_pair");
    FAIL("expected mmpost::Error");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::kUsage);
    CHECK_THAT(e.what(), HasSubstr("unknown dpo loss type 'aot_pair'"));
    CHECK_THAT(e.what(), HasSubstr("sigmoid, hinge, ipo, exo_pair, nca_pair, robust, bco_pair, "
                                   "sppo_hard, aot, aot_unpaired, apo_zero, apo_down, discopop, "
                                   "sft, sigmoid_norm, simpo, orpo"));
  }
}

TEST_CASE("dpo loss rejects settings TRL rejects", "[unit][dpo]") {
  auto b = make_batch();
  auto exo = config(algo::DpoLossType::kExoPair, 0.1);  // label_smoothing 0
  CHECK_THROWS_WITH(algo::dpo_loss(b.policy, &b.reference, exo), HasSubstr("label_smoothing > 0"));
  CHECK_THROWS_WITH(algo::dpo_loss(b.policy, nullptr, config(algo::DpoLossType::kSigmoid, 0.1)),
                    HasSubstr("needs reference log-probs"));
  auto mixed = config(algo::DpoLossType::kSigmoid, 0.1);
  mixed.loss_types = {algo::DpoLossType::kSigmoid, algo::DpoLossType::kSimpo};
  CHECK_THROWS_AS(algo::dpo_loss(b.policy, &b.reference, mixed), Error);
  auto weights = config(algo::DpoLossType::kSigmoid, 0.1);
  weights.loss_weights = {1.0, 2.0};
  CHECK_THROWS_WITH(algo::dpo_loss(b.policy, &b.reference, weights), HasSubstr("one weight per"));
  // Reference-free SimPO runs without a reference.
  auto simpo = config(algo::DpoLossType::kSimpo, 2.0);
  CHECK(algo::dpo_loss(b.policy, nullptr, simpo).losses.size(0) == 2);
}

}  // namespace unit_test_dpo_loss
