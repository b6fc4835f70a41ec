// GEMM library choice for float32 CPU linear layers (see cpu_gemm.h).
#include "mmpost/core/cpu_gemm.h"

#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <dlfcn.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace mmpost {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

/// mkldnn::_linear_pointwise(Tensor X, Tensor W, Tensor? B, str attr, Scalar?[] scalars,
/// str? algorithm) -> Tensor: Y = X W^T + B through oneDNN's inner-product primitive (primitive
/// cache inside ideep), dense strided tensors in and out. nullptr when LibTorch lacks it.
const c10::OperatorHandle* linear_op() {
  static const std::optional<c10::OperatorHandle> op = []() -> std::optional<c10::OperatorHandle> {
    if (!at::hasMKLDNN()) return std::nullopt;
    auto h = c10::Dispatcher::singleton().findOp({"mkldnn::_linear_pointwise", ""});
    if (!h || !h->hasKernelForDispatchKey(c10::DispatchKey::CPU)) return std::nullopt;
    return h;
  }();
  return op ? &*op : nullptr;
}

/// x [M, K] @ w^T with w [N, K] (either may be a transposed view) + b [N] -> [M, N] float32.
torch::Tensor onednn_mm(const torch::Tensor& x, const torch::Tensor& w,
                        const std::optional<torch::Tensor>& b = std::nullopt) {
  torch::jit::Stack s;
  s.reserve(6);
  s.emplace_back(x);
  s.emplace_back(w);
  s.emplace_back(b ? c10::IValue(*b) : c10::IValue());
  s.emplace_back(std::string("none"));
  s.emplace_back(c10::List<std::optional<at::Scalar>>());
  s.emplace_back(c10::IValue());
  linear_op()->callBoxed(&s);
  return s.front().toTensor();
}

/// The oneDNN linear with its backward: dX = dY W in oneDNN; dW = dY^T X in at::mm (a product
/// that reduces over the token rows: oneDNN's inner product takes it 0.6-0.9x as fast as MKL on
/// AMD EPYC, oneDNN's own gradient-of-weights primitive too, see BENCHMARKS.md section 3);
/// db = sum over rows of dY. x2d [M, K] contiguous in, [M, N] out: the callers reshape outside
/// the Function, so its output is no view (autograd refuses in-place edits of a view made inside
/// a custom Function, and callers edit layer outputs in place).
struct OneDnnLinear : public torch::autograd::Function<OneDnnLinear> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x2d,
                               const torch::Tensor& weight,
                               const std::optional<torch::Tensor>& bias) {
    auto y = onednn_mm(x2d, weight, bias);
    ctx->save_for_backward({x2d, weight});
    ctx->saved_data["has_bias"] = bias.has_value();
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const auto saved = ctx->get_saved_variables();
    const auto& x2d = saved[0];
    const auto& weight = saved[1];
    auto dy = grad_out[0].contiguous();
    torch::Tensor dx, dw, db;
    if (ctx->needs_input_grad(0)) dx = onednn_mm(dy, weight.t());
    if (ctx->needs_input_grad(1)) dw = at::mm(dy.t(), x2d);
    // An absent bias is not an autograd input (no edge), so needs_input_grad(2) must not be asked.
    if (ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(2)) db = dy.sum(0);
    return {dx, dw, db};
  }
};

bool takes_onednn(const torch::Tensor& x, const torch::Tensor& w,
                  const std::optional<torch::Tensor>& b) {
  auto plain_f32 = [](const torch::Tensor& t) {
    return t.device().is_cpu() && t.scalar_type() == torch::kFloat32 && t.layout() == torch::kStrided;
  };
  if (!plain_f32(x) || !plain_f32(w) || (b && b->defined() && !plain_f32(*b))) return false;
  if (x.dim() < 1 || w.dim() != 2 || x.numel() == 0 || w.numel() == 0) return false;
  if (at::autocast::is_autocast_enabled(at::kCPU)) return false;  // autocast: at::linear casts
  return cpu_gemm() == CpuGemm::kOneDnn;
}

CpuGemm resolve_auto() {
  if (const char* env = std::getenv("MMPOST_CPU_GEMM"); env != nullptr && *env != '\0') {
    CpuGemm g;
    try {
      g = parse_cpu_gemm(env);
    } catch (const std::invalid_argument&) {
      throw std::invalid_argument(std::string("MMPOST_CPU_GEMM: \"") + env +
                                  "\" is not one of auto, blas, onednn");
    }
    if (g == CpuGemm::kOneDnn && !onednn_gemm_available()) {
      throw std::runtime_error("MMPOST_CPU_GEMM=onednn: this LibTorch has no oneDNN linear operator");
    }
    if (g != CpuGemm::kAuto) return g;
  }
  if (!onednn_gemm_available()) return CpuGemm::kBlas;
  const std::string v = cpu_vendor();
  return !v.empty() && v != "GenuineIntel" ? CpuGemm::kOneDnn : CpuGemm::kBlas;
}

/// oneMKL's `int MKL_Set_Num_Threads_Local(int nt)` (mkl_service.h; mkl_set_num_threads_local
/// is the macro users write): sets the calling thread's MKL thread count, returns the previous
/// one (0 = none, the global count applied); nt = 0 drops the thread's own setting. The
/// lower-case symbol of the same name in LibTorch is the Fortran entry (takes int*), not this.
using MklSetNumThreadsLocal = int (*)(int);

MklSetNumThreadsLocal mkl_set_local() {
  static const auto fn =
      reinterpret_cast<MklSetNumThreadsLocal>(dlsym(RTLD_DEFAULT, "MKL_Set_Num_Threads_Local"));
  return fn;
}

std::atomic<int> g_choice{static_cast<int>(CpuGemm::kAuto)};

}  // namespace

CpuGemm parse_cpu_gemm(const std::string& name) {
  if (name == "auto") return CpuGemm::kAuto;
  if (name == "blas") return CpuGemm::kBlas;
  if (name == "onednn") return CpuGemm::kOneDnn;
  throw std::invalid_argument("cpu_gemm: \"" + name + "\" is not one of auto, blas, onednn");
}

std::string cpu_gemm_name(CpuGemm g) {
  switch (g) {
    case CpuGemm::kBlas: return "blas";
    case CpuGemm::kOneDnn: return "onednn";
    default: return "auto";
  }
}

SerialBlasScope::SerialBlasScope() {
  if (auto fn = mkl_set_local()) previous_ = fn(1);
}

SerialBlasScope::~SerialBlasScope() {
  if (auto fn = mkl_set_local()) fn(previous_);
}

bool serial_blas_scope_available() { return mkl_set_local() != nullptr; }

bool onednn_gemm_available() { return linear_op() != nullptr; }

std::string cpu_vendor() {
#if defined(__x86_64__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(0, &a, &b, &c, &d) == 0) return "";
  char v[13];
  std::memcpy(v, &b, 4);
  std::memcpy(v + 4, &d, 4);
  std::memcpy(v + 8, &c, 4);
  v[12] = '\0';
  return v;
#else
  return "";
#endif
}

void set_cpu_gemm(CpuGemm g) {
  if (g == CpuGemm::kOneDnn && !onednn_gemm_available()) {
    throw std::runtime_error(
        "cpu_gemm: \"onednn\" needs LibTorch's oneDNN linear operator (mkldnn::_linear_pointwise), "
        "which this LibTorch build lacks; use \"blas\" or \"auto\"");
  }
  g_choice.store(static_cast<int>(g == CpuGemm::kAuto ? resolve_auto() : g));
}

CpuGemm cpu_gemm() {
  int c = g_choice.load(std::memory_order_relaxed);
  if (c == static_cast<int>(CpuGemm::kAuto)) {
    c = static_cast<int>(resolve_auto());
    g_choice.store(c);
  }
  return static_cast<CpuGemm>(c);
}

torch::Tensor gemm_mm(const torch::Tensor& a, const torch::Tensor& b) {
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0),
              "gemm_mm: expected [M, K] @ [K, N], got ", a.sizes(), " and ", b.sizes());
  if (!a.is_contiguous() || !takes_onednn(a, b, std::nullopt)) return at::mm(a, b);
  return onednn_mm(a, b.t());
}

torch::Tensor gemm_linear(const torch::Tensor& x, const torch::Tensor& weight,
                          const std::optional<torch::Tensor>& bias) {
  if (!takes_onednn(x, weight, bias)) return at::linear(x, weight, bias);
  TORCH_CHECK(x.size(-1) == weight.size(1), "gemm_linear: input ", x.sizes(),
              " does not match weight ", weight.sizes(), " (last dimension vs in_features)");
  const bool has_bias = bias && bias->defined();
  const bool grad = torch::GradMode::is_enabled() &&
                    (x.requires_grad() || weight.requires_grad() || (has_bias && bias->requires_grad()));
  auto out_sizes = x.sizes().vec();
  out_sizes.back() = weight.size(0);
  auto x2d = x.reshape({-1, x.size(-1)}).contiguous();
  auto y = grad ? OneDnnLinear::apply(x2d, weight, has_bias ? bias : std::nullopt)
                : onednn_mm(x2d, weight, has_bias ? bias : std::nullopt);
  return x.dim() == 2 ? y : y.view(out_sizes);
}

}  // namespace mmpost
