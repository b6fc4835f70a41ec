// AdamW with two parameter groups (decay / no decay), learning-rate schedules with linear warmup
// (the formulas of transformers' get_{cosine,linear,constant}_schedule_with_warmup), and global
// gradient-norm clipping.
#pragma once

#include <torch/torch.h>

#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mmpost/config/recipe.h"
#include "mmpost/dist/gradient_sync.h"
#include "mmpost/dist/process_group.h"

namespace mmpost::train {

/// AdamW hyper-parameters.
struct AdamWOptions {
  double lr = 1e-4;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

/// Builds torch::optim::AdamW over the trainable (requires_grad) parameters of `named`: weight
/// decay on tensors with dim >= 2 (matrices, embeddings, conv kernels), none on biases, norm
/// weights and 1-d embeddings (class token) — the GPT/LLaVA convention.
std::unique_ptr<torch::optim::AdamW> make_adamw(
    const std::vector<std::pair<std::string, torch::Tensor>>& named, const AdamWOptions& opts);

/// One AdamW update of every parameter of `opt` that has a gradient, with the options of its
/// group, each gradient multiplied by `grad_scale` first (the clipping coefficient; 1 = none).
/// fused = true: float32 CPU tensors through host_adamw (one pass over param, grad, exp_avg and
/// exp_avg_sq per element, the scale applied as the gradient is read, so `.grad` is left
/// unscaled), other tensors (CUDA, bf16) through ATen's `_fused_adamw_` (the kernel behind
/// torch.optim.AdamW(fused=True)) after an in-place grad.mul_(grad_scale), one call per (group,
/// device, dtype); fused = false: grads scaled in place, then torch::optim::AdamW::step (per-tensor
/// ops). All keep their state in `opt.state()` (AdamWParamState: int step, exp_avg, exp_avg_sq),
/// so checkpoints are the same file either way and a run may switch between them on resume.
/// Updates agree to float rounding (the same formula, Loshchilov & Hutter 2019 Alg. 2, evaluated
/// in another order). amsgrad is not supported (mmpost never sets it).
void adamw_step(torch::optim::AdamW& opt, bool fused, double grad_scale = 1.0);

/// Sets the learning rate of every parameter group.
void set_lr(torch::optim::Optimizer& opt, double lr);

/// Learning-rate multiplier in [0, 1] at optimizer step `step` (0-based) of `total` steps:
/// step < warmup: step / warmup; then cosine: min + (1 - min) * 0.5 * (1 + cos(pi * progress)),
/// linear: min + (1 - min) * (1 - progress), constant: 1; progress = (step - warmup) / (total -
/// warmup). Matches transformers' schedules with min_lr_ratio = 0. Throws Error(kUsage) on an
/// unknown name.
double lr_multiplier(const std::string& schedule, int64_t step, int64_t warmup, int64_t total,
                     double min_lr_ratio);

/// Global L2 norm of the gradients of `params` (0 when none has a gradient): float32 CPU
/// gradients summed in double on the host (host_sum_squares), others through ATen's float32 norms
/// (one device sync).
double grad_norm(const std::vector<torch::Tensor>& params);

/// The factor torch.nn.utils.clip_grad_norm_ scales gradients by: max_norm / (norm + 1e-6) when
/// max_norm > 0 and a finite norm exceeds it, else 1.
double clip_coefficient(double norm, double max_norm);

/// Multiplies every defined gradient of `params` by `scale` in place (float32 CPU gradients by
/// float(scale), as mul_ does).
void scale_grads(const std::vector<torch::Tensor>& params, double scale);

/// grad_norm, then scale_grads by clip_coefficient(norm, max_norm) when that is not 1
/// (torch.nn.utils.clip_grad_norm_ semantics). Returns the norm before clipping.
double clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm);

/// L2 norm of the gradients of the parameters whose name starts with `prefix`.
double grad_norm_of(const std::vector<std::pair<std::string, torch::Tensor>>& named,
                    const std::string& prefix);

/// (name, parameter) of every parameter of `m` (recursively), in registration order.
std::vector<std::pair<std::string, torch::Tensor>> named_parameters_of(torch::nn::Module& m);

/// What one optimizer step did.
struct StepStats {
  double grad_norm = 0;  // global L2 norm before clipping
  double lr = 0;
  dist::CommStats comm;  // gradient all-reduce of this step (zeros for one process)
};

/// The one optimizer step every stage takes after its backward passes (AdamW over the trainable
/// parameters, the recipe's schedule and clipping), and, in a multi-process run, the one place
/// where data parallelism happens: parameters are broadcast from rank 0 at construction, gradients
/// are summed over ranks (dist::GradientSync, overlapped with the last backward when armed) before
/// the norm, and with dist.shard_optimizer (ZeRO-1, Rajbhandari et al. 2020, arXiv:1910.02054,
/// stage P_os) each rank keeps the AdamW state of its own share of the parameters, updates that
/// share and broadcasts it. Stages normalise their losses by the global count of the step's
/// tokens or samples (over all ranks), so the summed gradient equals one process's gradient on
/// the union of the ranks' batches.
class Optimizer {
 public:
  /// AdamW (make_adamw) over the trainable tensors of `named`. `pg` (nullptr for one process)
  /// turns on data parallelism with the settings of `dist`. Throws Error(kUsage) when no tensor
  /// is trainable; dist::DistError when a peer fails during the initial broadcast.
  Optimizer(const std::vector<std::pair<std::string, torch::Tensor>>& named,
            const config::OptimSection& optim, const config::SchedulerSection& scheduler,
            double clip_grad_norm, int64_t total_steps, dist::ProcessGroup* pg = nullptr,
            const config::DistSection& dist = {});
  ~Optimizer();

  void zero_grad();
  /// Call before the backward of the step's last micro-batch: gradient buckets are then
  /// all-reduced while that backward runs. Optional (step() reduces what was not launched).
  void arm_gradient_sync();
  /// Scheduled learning rate at 0-based optimizer step `step`.
  double lr_at(int64_t step) const;
  /// Takes optimizer step `step` (0-based): sums gradients over ranks (multi-process), refuses a
  /// non-finite `loss` (pass 0 when the stage has none; in a multi-process run pass the global
  /// loss so every rank decides alike) or gradient norm with Error(kRuntime) naming step + 1
  /// before anything changes, so the last checkpoint stays valid; sets the scheduled lr; steps
  /// AdamW with the clipping coefficient folded into the update (adamw_step's grad_scale: the
  /// gradients are not scaled in place on the host) (its shard under ZeRO-1, then every rank's
  /// share is broadcast from its owner); then drops autocast's cached bf16 weight copies, so the
  /// next forward under mixed precision casts the updated weights.
  StepStats step(int64_t step, double loss);

  /// The AdamW a checkpoint's optimizer.pt holds (torch::save of an AdamW over all trainable
  /// tensors: the same file whether or not it was sharded, so a checkpoint resumes on any world
  /// size): the live optimizer itself, no copy, or under ZeRO-1 an unsharded rebuild on rank 0.
  /// Collective under ZeRO-1 (every rank must call it, before anything that can fail on one rank
  /// only; the shards are gathered); null on ranks other than 0 then.
  std::shared_ptr<torch::optim::AdamW> checkpoint_state();
  /// Restores a file written from checkpoint_state(): each rank keeps its own shard under ZeRO-1.
  /// Throws Error(kRuntime) naming the file.
  void load_state(const std::filesystem::path& file);
  /// Bytes of the full AdamW state (two moments per trainable element).
  uint64_t state_bytes_estimate() const;
  /// Communication since the last call (zero for one process).
  dist::CommStats take_comm_stats();

  const std::vector<torch::Tensor>& trainable() const { return trainable_; }
  /// True when this rank owns trainable tensor `k`'s AdamW state (always without ZeRO-1).
  bool owns(size_t k) const { return owner_.empty() || owner_[k] == rank_; }

 private:
  std::vector<std::pair<std::string, torch::Tensor>> named_trainable_;
  std::unique_ptr<torch::optim::AdamW> adamw_;  // this rank's share under ZeRO-1
  std::vector<torch::Tensor> trainable_;
  std::vector<int> owner_;  // ZeRO-1: rank owning each trainable tensor (empty: unsharded)
  int rank_ = 0;
  config::OptimSection optim_;
  config::SchedulerSection scheduler_;
  double clip_;
  int64_t total_;
  dist::ProcessGroup* pg_ = nullptr;
  std::unique_ptr<dist::GradientSync> sync_;
};

}  // namespace mmpost::train
