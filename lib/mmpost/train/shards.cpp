// CPU shards: see shards.h.
#include "mmpost/train/shards.h"

#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>

#include <algorithm>
#include <exception>
#include <optional>

#include "mmpost/core/check.h"
#include "mmpost/core/cpu_gemm.h"

namespace mmpost::train {

namespace {
constexpr int64_t kAutoMaxShards = 8;
constexpr int64_t kAutoExtraGradBytes = int64_t{256} << 20;  // 256 MiB of extra gradient buffers
}  // namespace

std::string shard_blocker(double dropout, torch::Dtype compute_dtype, bool mixed_precision,
                          int64_t world_size) {
  if (dropout > 0) return "dropout (lora.dropout > 0) draws its masks per thread";
  if (compute_dtype != torch::kFloat32 || mixed_precision) {
    return "it needs float32 compute (no bf16 dtype or mixed_precision)";
  }
  if (world_size > 1) return "several processes already split the batch (torchrun / srun)";
  return "";
}

int64_t resolve_cpu_shards(int64_t requested, const torch::Device& device,
                           int64_t trainable_bytes, const std::string& blocker) {
  MMPOST_CHECK_USAGE(requested >= 0, "train.cpu_shards: must be 0 (auto), 1 (off) or a count");
  if (requested == 1) return 1;
  if (requested > 1) {
    MMPOST_CHECK_USAGE(device.is_cpu(), "train.cpu_shards: ", requested,
                       " shards need the CPU device, not ", device.str(), " (set it to 0 or 1)");
    MMPOST_CHECK_USAGE(blocker.empty(), "train.cpu_shards: ", requested,
                       " shards cannot be used here: ", blocker, " (set it to 0 or 1)");
    return requested;
  }
  if (!device.is_cpu() || !blocker.empty()) return 1;
  const int64_t n = std::min<int64_t>(at::get_num_threads(), kAutoMaxShards);
  if (n < 2 || (n - 1) * trainable_bytes > kAutoExtraGradBytes) return 1;
  return n;
}

std::pair<int64_t, int64_t> shard_range(int64_t rows, int64_t n, int64_t s) {
  MMPOST_CHECK(n >= 1 && n <= rows && s >= 0 && s < n, "shard_range: shard ", s, " of ", n,
               " over ", rows, " rows");
  const int64_t base = rows / n, extra = rows % n;
  const int64_t begin = s * base + std::min(s, extra);
  return {begin, begin + base + (s < extra ? 1 : 0)};
}

void run_concurrently(int64_t n, const std::function<void(int64_t)>& fn) {
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  const at::ThreadLocalState state;  // grad mode, autocast, ... of the calling thread
  auto body = [&](int64_t begin, int64_t end) {
    at::ThreadLocalStateGuard guard(state);
    // One shard per thread, each single-threaded inside: MKL must not open nested OpenMP teams.
    std::optional<SerialBlasScope> serial_blas;
    if (n > 1) serial_blas.emplace();
    for (int64_t s = begin; s < end; ++s) {
      try {
        fn(s);
      } catch (...) {
        errors[static_cast<size_t>(s)] = std::current_exception();
      }
    }
  };
  if (n == 1) {
    body(0, 1);
  } else {
    at::parallel_for(0, n, /*grain_size=*/1, body);
  }
  for (const auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

torch::Tensor backward_shards(int64_t n, const std::function<torch::Tensor(int64_t)>& loss_of,
                              const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> losses(static_cast<size_t>(n));
  std::vector<std::vector<torch::Tensor>> grads(static_cast<size_t>(n));
  run_concurrently(n, [&](int64_t s) {
    auto loss = loss_of(s);
    losses[static_cast<size_t>(s)] = loss.detach().to(torch::kCPU, torch::kFloat64);
    if (s == 0) {
      loss.backward();
    } else {
      grads[static_cast<size_t>(s)] =
          torch::autograd::grad({loss}, params, /*grad_outputs=*/{}, /*retain_graph=*/false,
                                /*create_graph=*/false, /*allow_unused=*/true);
    }
  });
  torch::NoGradGuard no_grad;
  for (int64_t s = 1; s < n; ++s) {
    const auto& g = grads[static_cast<size_t>(s)];
    for (size_t i = 0; i < params.size(); ++i) {
      if (!g[i].defined()) continue;
      auto& grad = params[i].mutable_grad();
      if (grad.defined()) {
        grad.add_(g[i]);
      } else {
        grad = g[i];
      }
    }
    grads[static_cast<size_t>(s)].clear();  // free as soon as added
  }
  return torch::stack(losses);
}

}  // namespace mmpost::train
