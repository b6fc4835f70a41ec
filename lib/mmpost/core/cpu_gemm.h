// Which library runs the float32 CPU matrix products of the model's linear layers.
//
// LibTorch's CPU wheel has two GEMM libraries inside it: BLAS (Intel MKL), which at::linear /
// at::mm call for exact float32, and oneDNN, which it uses for convolutions, for reduced-precision
// matmuls and for Inductor's CPU linear kernels. MKL picks its kernels by CPU vendor: on AMD
// EPYC with AVX-512 it takes its AVX2 ("zen") sgemm, while oneDNN picks by instruction set and
// runs its AVX-512 kernels there (scripts/bench/gemm_peak.py measures both paths side by side;
// BENCHMARKS.md section 3). Both compute exact float32 products (no bf16/tf32 down-conversion);
// their results differ only by summation order (float32 rounding). Every size takes the chosen
// library, whatever the row count, so a row's products never switch library with its batch:
// on AMD EPYC oneDNN's rows round alike alone and in any batch of two or more rows (DPO's
// precomputed reference log-probs then equal the training forward's exactly), where MKL's
// small-row kernels there round differently from its large-row ones. A decode step's small
// products pay oneDNN's per-call cost (~10 us, its primitive-cache lookup) for that.
//
// The oneDNN path reaches oneDNN through a LibTorch operator registered in its dispatcher
// (mkldnn::_linear_pointwise, the dense-in dense-out inner-product kernel Inductor's CPU backend
// calls), looked up by name at run time: no oneDNN symbols are linked, and a LibTorch without
// the operator (or without oneDNN) falls back to BLAS.
#pragma once

#include <torch/torch.h>

#include <optional>
#include <string>

namespace mmpost {

/// The GEMM library for float32 CPU linear layers. kAuto resolves, once per process, to the
/// environment's MMPOST_CPU_GEMM (blas | onednn) when set (so commands without a recipe, such as
/// generate, eval and inspect, can be told), else to kOneDnn on x86-64 CPUs whose vendor is not
/// Intel (where MKL does not take its AVX-512 kernels) when the oneDNN operator is available,
/// and to kBlas otherwise.
enum class CpuGemm { kAuto, kBlas, kOneDnn };

/// "auto" | "blas" | "onednn" -> CpuGemm; throws std::invalid_argument naming the value.
CpuGemm parse_cpu_gemm(const std::string& name);
/// kBlas -> "blas", kOneDnn -> "onednn", kAuto -> "auto".
std::string cpu_gemm_name(CpuGemm g);

/// Sets the process-wide choice (all threads; call before training, not during a forward).
/// kOneDnn when the operator is missing throws std::runtime_error; kAuto with a MMPOST_CPU_GEMM
/// that is not auto/blas/onednn throws std::invalid_argument naming it.
void set_cpu_gemm(CpuGemm g);
/// The process-wide choice, resolved (never kAuto).
CpuGemm cpu_gemm();
/// Whether LibTorch has the oneDNN linear operator (mkldnn::_linear_pointwise) and oneDNN.
bool onednn_gemm_available();
/// The CPU vendor string from cpuid ("GenuineIntel", "AuthenticAMD", ...; "" off x86-64).
std::string cpu_vendor();

/// While alive, Intel MKL runs single-threaded on the calling thread, without opening an OpenMP
/// region of its own (oneMKL's documented mkl_set_num_threads_local, C name
/// MKL_Set_Num_Threads_Local, found at run time in the loaded LibTorch; a no-op where LibTorch has
/// no MKL). For code that already runs one task per thread inside a parallel region
/// (train.cpu_shards): there MKL otherwise opens a nested one-thread OpenMP team per call, and
/// libgomp ends each team's barrier with a futex wake system call, thousands per digits step
/// (ATen's flash attention calls MKL per block). The destructor restores the thread's previous
/// setting. Results are bit-identical (the same sequential kernels run either way). Never throws.
class SerialBlasScope {
 public:
  SerialBlasScope();
  ~SerialBlasScope();
  SerialBlasScope(const SerialBlasScope&) = delete;
  SerialBlasScope& operator=(const SerialBlasScope&) = delete;

 private:
  int previous_ = 0;  // the thread's local MKL thread count before (0: the global one applied)
};

/// Whether SerialBlasScope can act (LibTorch exports MKL's thread-local setting). Never throws.
bool serial_blas_scope_available();

/// nn.Linear (named apart from at::linear, which argument-dependent lookup would also find):
/// y = x W^T + b. x [..., in], weight [out, in], bias [out] or none -> [..., out].
/// On CPU with float32 x, weight and bias, outside autocast, and cpu_gemm() == kOneDnn, the
/// forward and dX = dY W run in oneDNN, dW = dY^T X in at::mm (BLAS is faster at products that
/// reduce over the token rows), db = sum of dY over rows; otherwise at::linear (PyTorch's
/// nn.Linear: one addmm with the bias). Gradients flow to every input that requires them.
/// Throws c10::Error naming both shapes when x's last dimension is not weight's second (as
/// at::linear does; oneDNN's own message would not say which shapes).
torch::Tensor gemm_linear(const torch::Tensor& x, const torch::Tensor& weight,
                          const std::optional<torch::Tensor>& bias = std::nullopt);

/// a [M, K] @ b [K, N] -> [M, N]; no autograd (for backward passes written by hand). oneDNN
/// under the same conditions as gemm_linear when a is row-major contiguous (b may be a transposed
/// view), else at::mm (a transposed a reduces over token rows: BLAS is faster there). Throws
/// c10::Error naming the shapes when an operand is not 2-D or the inner sizes differ.
torch::Tensor gemm_mm(const torch::Tensor& a, const torch::Tensor& b);

}  // namespace mmpost
