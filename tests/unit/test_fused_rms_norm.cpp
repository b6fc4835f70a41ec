// The fused CPU RMSNorm kernel against transformers' composite form (LlamaRMSNorm line by line),
// forward and both gradients, plus a hand-computed row and the paths that must stay composite.
#include "catch.h"
#include "mmpost/model/blocks.h"
#include "mmpost/model/fused_rms_norm.h"

namespace unit_test_fused_rms_norm {

using namespace mmpost;

namespace {

struct Grads {
  torch::Tensor y, dx, dw;
};

// y, dx, dw of f(x, w) under the upstream gradient `dy` (x and w are cloned leaves).
template <typename F>
Grads run(F f, const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& dy,
          bool w_grad = true) {
  auto xl = x.detach().clone().requires_grad_(true);
  auto wl = w.detach().clone().requires_grad_(w_grad);
  auto y = f(xl, wl, 1e-6);
  y.backward(dy);
  return {y.detach(), xl.grad(), w_grad ? wl.grad() : torch::Tensor()};
}

void require_close(const torch::Tensor& a, const torch::Tensor& b, double rtol, double atol) {
  REQUIRE(a.sizes() == b.sizes());
  const double err = (a - b).abs().max().item<double>();
  const double scale = b.abs().max().item<double>();
  INFO("max |a - b| = " << err << " against max |b| = " << scale);
  REQUIRE(err <= atol + rtol * scale);
}

}  // namespace

TEST_CASE("fused rms_norm: a hand-computed row", "[model][rms_norm]") {
  // x = (3, 4): mean(x^2) = 12.5, rstd = 1/sqrt(12.5 + 0.5) = 1/sqrt(13); w = (2, -1).
  auto x = torch::tensor({3.0f, 4.0f}).view({1, 2});
  auto w = torch::tensor({2.0f, -1.0f});
  auto y = model::rms_norm(x, w, 0.5);
  const float r = 1.0f / std::sqrt(13.0f);
  REQUIRE(y[0][0].item<float>() == Approx(6.0f * r).epsilon(1e-6));
  REQUIRE(y[0][1].item<float>() == Approx(-4.0f * r).epsilon(1e-6));
}

TEST_CASE("fused rms_norm equals the composite form, values and gradients", "[model][rms_norm]") {
  torch::manual_seed(5);
  for (int64_t C : {1, 7, 64, 257}) {
    for (bool strided : {false, true}) {
      DYNAMIC_SECTION("C=" << C << " strided=" << strided) {
        auto base = torch::randn({3, 5, strided ? 2 * C : C}) * 3.0;
        auto x = strided ? base.narrow(-1, C / 2, C) : base;  // a non-contiguous view
        auto w = torch::randn({C});
        auto dy = torch::randn({3, 5, C});
        auto fused = run(model::rms_norm, x, w, dy);
        auto ref = run(model::rms_norm_composite, x, w, dy);
        require_close(fused.y, ref.y, 1e-6, 1e-6);
        require_close(fused.dx, ref.dx, 1e-5, 1e-6);
        require_close(fused.dw, ref.dw, 1e-5, 1e-6);
      }
    }
  }
}

TEST_CASE("fused rms_norm: a frozen weight gets no gradient, x still does", "[model][rms_norm]") {
  torch::manual_seed(6);
  auto x = torch::randn({4, 33});
  auto w = torch::randn({33});
  auto dy = torch::randn({4, 33});
  auto fused = run(model::rms_norm, x, w, dy, /*w_grad=*/false);
  auto ref = run(model::rms_norm_composite, x, w, dy, /*w_grad=*/false);
  REQUIRE_FALSE(fused.dw.defined());
  require_close(fused.dx, ref.dx, 1e-5, 1e-6);
}

TEST_CASE("fused rms_norm: bf16 and float64 inputs keep the composite path exactly",
          "[model][rms_norm]") {
  torch::manual_seed(7);
  for (auto dt : {torch::kBFloat16, torch::kFloat64}) {
    auto x = torch::randn({2, 3, 16}).to(dt);
    auto w = torch::randn({16});
    auto a = model::rms_norm(x, w, 1e-6);
    auto b = model::rms_norm_composite(x, w, 1e-6);
    REQUIRE(a.scalar_type() == b.scalar_type());
    REQUIRE(torch::equal(a, b));
  }
}

TEST_CASE("RmsNorm module runs the fused kernel: same as the composite on a Llama-sized row",
          "[model][rms_norm]") {
  torch::manual_seed(8);
  model::RmsNorm norm(128, 1e-6);
  {
    torch::NoGradGuard ng;
    norm->weight.copy_(torch::rand({128}) + 0.5);
  }
  auto x = torch::randn({2, 9, 128});
  auto y = norm(x);
  REQUIRE(y.grad_fn() != nullptr);
  INFO("grad_fn " << y.grad_fn()->name());
  REQUIRE(y.grad_fn()->name().find("FusedRmsNorm") != std::string::npos);
  require_close(y, model::rms_norm_composite(x, norm->weight, 1e-6), 1e-6, 1e-6);
}

}  // namespace unit_test_fused_rms_norm
