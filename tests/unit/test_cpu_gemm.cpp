// mmpost::gemm_linear / gemm_mm on the oneDNN path against float64 at::linear (values and all three
// gradients), hand-computed values, the routing rules (cpu_gemm setting, autocast, dtypes, empty
// inputs) and the recipe-side parsing. The oneDNN cases say skipped on a LibTorch without the
// oneDNN linear operator.
#include <ATen/autocast_mode.h>
#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>

#include <dlfcn.h>

#include <array>

#include "catch.h"
#include "mmpost/core/cpu_gemm.h"
#include "test_util.h"

namespace unit_test_cpu_gemm {

using namespace mmpost;

namespace {

/// Sets the process-wide GEMM choice for one test and puts "auto" back after it.
struct GemmScope {
  explicit GemmScope(CpuGemm g) { set_cpu_gemm(g); }
  ~GemmScope() { set_cpu_gemm(CpuGemm::kAuto); }
};

void require_close(const torch::Tensor& a, const torch::Tensor& b, double rtol) {
  REQUIRE(a.sizes() == b.sizes());
  const double err = (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
  const double scale = b.abs().max().item<double>();
  INFO("max |a - b| = " << err << " against max |b| = " << scale);
  REQUIRE(err <= rtol * scale);
}

/// Whether y came out of the oneDNN Function, directly (2-D) or through the reshape to [..., N].
bool took_onednn(const torch::Tensor& y) {
  auto fn = y.grad_fn();
  for (int depth = 0; fn != nullptr && depth < 2; ++depth) {
    if (fn->name().find("OneDnnLinear") != std::string::npos) return true;
    if (fn->next_edges().empty()) return false;
    fn = fn->next_edges()[0].function;
  }
  return false;
}

}  // namespace

TEST_CASE("cpu_gemm: names parse both ways and a wrong one is named", "[unit][gemm]") {
  for (auto g : {CpuGemm::kAuto, CpuGemm::kBlas, CpuGemm::kOneDnn}) {
    REQUIRE(parse_cpu_gemm(cpu_gemm_name(g)) == g);
  }
  REQUIRE_THROWS_WITH(parse_cpu_gemm("mkl"), HasSubstr("\"mkl\" is not one of auto, blas, onednn"));
  GemmScope scope(CpuGemm::kBlas);
  REQUIRE(cpu_gemm() == CpuGemm::kBlas);
}

TEST_CASE("cpu_gemm: auto resolves by CPU vendor", "[unit][gemm]") {
  unsetenv("MMPOST_CPU_GEMM");  // the override has its own test
  set_cpu_gemm(CpuGemm::kAuto);
  const std::string v = cpu_vendor();
  INFO("vendor " << v);
  const bool want_onednn = onednn_gemm_available() && !v.empty() && v != "GenuineIntel";
  REQUIRE(cpu_gemm() == (want_onednn ? CpuGemm::kOneDnn : CpuGemm::kBlas));
}

TEST_CASE("cpu_gemm: oneDNN linear by hand", "[unit][gemm]") {
  if (!onednn_gemm_available()) MMPOST_SKIP("this LibTorch has no oneDNN linear operator");
  GemmScope scope(CpuGemm::kOneDnn);
  // x = 1 [4, 512], w[j][k] = j [512, 512], b = 0.5: every
  // value and partial sum below is an integer or a half under 2^24, exact in float32 whatever
  // the summation order.
  const int64_t M = 4, K = 512, N = 512;
  auto x = torch::ones({M, K}).requires_grad_(true);
  auto col = torch::arange(N, torch::kFloat32);  // j
  auto w = col.unsqueeze(1).expand({N, K}).contiguous().requires_grad_(true);
  auto b = torch::full({N}, 0.5f).requires_grad_(true);
  auto y = gemm_linear(x, w, b);
  REQUIRE(took_onednn(y));
  REQUIRE(torch::equal(y.detach(), (512 * col + 0.5f).unsqueeze(0).expand({M, N})));  // 512 j + 0.5
  y.sum().backward();
  REQUIRE(torch::equal(x.grad(), torch::full({M, K}, 130816.f)));  // 1 w: sum_j j = 511 * 512 / 2
  REQUIRE(torch::equal(w.grad(), torch::full({N, K}, 4.f)));       // 1^T x: M
  REQUIRE(torch::equal(b.grad(), torch::full({N}, 4.f)));
}

TEST_CASE("cpu_gemm: oneDNN linear matches float64 at::linear, values and gradients",
          "[unit][gemm]") {
  if (!onednn_gemm_available()) MMPOST_SKIP("this LibTorch has no oneDNN linear operator");
  GemmScope scope(CpuGemm::kOneDnn);
  torch::manual_seed(7);
  struct Case {
    std::vector<int64_t> x_sizes;
    int64_t out;
    bool bias, x_grad, w_grad, transposed_x;
  };
  const std::vector<Case> cases = {
      {{300, 512}, 512, true, true, true, false},      // 2-D, bias
      {{3, 29, 1024}, 256, false, true, true, false},  // 3-D, no bias (q/k/v/o, MLP, lm_head)
      {{5, 61, 512}, 640, true, false, true, false},   // first layer: x needs no gradient
      {{4, 67, 768}, 384, true, true, false, false},   // frozen weight (LoRA base)
      {{2, 19, 256}, 1030, true, true, true, true},    // non-contiguous x, odd sizes
  };
  for (const auto& c : cases) {
    CAPTURE(c.x_sizes, c.out, c.bias, c.x_grad, c.w_grad, c.transposed_x);
    const int64_t in = c.x_sizes.back();
    auto x0 = torch::randn(c.x_sizes);
    if (c.transposed_x) {  // same values, strides of a transpose
      x0 = x0.transpose(0, 1).contiguous().transpose(0, 1);
      REQUIRE_FALSE(x0.is_contiguous());
    }
    auto w0 = torch::randn({c.out, in}) / std::sqrt(static_cast<double>(in));
    auto b0 = torch::randn({c.out});
    auto out_sizes = c.x_sizes;
    out_sizes.back() = c.out;
    auto dy = torch::randn(out_sizes);
    auto leaf = [](const torch::Tensor& t, torch::Dtype dt, bool grad) {
      auto l = t.detach().to(dt);
      if (grad) l.requires_grad_(true);
      return l;
    };
    auto x = leaf(x0, torch::kFloat32, c.x_grad), w = leaf(w0, torch::kFloat32, c.w_grad),
         b = leaf(b0, torch::kFloat32, c.bias);
    auto y = gemm_linear(x, w, c.bias ? std::optional<torch::Tensor>(b) : std::nullopt);
    REQUIRE(took_onednn(y));
    y.backward(dy);
    auto xr = leaf(x0, torch::kFloat64, c.x_grad), wr = leaf(w0, torch::kFloat64, c.w_grad),
         br = leaf(b0, torch::kFloat64, c.bias);
    auto yr = at::linear(xr, wr, c.bias ? std::optional<torch::Tensor>(br) : std::nullopt);
    yr.backward(dy.to(torch::kFloat64));
    require_close(y, yr, 1e-5);
    if (c.x_grad) require_close(x.grad(), xr.grad(), 1e-5);
    if (c.w_grad) require_close(w.grad(), wr.grad(), 1e-5);
    if (c.bias) require_close(b.grad(), br.grad(), 1e-5);
    REQUIRE(c.x_grad == x.grad().defined());
    REQUIRE(c.w_grad == w.grad().defined());
  }
}

TEST_CASE("cpu_gemm: no-grad forward and mm on oneDNN match float64", "[unit][gemm]") {
  if (!onednn_gemm_available()) MMPOST_SKIP("this LibTorch has no oneDNN linear operator");
  GemmScope scope(CpuGemm::kOneDnn);
  torch::manual_seed(3);
  auto x = torch::randn({6, 9, 512}), w = torch::randn({520, 512}), b = torch::randn({520});
  {
    torch::NoGradGuard no_grad;
    auto y = gemm_linear(x, w, b);
    REQUIRE(y.grad_fn() == nullptr);
    require_close(y, at::linear(x.to(torch::kFloat64), w.to(torch::kFloat64), b.to(torch::kFloat64)), 1e-5);
  }
  auto a = torch::randn({23, 512}), m = torch::randn({512, 520});
  auto ref = at::mm(a.to(torch::kFloat64), m.to(torch::kFloat64));
  require_close(gemm_mm(a, m), ref, 1e-5);
  require_close(gemm_mm(a, m.t().contiguous().t()), ref, 1e-5);         // b as a transposed view
  require_close(gemm_mm(a.t().contiguous().t(), m), ref, 1e-5);         // a transposed: at::mm
  REQUIRE_THROWS_WITH(gemm_mm(a.unsqueeze(0), m), HasSubstr("expected [M, K] @ [K, N]"));
  REQUIRE_THROWS_WITH(gemm_mm(a, m.narrow(0, 0, 500)), HasSubstr("[23, 512] and [500, 520]"));
  REQUIRE_THROWS_WITH(gemm_linear(x, w.narrow(1, 0, 500)),
                      HasSubstr("input [6, 9, 512] does not match weight [520, 500]"));
}

TEST_CASE("cpu_gemm: blas, autocast, other dtypes and empty inputs take at::linear",
          "[unit][gemm]") {
  torch::manual_seed(5);
  auto x = torch::randn({4, 512}).requires_grad_(true);
  auto w = torch::randn({512, 512}).requires_grad_(true);
  {
    GemmScope scope(CpuGemm::kBlas);
    auto y = gemm_linear(x, w);
    REQUIRE_FALSE(took_onednn(y));
    REQUIRE(torch::equal(y, at::linear(x, w)));
  }
  if (!onednn_gemm_available()) MMPOST_SKIP("this LibTorch has no oneDNN linear operator");
  GemmScope scope(CpuGemm::kOneDnn);
  REQUIRE(took_onednn(gemm_linear(x, w)));
  REQUIRE(took_onednn(gemm_linear(x.narrow(0, 0, 1), w)));  // the row count does not matter
  REQUIRE(took_onednn(gemm_linear(x, w.narrow(0, 0, 3))));  // nor does the size
  REQUIRE_FALSE(took_onednn(gemm_linear(x.to(torch::kFloat64), w.to(torch::kFloat64))));
  REQUIRE_FALSE(took_onednn(gemm_linear(x.to(torch::kBFloat16), w.to(torch::kBFloat16))));
  auto empty = gemm_linear(torch::zeros({0, 512}, torch::requires_grad()), w);
  REQUIRE(empty.sizes() == torch::IntArrayRef({0, 512}));
  {
    at::autocast::set_autocast_enabled(at::kCPU, true);
    at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
    auto y = gemm_linear(x, w);
    at::autocast::set_autocast_enabled(at::kCPU, false);
    at::autocast::clear_cache();
    REQUIRE_FALSE(took_onednn(y));
    REQUIRE(y.scalar_type() == torch::kBFloat16);  // autocast's own cast, as at::linear
  }
}

TEST_CASE("cpu_gemm: MMPOST_CPU_GEMM decides auto, and a wrong value is named", "[unit][gemm]") {
  struct EnvScope {
    ~EnvScope() {
      unsetenv("MMPOST_CPU_GEMM");
      set_cpu_gemm(CpuGemm::kAuto);
    }
  } restore;
  setenv("MMPOST_CPU_GEMM", "blas", 1);
  set_cpu_gemm(CpuGemm::kAuto);
  REQUIRE(cpu_gemm() == CpuGemm::kBlas);
  setenv("MMPOST_CPU_GEMM", "mkl", 1);
  REQUIRE_THROWS_WITH(set_cpu_gemm(CpuGemm::kAuto), HasSubstr("MMPOST_CPU_GEMM: \"mkl\" is not one of"));
  if (onednn_gemm_available()) {
    setenv("MMPOST_CPU_GEMM", "onednn", 1);
    set_cpu_gemm(CpuGemm::kAuto);
    REQUIRE(cpu_gemm() == CpuGemm::kOneDnn);
  }
}

TEST_CASE("cpu_gemm: oneDNN linear inside an at::parallel_for region (train.cpu_shards) gives "
          "the values it gives outside", "[unit][gemm]") {
  if (!onednn_gemm_available()) MMPOST_SKIP("this LibTorch has no oneDNN linear operator");
  GemmScope scope(CpuGemm::kOneDnn);
  torch::manual_seed(11);
  // Shapes of the digits model (small) and of the 100M one (large, several K blocks), each run
  // forward + backward on every intra-op thread at once, as the shards do.
  const std::vector<std::array<int64_t, 3>> shapes = {{2080, 96, 384}, {2048, 128, 512},
                                                      {160, 768, 2048}, {160, 2048, 768}};
  for (const auto& [M, K, N] : shapes) {
    CAPTURE(M, K, N);
    auto x0 = torch::randn({M, K}), w0 = torch::randn({N, K}), dy = torch::randn({M, N});
    auto run = [&](torch::Tensor* y, torch::Tensor* gx, torch::Tensor* gw) {
      auto x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
      auto out = gemm_linear(x, w);
      out.backward(dy);
      *y = out.detach();
      *gx = x.grad();
      *gw = w.grad();
    };
    torch::Tensor y, gx, gw;
    run(&y, &gx, &gw);
    const int64_t n = std::max<int64_t>(2, at::get_num_threads());
    std::vector<torch::Tensor> ys(n), gxs(n), gws(n);
    const at::ThreadLocalState state;
    at::parallel_for(0, n, 1, [&](int64_t b, int64_t e) {
      at::ThreadLocalStateGuard guard(state);
      for (int64_t i = b; i < e; ++i) run(&ys[i], &gxs[i], &gws[i]);
    });
    for (int64_t i = 0; i < n; ++i) {
      // Inside the region oneDNN runs single-threaded: other blockings, float32 rounding apart.
      require_close(ys[i], y, 1e-5);
      require_close(gxs[i], gx, 1e-5);
      require_close(gws[i], gw, 1e-5);
    }
  }
}

TEST_CASE("cpu_gemm: SerialBlasScope makes MKL single-threaded on this thread, nests, restores, "
          "and changes no product", "[unit][gemm]") {
  if (!serial_blas_scope_available()) MMPOST_SKIP("this LibTorch exports no MKL thread control");
  using GetMax = int (*)();
  const auto mkl_max = reinterpret_cast<GetMax>(dlsym(RTLD_DEFAULT, "MKL_Get_Max_Threads"));
  REQUIRE(mkl_max != nullptr);
  struct Threads {  // two intra-op threads (the test binary runs with one), restored after
    int saved = at::get_num_threads();
    Threads() { at::set_num_threads(2); }
    ~Threads() { at::set_num_threads(saved); }
  } threads;
  const int before = mkl_max();
  REQUIRE(before == 2);  // at::set_num_threads sets MKL's count too
  {
    SerialBlasScope outer;
    REQUIRE(mkl_max() == 1);
    {
      SerialBlasScope inner;
      REQUIRE(mkl_max() == 1);
    }
    REQUIRE(mkl_max() == 1);  // the inner scope restored the outer one's setting, not the global
  }
  REQUIRE(mkl_max() == before);
  // Inside a parallel region (as the shards run) MKL is single-threaded either way: the scope only
  // skips its nested one-thread OpenMP team, so the products are bit for bit the same.
  torch::manual_seed(5);
  auto a = torch::randn({96, 33}), b = torch::randn({33, 384}), at_ = torch::randn({384, 96});
  const int64_t n = 2;
  std::vector<torch::Tensor> plain(n), scoped(n), plain_t(n), scoped_t(n);
  std::vector<int> in_region(n);
  at::parallel_for(0, n, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      in_region[i] = at::in_parallel_region() ? 1 : 0;
      plain[i] = at::mm(a, b);
      plain_t[i] = at::mm(at_.t(), b.t());  // transposed operands: another MKL path
      SerialBlasScope serial;
      scoped[i] = at::mm(a, b);
      scoped_t[i] = at::mm(at_.t(), b.t());
    }
  });
  for (int64_t i = 0; i < n; ++i) {
    REQUIRE(in_region[i] == 1);
    REQUIRE(torch::equal(scoped[i], plain[i]));
    REQUIRE(torch::equal(scoped_t[i], plain_t[i]));
  }
  const auto exact = at::mm(a.to(torch::kFloat64), b.to(torch::kFloat64)).to(torch::kFloat32);
  REQUIRE(torch::allclose(plain[0], exact, 1e-4, 1e-4));
}

TEST_CASE("cpu_gemm: the oneDNN linear's 3-D output can be modified in place", "[unit][gemm]") {
  if (!onednn_gemm_available()) MMPOST_SKIP("this LibTorch has no oneDNN linear operator");
  GemmScope scope(CpuGemm::kOneDnn);
  auto x = torch::ones({2, 3, 512}).requires_grad_(true);
  auto w = torch::full({512, 512}, 0.5f).requires_grad_(true);
  auto y = gemm_linear(x, w);
  REQUIRE(took_onednn(y));
  y.mul_(2);  // e.g. a residual add or an activation written in place by the caller
  y.sum().backward();
  REQUIRE(torch::equal(y.detach(), torch::full({2, 3, 512}, 512.f)));  // 2 x 512 x 0.5
  REQUIRE(torch::equal(x.grad(), torch::full({2, 3, 512}, 512.f)));    // 2 x sum_j 0.5
  REQUIRE(torch::equal(w.grad(), torch::full({512, 512}, 12.f)));      // 2 x 6 rows
}

}  // namespace unit_test_cpu_gemm
