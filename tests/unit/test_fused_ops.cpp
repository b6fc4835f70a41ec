// The fused CPU rotary embedding, SwiGLU and quick_gelu kernels against their composite ATen
// forms computed in float64 (values and gradients), hand-computed values, the extremes of the
// exp inside the sigmoids, NaN propagation and the inputs that must stay on the composite path.
#include <ATen/Parallel.h>

#include <cmath>
#include <limits>

#include "catch.h"
#include "mmpost/model/blocks.h"
#include "mmpost/model/fused_ops.h"
#include "mmpost/model/fused_rms_norm.h"

namespace unit_test_fused_ops {

using namespace mmpost;

namespace {

void require_close(const torch::Tensor& a, const torch::Tensor& b, double rtol, double atol) {
  REQUIRE(a.sizes() == b.sizes());
  const double err = (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
  const double scale = b.abs().max().item<double>();
  INFO("max |a - b| = " << err << " against max |b| = " << scale);
  REQUIRE(err <= atol + rtol * scale);
}

// Leaves (float32 for the fused call, float64 for the reference), the output and the gradients
// of sum(f(inputs) * dy).
struct Run {
  torch::Tensor y;
  std::vector<torch::Tensor> grads;
};

template <typename F>
Run run(F f, const std::vector<torch::Tensor>& inputs, const torch::Tensor& dy,
        torch::ScalarType dt) {
  std::vector<torch::Tensor> leaves;
  for (const auto& t : inputs) leaves.push_back(t.detach().to(dt).requires_grad_(true));
  auto y = f(leaves);
  y.backward(dy.to(dt));
  Run r{y.detach(), {}};
  for (const auto& l : leaves) r.grads.push_back(l.grad());
  return r;
}

std::string grad_fn_name(const torch::Tensor& t) {
  return t.grad_fn() ? t.grad_fn()->name() : std::string("(none)");
}

}  // namespace

TEST_CASE("fused swiglu: hand-computed values and gradients", "[model][fused_ops]") {
  // g = 0: silu = 0, d silu/dg = 1/2. g = 2: s = 1/(1+e^-2), silu = 2 s, d/dg = s (1 + 2 (1 - s)).
  auto g = torch::tensor({0.0f, 2.0f}).requires_grad_(true);
  auto u = torch::tensor({3.0f, -1.5f}).requires_grad_(true);
  auto y = model::swiglu(g, u);
  REQUIRE(grad_fn_name(y).find("FusedSwiGlu") != std::string::npos);
  REQUIRE(torch::equal(y, torch::silu(g) * u));  // ATen's forward, bit for bit
  y.sum().backward();
  const double s = 1.0 / (1.0 + std::exp(-2.0));
  REQUIRE(y[0].item<float>() == 0.0f);
  REQUIRE(y[1].item<float>() == Approx(-1.5 * 2.0 * s).epsilon(1e-6));
  REQUIRE(g.grad()[0].item<float>() == Approx(1.5).epsilon(1e-6));  // u * 1/2
  REQUIRE(g.grad()[1].item<float>() == Approx(-1.5 * s * (1.0 + 2.0 * (1.0 - s))).epsilon(1e-6));
  REQUIRE(u.grad()[0].item<float>() == 0.0f);
  REQUIRE(u.grad()[1].item<float>() == Approx(2.0 * s).epsilon(1e-6));
}

TEST_CASE("fused swiglu and quick_gelu equal the float64 composite forms, values and gradients",
          "[model][fused_ops]") {
  torch::manual_seed(11);
  // Lengths around the vector widths (4, 8, 16 floats) and one past the parallel grain.
  for (int64_t n : {1, 7, 16, 33, 1000, 70001}) {
    DYNAMIC_SECTION("n=" << n) {
      auto g = torch::randn({n}) * 4.0;
      auto u = torch::randn({n});
      auto dy = torch::randn({n});
      auto sw = [](const std::vector<torch::Tensor>& t) { return model::swiglu(t[0], t[1]); };
      auto sw_ref = [](const std::vector<torch::Tensor>& t) { return torch::silu(t[0]) * t[1]; };
      auto a = run(sw, {g, u}, dy, torch::kFloat32);
      auto b = run(sw_ref, {g, u}, dy, torch::kFloat64);
      require_close(a.y, b.y, 1e-6, 1e-7);
      require_close(a.grads[0], b.grads[0], 1e-6, 1e-7);
      require_close(a.grads[1], b.grads[1], 1e-6, 1e-7);

      auto qg = [](const std::vector<torch::Tensor>& t) { return model::quick_gelu(t[0]); };
      auto qg_ref = [](const std::vector<torch::Tensor>& t) {
        return t[0] * torch::sigmoid(1.702 * t[0]);
      };
      auto c = run(qg, {g}, dy, torch::kFloat32);
      auto d = run(qg_ref, {g}, dy, torch::kFloat64);
      require_close(c.y, d.y, 1e-6, 1e-7);
      require_close(c.grads[0], d.grads[0], 1e-6, 1e-7);
    }
  }
}

TEST_CASE("fused sigmoid kernels: the exp's range ends and NaN", "[model][fused_ops]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  // Far past exp's float range on both sides, the switch points (-87.3, 88.7) and a NaN.
  auto g = torch::tensor({-1e30f, -200.0f, -88.0f, -87.0f, -20.0f, 20.0f, 87.0f, 89.0f, 200.0f,
                          1e30f, inf, nan});
  auto u = torch::ones_like(g);
  g.requires_grad_(true);
  auto y = model::swiglu(g, u);
  y.sum().backward();  // the fused backward: d silu/dg = s (1 + g (1 - s))
  auto g64 = g.detach().to(torch::kFloat64);
  auto s64 = torch::sigmoid(g64);
  auto ref = (g64 * s64).to(torch::kFloat32);
  auto dref = (s64 * (1.0 + g64 * (1.0 - s64))).to(torch::kFloat32);
  for (int64_t i = 0; i + 2 < g.numel(); ++i) {
    INFO("g = " << g[i].item<float>() << ": " << y[i].item<float>() << " vs " << ref[i].item<float>()
                << ", d/dg " << g.grad()[i].item<float>() << " vs " << dref[i].item<float>());
    REQUIRE(std::abs(y[i].item<float>() - ref[i].item<float>()) <=
            1e-6 * std::abs(ref[i].item<float>()) + 1e-30);
    REQUIRE(std::abs(g.grad()[i].item<float>() - dref[i].item<float>()) <=
            1e-6 * std::abs(dref[i].item<float>()) + 1e-30);
  }
  REQUIRE(y[g.numel() - 2].item<float>() == inf);
  REQUIRE(std::isnan(y[g.numel() - 1].item<float>()));
  REQUIRE(std::isnan(g.grad()[g.numel() - 1].item<float>()));
  auto q = model::quick_gelu(torch::tensor({nan, 1.0f}));
  REQUIRE(std::isnan(q[0].item<float>()));
  REQUIRE(q[1].item<float>() == Approx(1.0 / (1.0 + std::exp(-1.702))).epsilon(1e-6));
}

TEST_CASE("fused rope: a hand-computed pair", "[model][fused_ops]") {
  // D = 2: y1 = x1 cos - x2 sin, y2 = x2 cos + x1 sin (a plane rotation by the angle).
  const double a = 0.7;
  auto x = torch::tensor({1.0f, 2.0f}).view({1, 1, 1, 2}).requires_grad_(true);
  auto cos = torch::full({1, 1, 2}, std::cos(a), torch::kFloat32);
  auto sin = torch::full({1, 1, 2}, std::sin(a), torch::kFloat32);
  auto y = model::apply_rope(x, cos, sin);
  REQUIRE(grad_fn_name(y).find("FusedRope") != std::string::npos);
  REQUIRE(y.view({2})[0].item<float>() == Approx(std::cos(a) - 2 * std::sin(a)).epsilon(1e-6));
  REQUIRE(y.view({2})[1].item<float>() == Approx(2 * std::cos(a) + std::sin(a)).epsilon(1e-6));
  // The backward is the inverse rotation: d(y . dy)/dx for dy = (1, 0) is (cos, -sin).
  y.backward(torch::tensor({1.0f, 0.0f}).view({1, 1, 1, 2}));
  REQUIRE(x.grad().view({2})[0].item<float>() == Approx(std::cos(a)).epsilon(1e-6));
  REQUIRE(x.grad().view({2})[1].item<float>() == Approx(-std::sin(a)).epsilon(1e-6));
}

TEST_CASE("fused rope equals the composite form for q/k layouts, values and gradients",
          "[model][fused_ops]") {
  torch::manual_seed(12);
  const int64_t T = 5;
  for (int64_t D : {2, 6, 32, 64}) {
    for (int64_t cos_batch : {1, 3}) {
      for (bool projected : {true, false}) {
        DYNAMIC_SECTION("D=" << D << " cos batch " << cos_batch << " projected " << projected) {
          const int64_t B = 3, H = 4;
          // projected: [B, T, H, D] memory viewed as [B, H, T, D], as q_proj(x).view().transpose().
          auto x = projected ? torch::randn({B, T, H, D}).transpose(1, 2) : torch::randn({B, H, T, D});
          auto pos = torch::randint(0, 50, {cos_batch, T}, torch::kInt64);
          auto [cos, sin] = model::rope_cos_sin(pos, D, 10000.0, torch::kFloat32);
          auto dy = torch::randn({B, H, T, D});
          auto f = [&](const std::vector<torch::Tensor>& t) {
            return model::apply_rope(t[0], cos.to(t[0].scalar_type()), sin.to(t[0].scalar_type()));
          };
          auto ref = [&](const std::vector<torch::Tensor>& t) {
            return model::apply_rope_composite(t[0], cos.to(t[0].scalar_type()),
                                               sin.to(t[0].scalar_type()));
          };
          auto a = run(f, {x}, dy, torch::kFloat32);
          auto b = run(ref, {x}, dy, torch::kFloat64);
          require_close(a.y, b.y, 1e-6, 1e-7);
          require_close(a.grads[0], b.grads[0], 1e-6, 1e-7);
          // Bit for bit the float32 composite (HF's form): no FMA contraction in the kernel
          // (-ffp-contract=off), which the SmolLM2 logits parity test needs.
          REQUIRE(torch::equal(a.y, run(ref, {x}, dy, torch::kFloat32).y));
          if (projected) REQUIRE(a.y.strides() == x.strides());  // the layout SDPA got before
        }
      }
    }
  }
}

TEST_CASE("fused ops: bf16 inputs and cos/sin with gradients take the composite path exactly",
          "[model][fused_ops]") {
  torch::manual_seed(13);
  auto g = torch::randn({4, 9}).to(torch::kBFloat16);
  auto u = torch::randn({4, 9}).to(torch::kBFloat16);
  REQUIRE(torch::equal(model::swiglu(g, u), torch::silu(g) * u));
  REQUIRE(torch::equal(model::quick_gelu(g), g * torch::sigmoid(1.702 * g)));
  auto x = torch::randn({1, 2, 3, 4});
  auto cos = torch::rand({1, 3, 4}).requires_grad_(true);
  auto sin = torch::rand({1, 3, 4});
  auto y = model::apply_rope(x, cos, sin);
  REQUIRE(grad_fn_name(y).find("FusedRope") == std::string::npos);
  REQUIRE(torch::equal(y, model::apply_rope_composite(x, cos, sin)));
  y.sum().backward();
  REQUIRE(cos.grad().defined());
}

TEST_CASE("fused kernels split over two threads give the one-thread values (element-wise and "
          "per-row: bit for bit)", "[unit][fused]") {
  // Sizes past the kernels' parallel grains, so at 2 threads each call really splits.
  torch::manual_seed(21);
  const auto gate = torch::randn({256, 512}), up = torch::randn({256, 512});
  const auto x = torch::randn({4096, 64}), w = torch::randn({64});
  const auto q = torch::randn({2, 4, 1024, 16});
  const auto angle = torch::randn({1, 1024, 16});
  const auto cos = angle.cos(), sin = angle.sin();
  auto run = [&](int threads) {
    const int saved = at::get_num_threads();
    at::set_num_threads(threads);
    std::vector<torch::Tensor> out;
    auto g = gate.clone().requires_grad_(true), u = up.clone().requires_grad_(true);
    auto y = model::swiglu(g, u);
    y.backward(torch::ones_like(y));
    out.insert(out.end(), {y.detach(), g.grad(), u.grad()});
    auto a = gate.clone().requires_grad_(true);
    auto ya = model::quick_gelu(a);
    ya.backward(torch::ones_like(ya));
    out.insert(out.end(), {ya.detach(), a.grad()});
    auto xr = x.clone().requires_grad_(true), wr = w.clone().requires_grad_(true);
    auto yr = model::rms_norm(xr, wr, 1e-6);
    yr.backward(torch::ones_like(yr));
    out.insert(out.end(), {yr.detach(), xr.grad(), wr.grad()});
    auto qr = q.clone().requires_grad_(true);
    auto yq = model::apply_rope(qr, cos, sin);
    yq.backward(torch::ones_like(yq));
    out.insert(out.end(), {yq.detach(), qr.grad()});
    at::set_num_threads(saved);
    return out;
  };
  const auto one = run(1), two = run(2);
  REQUIRE(one.size() == 10);
  for (size_t k = 0; k < one.size(); ++k) {
    INFO("output " << k);
    if (k == 7) {  // the RMSNorm weight gradient: one partial sum per thread, then added
      CHECK((one[k] - two[k]).abs().max().item<double>() <=
            1e-5 * (1 + one[k].abs().max().item<double>()));
    } else {
      CHECK(torch::equal(one[k], two[k]));
    }
  }
}

}  // namespace unit_test_fused_ops
