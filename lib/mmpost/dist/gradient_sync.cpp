// Bucketed, overlapped gradient all-reduce (see gradient_sync.h).
#include "mmpost/dist/gradient_sync.h"

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <chrono>

#include "mmpost/core/check.h"

namespace mmpost::dist {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

/// Tells the GradientSync that parameter `index` has its gradient for this backward pass.
struct ReadyHook : torch::autograd::PostAccumulateGradHook {
  ReadyHook(GradientSync* sync, size_t index) : sync(sync), index(index) {}
  void operator()(const torch::autograd::Variable&) override { sync->on_grad_ready(index); }
  GradientSync* sync;
  size_t index;
};

}  // namespace

GradientSync::GradientSync(ProcessGroup& pg, std::vector<torch::Tensor> params, double bucket_mb)
    : pg_(pg), params_(std::move(params)) {
  MMPOST_CHECK_USAGE(bucket_mb > 0, "dist.bucket_mb: must be > 0");
  const auto cap = static_cast<int64_t>(bucket_mb * 1024 * 1024);
  bucket_of_.assign(params_.size(), 0);
  // Reverse registration order: the last layers' gradients are ready first.
  std::vector<size_t> current;
  int64_t bytes = 0;
  for (size_t k = params_.size(); k-- > 0;) {
    const int64_t b = params_[k].numel() * static_cast<int64_t>(params_[k].element_size());
    if (!current.empty() && bytes + b > cap) {
      buckets_.push_back(std::move(current));
      current.clear();
      bytes = 0;
    }
    current.push_back(k);
    bytes += b;
  }
  if (!current.empty()) buckets_.push_back(std::move(current));
  for (size_t i = 0; i < buckets_.size(); ++i) {
    for (size_t k : buckets_[i]) bucket_of_[k] = i;
  }
  for (size_t k = 0; k < params_.size(); ++k) {
    torch::autograd::impl::set_post_acc_grad_hooks(params_[k],
                                                   std::make_unique<ReadyHook>(this, k));
  }
  missing_.assign(buckets_.size(), 0);
  had_grad_.assign(params_.size(), 0);
  bucket_grads_.resize(buckets_.size());
  work_.resize(buckets_.size());
}

GradientSync::~GradientSync() {
  for (auto& p : params_) torch::autograd::impl::set_post_acc_grad_hooks(p, nullptr);
}

void GradientSync::arm() {
  armed_ = true;
  next_launch_ = 0;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    missing_[i] = static_cast<int64_t>(buckets_[i].size());
  }
}

void GradientSync::on_grad_ready(size_t index) {
  if (!armed_) return;  // an accumulation micro-batch: gradients stay local
  --missing_[bucket_of_[index]];
  launch_ready_in_order();
}

void GradientSync::launch_ready_in_order() {
  while (next_launch_ < buckets_.size() && missing_[next_launch_] == 0) launch(next_launch_++);
}

void GradientSync::launch(size_t bucket) {
  auto& grads = bucket_grads_[bucket];
  grads.clear();
  for (size_t k : buckets_[bucket]) {
    auto& p = params_[k];
    had_grad_[k] = p.grad().defined() ? 1 : 0;
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
    grads.push_back(p.grad());
    stats_.bytes_reduced += p.numel() * static_cast<int64_t>(p.element_size());
  }
  work_[bucket] = pg_.all_reduce_sum_async(grads);
  ++stats_.all_reduces;
}

void GradientSync::finish() {
  const auto t0 = Clock::now();
  if (!armed_) {
    next_launch_ = 0;
  }
  while (next_launch_ < buckets_.size()) launch(next_launch_++);  // the rest, in order
  const auto tw = Clock::now();
  for (auto& w : work_) w.wait();
  // A tensor no rank had a gradient for stays without one (AdamW then skips it, as it does in
  // one process); the zeros it was reduced as are dropped.
  auto had = torch::tensor(had_grad_, torch::kInt32);
  std::vector<torch::Tensor> mask{had};
  pg_.all_reduce_sum(mask);
  stats_.wait_s += seconds_since(tw);
  auto counts = mask[0].contiguous();
  const int32_t* c = counts.data_ptr<int32_t>();
  for (size_t k = 0; k < params_.size(); ++k) {
    if (c[k] == 0) params_[k].mutable_grad() = torch::Tensor();
  }
  armed_ = false;
  stats_.total_s += seconds_since(t0);
}

CommStats GradientSync::take_stats() {
  CommStats s = stats_;
  stats_ = CommStats{};
  return s;
}

}  // namespace mmpost::dist
