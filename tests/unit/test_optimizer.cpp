// The fused AdamW step (train::adamw_step): hand-computed update, agreement with
// torch::optim::AdamW over several steps, and one state format for both paths.
#include <sstream>

#include "catch.h"
#include "mmpost/train/optimizer.h"

using namespace mmpost;

namespace {

/// (name, parameter) pairs with requires_grad, copied from `init`.
std::vector<std::pair<std::string, torch::Tensor>> params_from(
    const std::vector<torch::Tensor>& init) {
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (size_t i = 0; i < init.size(); ++i) {
    named.emplace_back("p" + std::to_string(i), init[i].clone().set_requires_grad(true));
  }
  return named;
}

void set_grads(const std::vector<std::pair<std::string, torch::Tensor>>& named,
               const std::vector<torch::Tensor>& grads) {
  for (size_t i = 0; i < named.size(); ++i) {
    named[i].second.mutable_grad() = grads[i].defined() ? grads[i].clone() : torch::Tensor();
  }
}

double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

}  // namespace

TEST_CASE("fused AdamW: first step equals the hand-computed update, decay on matrices only",
          "[unit][optimizer]") {
  // W (2-D, decayed) = 1 everywhere, grad 0.5; b (1-D, no decay) = 1, grad -0.25.
  // Step 1: m = 0.1 g, v = 0.001 g^2, m_hat = g, v_hat = g^2, update = lr g / (|g| + eps).
  // W: 1 * (1 - lr wd) - lr * 0.5 / (0.5 + 1e-8)  = 0.999 - 0.1 * 0.99999998   = 0.899000002
  // b: 1                + lr * 0.25 / (0.25 + 1e-8) = 1 + 0.1 * 0.99999996       = 1.099999996
  auto named = params_from({torch::ones({2, 3}, torch::kFloat64), torch::ones({3}, torch::kFloat64)});
  set_grads(named, {torch::full({2, 3}, 0.5, torch::kFloat64), torch::full({3}, -0.25, torch::kFloat64)});
  auto opt = train::make_adamw(named, {.lr = 0.1, .weight_decay = 0.01});
  train::adamw_step(*opt, /*fused=*/true);
  CHECK(max_abs_diff(named[0].second, torch::full({2, 3}, 0.899000002, torch::kFloat64)) < 1e-12);
  CHECK(max_abs_diff(named[1].second, torch::full({3}, 1.099999996, torch::kFloat64)) < 1e-12);
  // The state is torch::optim::AdamW's: step 1, m = 0.1 g, v = 0.001 g^2.
  auto& st = static_cast<torch::optim::AdamWParamState&>(
      *opt->state().at(named[0].second.unsafeGetTensorImpl()));
  CHECK(st.step() == 1);
  CHECK(max_abs_diff(st.exp_avg(), torch::full({2, 3}, 0.05, torch::kFloat64)) < 1e-15);
  CHECK(max_abs_diff(st.exp_avg_sq(), torch::full({2, 3}, 0.00025, torch::kFloat64)) < 1e-15);
}

TEST_CASE("fused AdamW: 6 steps agree with torch::optim::AdamW to float rounding, state files "
          "interchange", "[unit][optimizer]") {
  torch::manual_seed(3);
  std::vector<torch::Tensor> init = {torch::randn({64, 32}), torch::randn({32}),
                                     torch::randn({7, 5, 3}), torch::randn({1})};
  auto fused = params_from(init);
  auto plain = params_from(init);
  const train::AdamWOptions o{.lr = 3e-3, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6,
                              .weight_decay = 0.1};
  auto opt_f = train::make_adamw(fused, o);
  auto opt_p = train::make_adamw(plain, o);
  for (int step = 0; step < 6; ++step) {
    std::vector<torch::Tensor> grads;
    for (const auto& t : init) grads.push_back(torch::randn_like(t) * (step + 1));
    if (step == 2) grads[3] = torch::Tensor();  // a tensor without gradient is skipped by both
    set_grads(fused, grads);
    set_grads(plain, grads);
    train::adamw_step(*opt_f, true);
    train::adamw_step(*opt_p, false);
  }
  for (size_t i = 0; i < init.size(); ++i) {
    INFO("tensor " << i);
    // The parameters moved (lr 3e-3 x 6 steps) ...
    CHECK(max_abs_diff(fused[i].second, init[i]) > 1e-3);
    // ... and the two paths agree to float32 rounding of values of order 1.
    CHECK(max_abs_diff(fused[i].second, plain[i].second) < 2e-6);
    auto& sf = static_cast<torch::optim::AdamWParamState&>(
        *opt_f->state().at(fused[i].second.unsafeGetTensorImpl()));
    auto& sp = static_cast<torch::optim::AdamWParamState&>(
        *opt_p->state().at(plain[i].second.unsafeGetTensorImpl()));
    CHECK(sf.step() == sp.step());
    CHECK(sf.step() == (i == 3 ? 5 : 6));
    CHECK(max_abs_diff(sf.exp_avg_sq(), sp.exp_avg_sq()) < 1e-5);
  }
  // The fused run's state, saved, loads into a plain AdamW and continues identically to the
  // fused one (one checkpoint format).
  std::stringstream buf;
  torch::save(*opt_f, buf);
  auto cont = params_from({fused[0].second.detach(), fused[1].second.detach(),
                           fused[2].second.detach(), fused[3].second.detach()});
  auto opt_c = train::make_adamw(cont, o);
  torch::load(*opt_c, buf);
  std::vector<torch::Tensor> grads;
  for (const auto& t : init) grads.push_back(torch::randn_like(t));
  set_grads(fused, grads);
  set_grads(cont, grads);
  train::adamw_step(*opt_f, true);
  train::adamw_step(*opt_c, true);
  for (size_t i = 0; i < init.size(); ++i) {
    CHECK(torch::equal(fused[i].second, cont[i].second));
  }
}
