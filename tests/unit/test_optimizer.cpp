// The fused AdamW step (train::adamw_step): hand-computed update, agreement with
// torch::optim::AdamW over several steps, and one state format for both paths.
#include <sstream>

#include "catch.h"
#include "mmpost/core/device.h"
#include "mmpost/train/host_adamw.h"
#include "mmpost/train/optimizer.h"

namespace unit_test_optimizer {

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

TEST_CASE("fused AdamW on float32 CPU tensors: clipping folded into the update equals scaling "
          "the gradients first, and ATen's _fused_adamw_ to float rounding",
          "[unit][optimizer]") {
  torch::manual_seed(5);
  // 70001 elements: more than one 32k-element chunk and a tail that is no vector width.
  std::vector<torch::Tensor> init = {torch::randn({70001}), torch::randn({33, 17}),
                                     torch::randn({3})};
  for (const double beta1 : {0.9, 0.3}) {  // lerp weight 1 - beta1 below and above 0.5
    INFO("beta1 " << beta1);
    const train::AdamWOptions o{.lr = 2e-3, .beta1 = beta1, .beta2 = 0.95, .eps = 1e-8,
                                .weight_decay = 0.05};
    auto folded = params_from(init);
    auto scaled = params_from(init);
    auto aten = params_from(init);
    auto opt_folded = train::make_adamw(folded, o);
    auto opt_scaled = train::make_adamw(scaled, o);
    auto opt_aten = train::make_adamw(aten, o);
    for (int step = 0; step < 5; ++step) {
      std::vector<torch::Tensor> grads;
      for (const auto& t : init) grads.push_back(torch::randn_like(t));
      const double coef = 0.25 + 0.1 * step;  // a clipping coefficient
      set_grads(folded, grads);
      set_grads(scaled, grads);
      train::adamw_step(*opt_folded, /*fused=*/true, coef);
      // The gradients themselves are left as they were.
      for (size_t i = 0; i < init.size(); ++i) {
        CHECK(torch::equal(folded[i].second.grad(), grads[i]));
      }
      std::vector<torch::Tensor> scaled_params;
      for (auto& [name, p] : scaled) scaled_params.push_back(p);
      train::scale_grads(scaled_params, coef);
      train::adamw_step(*opt_scaled, /*fused=*/true, 1.0);
      // ATen's kernel (the one torch.optim.AdamW(fused=True) runs) on the same scaled gradients.
      torch::NoGradGuard ng;
      std::vector<torch::Tensor> ps, gs, ms, vs, steps;
      for (size_t i = 0; i < init.size(); ++i) {
        auto& p = aten[i].second;
        auto& slot = opt_aten->state()[p.unsafeGetTensorImpl()];
        if (!slot) {
          auto st = std::make_unique<torch::optim::AdamWParamState>();
          st->exp_avg(torch::zeros_like(p));
          st->exp_avg_sq(torch::zeros_like(p));
          slot = std::move(st);
        }
        auto& st = static_cast<torch::optim::AdamWParamState&>(*slot);
        ps.push_back(p);
        gs.push_back(grads[i] * static_cast<float>(coef));
        ms.push_back(st.exp_avg());
        vs.push_back(st.exp_avg_sq());
        steps.push_back(torch::full({}, static_cast<double>(step + 1)));
      }
      // Tensor i >= 1 has no decay in make_adamw's grouping only when 1-D; call per group.
      std::vector<torch::Tensor> ps_d, gs_d, ms_d, vs_d, st_d, ps_n, gs_n, ms_n, vs_n, st_n;
      for (size_t i = 0; i < init.size(); ++i) {
        const bool decay = init[i].dim() >= 2;
        (decay ? ps_d : ps_n).push_back(ps[i]);
        (decay ? gs_d : gs_n).push_back(gs[i]);
        (decay ? ms_d : ms_n).push_back(ms[i]);
        (decay ? vs_d : vs_n).push_back(vs[i]);
        (decay ? st_d : st_n).push_back(steps[i]);
      }
      at::_fused_adamw_(ps_d, gs_d, ms_d, vs_d, {}, st_d, o.lr, o.beta1, o.beta2, o.weight_decay,
                        o.eps, false, false);
      at::_fused_adamw_(ps_n, gs_n, ms_n, vs_n, {}, st_n, o.lr, o.beta1, o.beta2, 0.0, o.eps,
                        false, false);
    }
    for (size_t i = 0; i < init.size(); ++i) {
      INFO("tensor " << i);
      // Folding the coefficient into the read rounds exactly as scaling the gradient first.
      CHECK(torch::equal(folded[i].second, scaled[i].second));
      CHECK(max_abs_diff(folded[i].second, init[i]) > 1e-3);
      // ATen evaluates the same formula with an FMA in the lerp: float rounding apart.
      CHECK(max_abs_diff(folded[i].second, aten[i].second) < 1e-6);
      auto& sf = static_cast<torch::optim::AdamWParamState&>(
          *opt_folded->state().at(folded[i].second.unsafeGetTensorImpl()));
      auto& sa = static_cast<torch::optim::AdamWParamState&>(
          *opt_aten->state().at(aten[i].second.unsafeGetTensorImpl()));
      CHECK(max_abs_diff(sf.exp_avg(), sa.exp_avg()) < 1e-6);
      CHECK(max_abs_diff(sf.exp_avg_sq(), sa.exp_avg_sq()) < 1e-6);
    }
  }
}

TEST_CASE("host AdamW and the gradient sum of squares do not depend on the thread count",
          "[unit][optimizer]") {
  // 0.5^2 x 10000 = 2500 exactly; 3^2 + 4^2 = 25.
  auto half = torch::full({10000}, 0.5f);
  CHECK(train::host_sum_squares(half.data_ptr<float>(), half.numel()) == 2500.0);
  auto t34 = torch::tensor({3.0f, 4.0f});
  CHECK(train::host_sum_squares(t34.data_ptr<float>(), 2) == 25.0);
  CHECK(train::host_sum_squares(nullptr, 0) == 0.0);

  torch::manual_seed(8);
  auto x = torch::randn({300001});
  auto g = torch::randn({300001});
  const int threads = at::get_num_threads();
  auto run = [&](int n_threads) {
    at::set_num_threads(n_threads);
    auto p = x.clone();
    auto m = torch::zeros_like(p);
    auto v = torch::zeros_like(p);
    for (int64_t step = 1; step <= 3; ++step) {
      train::host_adamw({{.param = p.data_ptr<float>(), .grad = g.data_ptr<float>(),
                          .exp_avg = m.data_ptr<float>(), .exp_avg_sq = v.data_ptr<float>(),
                          .numel = p.numel(), .lr = 1e-2, .weight_decay = 0.1, .step = step}},
                        0.5);
    }
    const double sq = train::host_sum_squares(p.data_ptr<float>(), p.numel());
    return std::make_pair(p, sq);
  };
  const auto [p1, sq1] = run(1);
  const auto [p2, sq2] = run(2);
  at::set_num_threads(threads);
  CHECK(torch::equal(p1, p2));
  CHECK(sq1 == sq2);
  // The sum of squares agrees with a float64 sum (float32 lanes within each 4096-element block).
  CHECK(std::abs(sq1 - p1.to(torch::kFloat64).pow(2).sum().item<double>()) < 1e-6 * sq1);
}

TEST_CASE("mixed precision: the forward after an optimizer step casts the updated weights, "
          "not autocast's cached copies of the old ones",
          "[unit][optim]") {
  // mixed_precision bf16 holds one autocast region for the whole run; autocast caches the bf16
  // copy of each float32 leaf weight for the region's lifetime. Before Optimizer::step dropped
  // that cache, every forward after step 1 used the step-1 weights (the run trained, the saved
  // float32 model was garbage).
  torch::manual_seed(0);
  auto named = params_from({torch::randn({3, 4}), torch::randn({3})});
  const auto& w = named[0].second;
  const auto& b = named[1].second;
  config::OptimSection o;
  o.lr = 0.1;  // moves every weight by ~0.1, far beyond bf16 rounding at |w| ~ 1
  train::Optimizer opt(named, o, config::SchedulerSection{}, /*clip_grad_norm=*/0.0, 10);
  const auto x = torch::randn({5, 4});
  mmpost::AutocastGuard autocast(torch::Device(torch::kCPU), torch::kBFloat16);
  for (int64_t step = 0; step < 3; ++step) {
    opt.zero_grad();
    auto y = torch::linear(x, w, b);
    REQUIRE(y.scalar_type() == torch::kBFloat16);
    // What the forward must be: a fresh bf16 cast of the current float32 weights.
    torch::Tensor expect;
    {
      torch::NoGradGuard no_grad;
      expect = torch::linear(x.to(torch::kBFloat16), w.detach().to(torch::kBFloat16),
                             b.detach().to(torch::kBFloat16));
    }
    CHECK(torch::equal(y.detach(), expect));
    auto loss = y.to(torch::kFloat32).pow(2).sum();
    loss.backward();
    const auto w_before = w.detach().clone();
    opt.step(step, loss.item<double>());
    CHECK(max_abs_diff(w.detach(), w_before) > 0.05);  // the update is visible in float32
  }
}

}  // namespace unit_test_optimizer
