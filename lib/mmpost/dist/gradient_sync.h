// Gradient all-reduce for data-parallel training: the trainable parameters are split into buckets
// of about `bucket_mb` MiB (in reverse registration order, the order backward produces gradients,
// as DDP's bucket_cap_mb), and each bucket's gradients are summed over ranks with one asynchronous
// all-reduce. With overlap armed for a backward pass, a post-accumulate-grad hook on each parameter
// launches a bucket as soon as all of its gradients exist, while backward still runs; buckets are
// always launched in index order on every rank (a ready bucket waits for the ones before it), so
// the collectives match across ranks even when some parameters get no gradient on some rank.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "mmpost/dist/process_group.h"

namespace mmpost::dist {

/// Communication done by a GradientSync since construction (or the last take_stats()).
struct CommStats {
  int64_t all_reduces = 0;      // buckets reduced
  int64_t bytes_reduced = 0;    // gradient bytes handed to all-reduce (payload, per rank)
  double wait_s = 0;            // time spent blocked in wait() after backward finished
  double total_s = 0;           // time inside finish() (launch of the rest + waits + copies)
};

/// Sums the gradients of `params` over the ranks of `pg`, in place.
class GradientSync {
 public:
  /// params: the trainable tensors (requires_grad, one device, float dtypes), in registration
  /// order. Registers a post-accumulate-grad hook on each (removed by the destructor). Throws
  /// Error(kUsage) for bucket_mb <= 0.
  GradientSync(ProcessGroup& pg, std::vector<torch::Tensor> params, double bucket_mb);
  ~GradientSync();
  GradientSync(const GradientSync&) = delete;
  GradientSync& operator=(const GradientSync&) = delete;

  /// Arms the hooks for the next backward pass (the last micro-batch of an optimizer step): its
  /// buckets are launched while backward runs. Without it, finish() launches them all.
  void arm();
  /// Launches every bucket not launched yet (in order), waits for all, and leaves each gradient
  /// equal to the sum over ranks. A parameter without a gradient on this rank (no sample, or a
  /// part the batch did not use) is reduced as zeros, so every rank joins every collective; one
  /// without a gradient on every rank is left without one (as in a single process).
  /// Throws DistError when a peer fails or the timeout passes.
  void finish();
  /// Stats since the last call; resets them.
  CommStats take_stats();
  /// The bucket layout: parameter indices (into `params`) per bucket, launch order.
  const std::vector<std::vector<size_t>>& buckets() const { return buckets_; }

  /// Called by the hook of parameter `index` (public for the hook object only).
  void on_grad_ready(size_t index);

 private:
  void launch(size_t bucket);
  void launch_ready_in_order();

  ProcessGroup& pg_;
  std::vector<torch::Tensor> params_;
  std::vector<std::vector<size_t>> buckets_;
  std::vector<size_t> bucket_of_;              // param index -> bucket
  std::vector<int64_t> missing_;               // per bucket: grads not yet ready this pass
  std::vector<int32_t> had_grad_;              // per param: this rank had a gradient (1/0)
  std::vector<std::vector<torch::Tensor>> bucket_grads_;  // per bucket: grads handed to c10d
  std::vector<WorkHandle> work_;
  size_t next_launch_ = 0;
  bool armed_ = false;
  CommStats stats_;
};

}  // namespace mmpost::dist
