// algo::policy_gradient and algo::kl against hand-computed values: group advantages (GRPO, RLOO,
// REINFORCE++), KL estimators, each loss type's clipped surrogate, GAE, the clipped value loss and
// whitening. TRL parity of the loss and the advantages is tests/golden/test_grpo_golden.cpp.
#include <cmath>

#include "catch.h"
#include "mmpost/algo/kl.h"
#include "mmpost/algo/policy_gradient.h"
#include "mmpost/core/check.h"

namespace unit_test_policy_gradient {

using namespace mmpost;

namespace {

const auto kF64 = torch::TensorOptions().dtype(torch::kFloat64);

double elem(const torch::Tensor& t, int64_t i) { return t.reshape({-1})[i].item<double>(); }
double sigmoid(double x) { return 1 / (1 + std::exp(-x)); }

// Policy-loss batch, B = 2, T = 2, mask [[1, 1], [1, 0]], advantages [+1, -1].
// Ratios pi/pi_old: row 0 [1.5, 0.9], row 1 [0.7, pad]; old_logps = ref_logps = -1 everywhere,
// so logps = -1 + ln(ratio) and the k3 KL of a token is 1/r + ln r - 1.
struct PgBatch {
  torch::Tensor logps, old_logps, ref_logps, advantages, mask;
};
PgBatch pg_batch() {
  PgBatch b;
  b.old_logps = torch::full({2, 2}, -1.0, kF64);
  b.ref_logps = b.old_logps.clone();
  b.logps = (b.old_logps + torch::log(torch::tensor({{1.5, 0.9}, {0.7, 1.0}}, kF64))).requires_grad_(true);
  b.advantages = torch::tensor({1.0, -1.0}, kF64);
  b.mask = torch::tensor({{1, 1}, {1, 0}}, torch::kLong);
  return b;
}
algo::PolicyLossConfig pg_config(algo::PolicyLossType type) {
  algo::PolicyLossConfig cfg;
  cfg.loss_type = type;
  cfg.epsilon = 0.2;
  return cfg;
}
// Clipped per-token surrogate -min(r A, clip(r, 0.8, 1.2) A) of the three real tokens:
//   row 0, A = +1: r = 1.5 -> -min(1.5, 1.2) = -1.2 (clipped high); r = 0.9 -> -0.9
//   row 1, A = -1: r = 0.7 -> -min(-0.7, -0.8) = +0.8 (clipped low)
// Token sum -1.3 over 3 tokens.

}  // namespace

TEST_CASE("grpo advantages: group / batch / none on a hand table with an all-equal group", "[unit][policy_gradient]") {
  // G = 3. Groups: [1, 1, 1] (all equal), [0, 1, 2] (mean 1, unbiased std 1),
  // [3, 0, 0] (mean 1, deviations [2, -1, -1], var (4 + 1 + 1) / 2 = 3, std sqrt 3).
  auto r = torch::tensor({1.f, 1.f, 1.f, 0.f, 1.f, 2.f, 3.f, 0.f, 0.f});
  const double eps = 1e-4, s3 = std::sqrt(3.0);

  auto g = algo::grpo_advantages(r, 3, algo::ScaleRewards::kGroup);
  for (int i = 0; i < 3; ++i) CHECK(elem(g.advantages, i) == 0.0);  // exactly 0, no NaN
  CHECK(elem(g.advantages, 3) == Approx(-1 / (1 + eps)));
  CHECK(elem(g.advantages, 5) == Approx(1 / (1 + eps)));
  CHECK(elem(g.advantages, 6) == Approx(2 / (s3 + eps)));
  CHECK(elem(g.advantages, 7) == Approx(-1 / (s3 + eps)));
  CHECK(elem(g.std_rewards, 6) == Approx(s3));
  // frac_reward_zero_std = 3 of 9 rows.
  CHECK(g.is_std_zero.to(torch::kFloat64).mean().item<double>() == Approx(1.0 / 3));

  // batch: group mean, std of all 9 rewards: mean 1, squared deviations 0,0,0,1,0,1,4,1,1 = 8,
  // unbiased var 8 / 8 = 1.
  auto b = algo::grpo_advantages(r, 3, algo::ScaleRewards::kBatch);
  CHECK(elem(b.std_rewards, 0) == Approx(1.0));
  CHECK(elem(b.advantages, 6) == Approx(2 / (1 + eps)));
  CHECK(elem(b.advantages, 0) == 0.0);
  CHECK(b.is_std_zero.any().item<bool>() == false);

  // none: r - group mean, std still reported (for logging).
  auto n = algo::grpo_advantages(r, 3, algo::ScaleRewards::kNone);
  auto expect = torch::tensor({0.f, 0.f, 0.f, -1.f, 0.f, 1.f, 2.f, -1.f, -1.f});
  CHECK(torch::equal(n.advantages, expect));
  CHECK(n.is_std_zero.to(torch::kFloat64).sum().item<double>() == 3);
}

TEST_CASE("grpo advantages: equal rewards whose float mean rounds still give exactly 0", "[unit][policy_gradient]") {
  // 0.1f * 3 / 3 need not equal 0.1f; TRL would give ~ulp / 1e-4. mmpost gives 0, and NaN
  // (unscorable) rows give 0 while leaving the group's statistics alone.
  auto r = torch::tensor({0.1f, 0.1f, 0.1f, 0.7f, NAN, 0.2f});
  auto g = algo::grpo_advantages(r, 3);
  for (int i = 0; i < 3; ++i) CHECK(elem(g.advantages, i) == 0.0);
  CHECK(elem(g.advantages, 4) == 0.0);
  // Group 2 scorable [0.7, 0.2]: mean 0.45, unbiased std sqrt(2 * 0.25^2) = 0.3535534.
  CHECK(elem(g.advantages, 3) == Approx(0.25 / (0.3535534 + 1e-4)).epsilon(1e-5));
  CHECK_FALSE(g.advantages.isnan().any().item<bool>());
  CHECK_THROWS_AS(algo::grpo_advantages(r, 4), Error);  // 6 rewards do not split into groups of 4
}

TEST_CASE("rloo advantages: r_i minus the mean of the others", "[unit][policy_gradient]") {
  // Group [0, 1, 2]: 0 - (1 + 2)/2 = -1.5; 1 - (0 + 2)/2 = 0; 2 - (0 + 1)/2 = 1.5.
  auto r = torch::tensor({0.0, 1.0, 2.0, 5.0, 5.0, 5.0}, kF64);
  auto a = algo::rloo_advantages(r, 3);
  CHECK(elem(a.advantages, 0) == Approx(-1.5));
  CHECK(elem(a.advantages, 1) == Approx(0.0).margin(1e-12));
  CHECK(elem(a.advantages, 2) == Approx(1.5));
  CHECK(elem(a.advantages, 4) == 0.0);
  // normalize: advantages [-1.5, 0, 1.5, 0, 0, 0] have mean 0, unbiased var 4.5 / 5 = 0.9.
  auto n = algo::rloo_advantages(r, 3, /*normalize_advantages=*/true);
  CHECK(elem(n.advantages, 2) == Approx(1.5 / (std::sqrt(0.9) + 1e-4)));
}

TEST_CASE("reinforce++: discounted returns whitened over the batch's tokens", "[unit][policy_gradient]") {
  // gamma 1. Row 0 rewards [0, 0, 1], mask [1, 1, 1] -> returns [1, 1, 1].
  // Row 1 rewards [0, -1, 0], mask [1, 1, 0] -> returns [-1, -1, 0] (t = 2 is masked).
  // Masked returns [1, 1, 1, -1, -1]: mean 0.2, squared deviations 3 * 0.64 + 2 * 1.44 = 4.8,
  // unbiased var 4.8 / 4 = 1.2 -> advantages (x - 0.2) / sqrt(1.2): 0.7302967, -1.0954451.
  auto rw = torch::tensor({{0.0, 0.0, 1.0}, {0.0, -1.0, 0.0}}, kF64);
  auto mask = torch::tensor({{1, 1, 1}, {1, 1, 0}});
  auto [adv, ret] = algo::reinforce_pp_advantages(rw, mask, 1.0);
  CHECK(elem(ret, 3) == Approx(-1.0));
  CHECK(elem(adv, 0) == Approx(0.8 / std::sqrt(1.2)));
  CHECK(elem(adv, 0) == Approx(0.7302967).epsilon(1e-6));
  CHECK(elem(adv, 4) == Approx(-1.2 / std::sqrt(1.2)));
  CHECK(elem(adv, 5) == 0.0);
}

TEST_CASE("reinforce++ baseline: group mean, then token-weighted batch whitening", "[unit][policy_gradient]") {
  // G = 2, rewards [1, 0 | 2, 2] -> centered [0.5, -0.5 | 0, 0]; lengths [2, 1, 1, 3].
  // Token values 0.5, 0.5, -0.5, 0, 0, 0, 0: mean 1/14; deviations 3/7 (x2), -4/7, -1/14 (x4);
  // sum of squares 18/49 + 16/49 + 1/49 = 5/7, unbiased var (5/7) / 6 = 5/42.
  auto r = torch::tensor({1.0, 0.0, 2.0, 2.0}, kF64);
  auto mask = torch::tensor({{1, 1, 0}, {1, 0, 0}, {1, 0, 0}, {1, 1, 1}});
  auto adv = algo::reinforce_pp_baseline_advantages(r, 2, mask);
  const double sd = std::sqrt(5.0 / 42 + 1e-8);
  CHECK(adv[0][1].item<double>() == Approx((3.0 / 7) / sd));
  CHECK(adv[1][0].item<double>() == Approx((-4.0 / 7) / sd));
  CHECK(adv[3][2].item<double>() == Approx((-1.0 / 14) / sd));
  CHECK(adv[0][2].item<double>() == 0.0);
}

TEST_CASE("filter_zero_std_groups keeps the rows of groups with a reward spread", "[unit][policy_gradient]") {
  auto r = torch::tensor({1.f, 1.f, 0.f, 1.f, 2.f, 2.f});
  auto kept = algo::filter_zero_std_groups(r, 2);
  REQUIRE(kept.numel() == 2);
  CHECK(kept[0].item<int64_t>() == 2);
  CHECK(kept[1].item<int64_t>() == 3);
}

TEST_CASE("kl estimators k1, k2, k3, abs, low_var_kl on hand values", "[unit][policy_gradient]") {
  // logp [-1, -2], ref [-1.5, -1]: d = logp - ref = [0.5, -1], log r = ref - logp = [-0.5, 1].
  auto lp = torch::tensor({-1.0, -2.0}, kF64), ref = torch::tensor({-1.5, -1.0}, kF64);
  using algo::KlEstimator;
  auto k1 = algo::per_token_kl(lp, ref, KlEstimator::kK1);
  CHECK(elem(k1, 0) == Approx(0.5));
  CHECK(elem(k1, 1) == Approx(-1.0));
  auto k2 = algo::per_token_kl(lp, ref, KlEstimator::kK2);  // 0.5 d^2
  CHECK(elem(k2, 0) == Approx(0.125));
  CHECK(elem(k2, 1) == Approx(0.5));
  auto k3 = algo::per_token_kl(lp, ref, KlEstimator::kK3);  // e^{log r} - log r - 1
  CHECK(elem(k3, 0) == Approx(std::exp(-0.5) + 0.5 - 1));  // 0.1065307
  CHECK(elem(k3, 1) == Approx(std::exp(1.0) - 2));         // 0.7182818
  auto ab = algo::per_token_kl(lp, ref, KlEstimator::kAbs);
  CHECK(elem(ab, 1) == Approx(1.0));
  // low_var_kl = k3 inside verl's clamps; log r = 30 -> clamp 20 -> e^20 - 21 -> clamp 10.
  auto far_lp = torch::tensor({-30.0, -1.0}, kF64), far_ref = torch::tensor({0.0, -1.5}, kF64);
  auto lv = algo::per_token_kl(far_lp, far_ref, KlEstimator::kLowVarKl);
  CHECK(elem(lv, 0) == Approx(10.0));
  CHECK(elem(lv, 1) == Approx(std::exp(-0.5) + 0.5 - 1));
  CHECK(elem(algo::per_token_kl(far_lp, far_ref, KlEstimator::kK3), 0) == Approx(std::exp(30.0) - 31));
}

TEST_CASE("kl estimator names: verl aliases, unknown lists the valid values", "[unit][policy_gradient]") {
  CHECK(algo::parse_kl_estimator("mse") == algo::KlEstimator::kK2);
  CHECK(algo::parse_kl_estimator("kl") == algo::KlEstimator::kK1);
  CHECK(algo::parse_kl_estimator("low_var_kl") == algo::KlEstimator::kLowVarKl);
  CHECK(algo::to_string(algo::KlEstimator::kK2) == "k2");
  CHECK_THROWS_WITH(algo::parse_kl_estimator("k4"), HasSubstr("k1, kl, k2, mse, k3, low_var_kl, abs, full"));
}

TEST_CASE("full kl: exact over the vocab, chunked, with the right gradient", "[unit][policy_gradient]") {
  // Hand value, V = 2: p = [1/2, 1/2], ref = [1/4, 3/4] (logits [0, ln 3]):
  // KL = 1/2 ln(2) + 1/2 ln(2/3) = 1/2 ln(4/3) = 0.1438410.
  auto z = torch::zeros({1, 1, 2});
  auto zr = torch::tensor({0.f, std::log(3.f)}).view({1, 1, 2});
  CHECK(algo::full_kl(z, zr).item<double>() == Approx(0.5 * std::log(4.0 / 3)));

  // Random [2, 3, 5] against the direct formula, with chunks of 4 rows (6 rows: 4 + 2).
  torch::manual_seed(0);
  auto logits = torch::randn({2, 3, 5}).requires_grad_(true);
  auto ref = torch::randn({2, 3, 5});
  auto kl = algo::full_kl(logits, ref, /*chunk_rows=*/4);
  auto lp = torch::log_softmax(logits, -1);
  auto direct = (lp.exp() * (lp - torch::log_softmax(ref, -1))).sum(-1);
  CHECK((kl - direct).abs().max().item<double>() < 1e-6);
  auto w = torch::randn({2, 3});
  auto g1 = torch::autograd::grad({(kl * w).sum()}, {logits})[0];
  auto g2 = torch::autograd::grad({(direct * w).sum()}, {logits})[0];
  CHECK((g1 - g2).abs().max().item<double>() < 1e-6);
}

TEST_CASE("policy loss aggregations: grpo, bnpo, dr_grpo, dapo, luspo", "[unit][policy_gradient]") {
  auto b = pg_batch();
  auto run = [&](algo::PolicyLossConfig cfg, std::optional<double> n = std::nullopt) {
    return algo::policy_loss(b.logps, b.old_logps, b.advantages, b.mask, cfg, {}, n);
  };
  using T = algo::PolicyLossType;
  // grpo: row means (-1.2 - 0.9) / 2 = -1.05 and 0.8 / 1; mean -0.125.
  auto grpo = run(pg_config(T::kGrpo));
  CHECK(grpo.loss.item<double>() == Approx(-0.125));
  CHECK(run(pg_config(T::kBnpo)).loss.item<double>() == Approx(-1.3 / 3));  // token mean
  auto dr = pg_config(T::kDrGrpo);
  dr.max_completion_length = 4;
  CHECK(run(dr).loss.item<double>() == Approx(-1.3 / (2 * 4)));  // / (B * max_completion_length)
  CHECK(run(pg_config(T::kDapo)).loss.item<double>() == Approx(-1.3 / 3));
  CHECK(run(pg_config(T::kDapo), 10.0).loss.item<double>() == Approx(-0.13));  // global token count 10
  CHECK(run(pg_config(T::kLuspo)).loss.item<double>() == Approx((-2.1 + 0.8) / 2));  // row sums, mean

  // Clip metrics over 3 tokens: low (r 0.7 < 0.8, A < 0) 1/3, high (r 1.5 > 1.2, A > 0) 1/3,
  // region 2/3; per-row low fractions [0, 1] -> min 0; high [0.5, 0] -> max 0.5.
  CHECK(grpo.clip_ratio_low.item<double>() == Approx(1.0 / 3));
  CHECK(grpo.clip_ratio_high.item<double>() == Approx(1.0 / 3));
  CHECK(grpo.clip_ratio_region.item<double>() == Approx(2.0 / 3));
  CHECK(grpo.clip_ratio_low_min.item<double>() == 0.0);
  CHECK(grpo.clip_ratio_high_max.item<double>() == Approx(0.5));
  CHECK(grpo.ratio_mean.item<double>() == Approx((1.5 + 0.9 + 0.7) / 3));
  CHECK_FALSE(grpo.kl.defined());

  // Gradient: the clipped tokens get none; d/dlogp of -(r A) / 2 rows / 2 tokens at r = 0.9: -0.225.
  grpo.loss.backward();
  auto g = b.logps.grad();
  CHECK(g[0][0].item<double>() == 0.0);
  CHECK(g[0][1].item<double>() == Approx(-0.9 / 4));
  CHECK(g[1][0].item<double>() == 0.0);
  CHECK(g[1][1].item<double>() == 0.0);  // padding
}

TEST_CASE("policy loss: cispo weights log pi by the detached clipped ratio", "[unit][policy_gradient]") {
  // eps_high = 1.2 caps the ratio: -min(r, 1.2) A logp per token, dapo-style sum / 3 tokens:
  //   row 0: -1.2 * (-1 + ln 1.5) and -0.9 * (-1 + ln 0.9); row 1: +0.7 * (-1 + ln 0.7).
  auto b = pg_batch();
  auto cfg = pg_config(algo::PolicyLossType::kCispo);
  cfg.epsilon_high = 1.2;
  auto out = algo::policy_loss(b.logps, b.old_logps, b.advantages, b.mask, cfg);
  const double expect = (-1.2 * (-1 + std::log(1.5)) - 0.9 * (-1 + std::log(0.9)) +
                         0.7 * (-1 + std::log(0.7))) / 3;
  CHECK(out.loss.item<double>() == Approx(expect));  // 0.2528646
  CHECK(out.cispo_clip_ratio.item<double>() == Approx(1.0 / 3));
  CHECK_FALSE(out.clip_ratio_low.defined());
  out.loss.backward();
  CHECK(b.logps.grad()[0][0].item<double>() == Approx(-1.2 / 3));  // the cap is a constant
}

TEST_CASE("policy loss: sapo's soft gate", "[unit][policy_gradient]") {
  // -(sigmoid(tau (r - 1)) * 4 / tau) A, tau = 1 for A > 0, 1.05 otherwise; grpo aggregation:
  //   row 0: (-4 sigma(0.5) - 4 sigma(-0.1)) / 2; row 1: +sigma(1.05 * -0.3) * 4 / 1.05.
  auto b = pg_batch();
  auto out = algo::policy_loss(b.logps, b.old_logps, b.advantages, b.mask,
                               pg_config(algo::PolicyLossType::kSapo));
  const double tau = static_cast<float>(1.05);  // TRL builds tau in float32
  const double row0 = (-4 * sigmoid(0.5) - 4 * sigmoid(-0.1)) / 2;
  const double row1 = sigmoid(tau * -0.3) * 4 / tau;
  CHECK(out.loss.item<double>() == Approx((row0 + row1) / 2));  // -0.2938712
  CHECK_FALSE(out.clip_ratio_high.defined());
}

TEST_CASE("policy loss: GSPO sequence-level ratio", "[unit][policy_gradient]") {
  // Row 0: s = exp((ln 1.5 + ln 0.9) / 2) = sqrt(1.35) = 1.1618950 (inside [0.8, 1.2]) -> -s per
  // token, row mean -s. Row 1: s = 0.7 -> clipped, +0.8. grpo mean (-1.1618950 + 0.8) / 2.
  auto b = pg_batch();
  auto cfg = pg_config(algo::PolicyLossType::kGrpo);
  cfg.importance_sampling_level = algo::ImportanceSamplingLevel::kSequence;
  auto out = algo::policy_loss(b.logps, b.old_logps, b.advantages, b.mask, cfg);
  CHECK(out.loss.item<double>() == Approx((-std::sqrt(1.35) + 0.8) / 2));
  // Sequence-level metrics count sequences: low-clipped 1 of 2.
  CHECK(out.clip_ratio_low.item<double>() == Approx(0.5));
}

TEST_CASE("policy loss: the k3 KL term, with and without bias correction", "[unit][policy_gradient]") {
  // ref = old, so k3 per token = 1/r + ln r - 1: r = 1.5 -> 0.0721318, 0.9 -> 0.0057939,
  // 0.7 -> 0.0719611. bnpo: (-1.3 + beta sum_t w_t k3_t) / 3, w = 1 or r (bias correction).
  auto k3 = [](double r) { return 1 / r + std::log(r) - 1; };
  auto b = pg_batch();
  auto cfg = pg_config(algo::PolicyLossType::kBnpo);
  cfg.beta = 0.1;
  cfg.use_bias_correction_kl = false;
  auto plain = algo::policy_loss(b.logps, b.old_logps, b.advantages, b.mask, cfg, b.ref_logps);
  const double sum_k3 = k3(1.5) + k3(0.9) + k3(0.7);
  CHECK(plain.loss.item<double>() == Approx((-1.3 + 0.1 * sum_k3) / 3));
  CHECK(plain.kl.item<double>() == Approx(sum_k3 / 3));
  cfg.use_bias_correction_kl = true;
  auto corrected = algo::policy_loss(b.logps, b.old_logps, b.advantages, b.mask, cfg, b.ref_logps);
  const double sum_wk3 = 1.5 * k3(1.5) + 0.9 * k3(0.9) + 0.7 * k3(0.7);
  CHECK(corrected.loss.item<double>() == Approx((-1.3 + 0.1 * sum_wk3) / 3));
  CHECK_THROWS_WITH(algo::policy_loss(b.logps, b.old_logps, b.advantages, b.mask, cfg),
                    HasSubstr("needs reference log-probs"));
}

TEST_CASE("policy loss names and settings errors", "[unit][policy_gradient]") {
  CHECK(algo::parse_policy_loss_type("dr_grpo") == algo::PolicyLossType::kDrGrpo);
  CHECK(algo::to_string(algo::ImportanceSamplingLevel::kSequence) == "sequence");
  CHECK(algo::parse_scale_rewards("batch") == algo::ScaleRewards::kBatch);
  try {
    algo::parse_policy_loss_type("ppo");
    FAIL("expected mmpost::Error");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::kUsage);
    CHECK_THAT(e.what(), HasSubstr("grpo, bnpo, dr_grpo, dapo, cispo, sapo, luspo"));
  }
  CHECK_THROWS_WITH(algo::parse_scale_rewards("std"), HasSubstr("group, batch, none"));
  auto cfg = pg_config(algo::PolicyLossType::kGrpo);
  cfg.kl_estimator = algo::KlEstimator::kFull;
  CHECK_THROWS_AS(algo::validate(cfg), Error);
}

TEST_CASE("gae: a hand-computed 4-step trajectory, gamma 0.9, lam 0.8", "[unit][policy_gradient]") {
  // rewards [0, 0, 0, 1], values [0.5, 0.4, 0.3, 0.2], gamma * lam = 0.72.
  //   t=3: delta = 1 + 0.9 * 0 - 0.2 = 0.8;       A3 = 0.8
  //   t=2: delta = 0.9 * 0.2 - 0.3 = -0.12;       A2 = -0.12 + 0.72 * 0.8 = 0.456
  //   t=1: delta = 0.9 * 0.3 - 0.4 = -0.13;       A1 = -0.13 + 0.72 * 0.456 = 0.19832
  //   t=0: delta = 0.9 * 0.4 - 0.5 = -0.14;       A0 = -0.14 + 0.72 * 0.19832 = 0.0027904
  // Row 1, mask [1, 1, 0, 1]: t=2 is skipped (A and V pass through):
  //   A3 = 0.8, A2 = 0.8; t=1: delta = 0.9 * 0.2 - 0.4 = -0.22, A1 = -0.22 + 0.72 * 0.8 = 0.356;
  //   t=0: A0 = -0.14 + 0.72 * 0.356 = 0.11632.
  auto rewards = torch::tensor({{0.0, 0.0, 0.0, 1.0}, {0.0, 0.0, 0.0, 1.0}}, kF64);
  auto values = torch::tensor({{0.5, 0.4, 0.3, 0.2}, {0.5, 0.4, 0.3, 0.2}}, kF64);
  auto mask = torch::tensor({{1, 1, 1, 1}, {1, 1, 0, 1}});
  auto [adv, ret] = algo::gae(rewards, values, mask, 0.9, 0.8);
  CHECK(adv[0][3].item<double>() == Approx(0.8));
  CHECK(adv[0][2].item<double>() == Approx(0.456));
  CHECK(adv[0][1].item<double>() == Approx(0.19832));
  CHECK(adv[0][0].item<double>() == Approx(0.0027904));
  CHECK(ret[0][0].item<double>() == Approx(0.5027904));  // A + V
  CHECK(adv[1][1].item<double>() == Approx(0.356));
  CHECK(adv[1][0].item<double>() == Approx(0.11632));
}

TEST_CASE("value loss: 0.5 * masked mean of the larger of clipped and unclipped errors", "[unit][policy_gradient]") {
  // cliprange 0.2. Position 0: v 1.0, old 0.5 -> clip to 0.7; (1 - 2)^2 = 1 vs (0.7 - 2)^2 = 1.69.
  // Position 1: v 2.0, old 2.1 -> inside [1.9, 2.3]; (2 - 1)^2 = 1 both. Loss 0.5 * (1.69 + 1) / 2.
  auto v = torch::tensor({1.0, 2.0}, kF64), old = torch::tensor({0.5, 2.1}, kF64);
  auto ret = torch::tensor({2.0, 1.0}, kF64), mask = torch::ones({2}, kF64);
  auto [loss, clipfrac] = algo::value_loss(v, old, ret, mask, 0.2);
  CHECK(loss.item<double>() == Approx(0.6725));
  CHECK(clipfrac.item<double>() == Approx(0.5));
}

TEST_CASE("masked_whiten: masked mean and unbiased variance", "[unit][policy_gradient]") {
  // Masked [1, 2, 3]: mean 2, unbiased var (1 + 0 + 1) / 2 = 1.
  auto x = torch::tensor({1.0, 2.0, 3.0, 100.0}, kF64), mask = torch::tensor({1, 1, 1, 0});
  auto w = algo::masked_whiten(x, mask);
  CHECK(elem(w, 0) == Approx(-1.0));
  CHECK(elem(w, 2) == Approx(1.0));
  CHECK(elem(algo::masked_whiten(x, mask, /*shift_mean=*/false), 2) == Approx(3.0));
}

TEST_CASE("masked_whiten with batch_sum: a shard whitens with the whole batch's statistics",
          "[unit][policy_gradient]") {
  // Rank a holds masked [1, 2], rank b masked [3, 6] (and a masked-out 100): the batch's mean is
  // 3, unbiased var (4 + 1 + 0 + 9) / 3 = 14/3, so rank a's 1 whitens to -2 / sqrt(14/3).
  auto xa = torch::tensor({{1.0, 2.0}}, kF64), ma = torch::tensor({{1, 1}});
  auto xb = torch::tensor({{3.0, 6.0, 100.0}}, kF64), mb = torch::tensor({{1, 1, 0}});
  int calls = 0;
  double mean = 0;
  algo::BatchSum peer_b = [&](std::vector<double> v) {  // adds rank b's part of each reduction
    ++calls;
    if (calls == 1) {  // [sum x, count]
      REQUIRE(v.size() == 2);
      v[0] += 9.0;
      v[1] += 2.0;
      mean = v[0] / v[1];
    } else {  // [sum (x - mean)^2]
      REQUIRE(v.size() == 1);
      v[0] += (3.0 - mean) * (3.0 - mean) + (6.0 - mean) * (6.0 - mean);
    }
    return v;
  };
  auto wa = algo::masked_whiten(xa, ma, true, peer_b);
  CHECK(calls == 2);
  CHECK(mean == 3.0);
  CHECK(elem(wa, 0) == Approx(-2.0 / std::sqrt(14.0 / 3.0 + 1e-8)));
  CHECK(elem(wa, 1) == Approx(-1.0 / std::sqrt(14.0 / 3.0 + 1e-8)));
  // Without batch_sum, rank a alone: mean 1.5, var 0.5: the shard's own (wrong) statistics.
  CHECK(elem(algo::masked_whiten(xa, ma), 0) == Approx(-0.5 / std::sqrt(0.5 + 1e-8)));
  // A batch with fewer than two masked elements over all ranks is an error, on every rank.
  auto one = [](std::vector<double> v) { return v; };
  CHECK_THROWS(algo::masked_whiten(torch::tensor({{1.0, 2.0}}, kF64), torch::tensor({{1, 0}}),
                                   true, one));
}

TEST_CASE("kl_penalized_rewards: -kl_coef * kl per token plus the score at the last token", "[unit][policy_gradient]") {
  // k1 row 0: [-1 - -1.5, 0, masked] = [0.5, 0, -]; kl_coef 0.1 -> [-0.05, 0 + score 2, 0].
  // Row 1 (all tokens, kl 0): score 3 on t = 2. Row 2 (no tokens): nothing.
  auto lp = torch::tensor({{-1.0, -2.0, -3.0}, {-1.0, -1.0, -1.0}, {-1.0, -1.0, -1.0}}, kF64);
  auto ref = torch::tensor({{-1.5, -2.0, -2.0}, {-1.0, -1.0, -1.0}, {-1.0, -1.0, -1.0}}, kF64);
  auto mask = torch::tensor({{1, 1, 0}, {1, 1, 1}, {0, 0, 0}});
  auto r = algo::kl_penalized_rewards(lp, ref, torch::tensor({2.0, 3.0, 5.0}, kF64), mask, 0.1);
  CHECK(r[0][0].item<double>() == Approx(-0.05));
  CHECK(r[0][1].item<double>() == Approx(2.0));
  CHECK(r[0][2].item<double>() == 0.0);
  CHECK(r[1][2].item<double>() == Approx(3.0));
  CHECK(r[2].abs().sum().item<double>() == 0.0);
}

}  // namespace unit_test_policy_gradient
