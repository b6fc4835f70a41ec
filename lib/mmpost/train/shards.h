// CPU shards (train.cpu_shards): a micro-batch split by rows into n shards whose forward and
// backward passes run at the same time, one per intra-op thread, each single-threaded inside.
// Small models on few cores spend much of a step in GEMMs and element-wise kernels too small to
// split well over threads (and in the serial glue between them); n independent single-threaded
// passes keep every core busy instead. The gradient is the sum of the shards' gradients, added
// in shard order, so it equals the unsharded micro-batch's up to rounding (the loss of each row
// is normalized by the step's global count, as with gradient accumulation) and does not depend on
// thread timing: a sharded run is reproducible bit for bit.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

namespace mmpost::train {

/// Resolves train.cpu_shards for a run. `requested`: 0 auto, 1 off, N > 1 shards. `blocker` is
/// why this run cannot shard (empty when it can: see shard_blocker). Auto gives
/// min(intra-op threads, 8) on a CPU device when nothing blocks it and the extra gradient buffers
/// ((n - 1) x `trainable_bytes`) stay within 256 MiB; else 1. Throws Error(kUsage) naming
/// train.cpu_shards when N > 1 is asked for on a non-CPU device or while `blocker` is set.
int64_t resolve_cpu_shards(int64_t requested, const torch::Device& device,
                           int64_t trainable_bytes, const std::string& blocker);

/// Why a run cannot shard, or "" when it can: dropout (its random masks would depend on which
/// thread draws them), a compute dtype other than float32 (oneDNN's reduced-precision kernels are
/// not safe inside another parallel region), or several processes (the gradient all-reduce hooks
/// fire per backward pass). `dropout` is the largest dropout probability of the trained model.
std::string shard_blocker(double dropout, torch::Dtype compute_dtype, bool mixed_precision,
                          int64_t world_size);

/// Shard s of n over `rows` rows: [begin, end), contiguous, sizes differing by at most one (the
/// first rows % n shards one larger). Throws Error(kRuntime) unless 0 <= s < n <= rows.
std::pair<int64_t, int64_t> shard_range(int64_t rows, int64_t n, int64_t s);

/// Runs fn(0) ... fn(n - 1) at once, one per intra-op thread (at::parallel_for; with fewer
/// threads some run after others), each under the caller's thread-local state (grad mode,
/// autocast). Every shard runs even when another throws; then the lowest throwing shard's
/// exception is rethrown.
void run_concurrently(int64_t n, const std::function<void(int64_t)>& fn);

/// Forward and backward of n shards at once (run_concurrently): `loss_of(s)` builds shard s's
/// 0-d loss (already normalized by the step's global count); its gradient w.r.t. `params` is
/// accumulated into their .grad. Shard 0 backpropagates straight into .grad, shards 1..n-1
/// through torch::autograd::grad into buffers of their own (the (n - 1) x parameter-size extra
/// memory), added afterwards in shard order: the gradient of the summed loss, independent of
/// thread timing. Returns the detached losses [n] (float64, on the CPU). Rethrows as
/// run_concurrently.
torch::Tensor backward_shards(int64_t n, const std::function<torch::Tensor(int64_t)>& loss_of,
                              const std::vector<torch::Tensor>& params);

}  // namespace mmpost::train
