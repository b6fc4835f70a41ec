// AdamW with two parameter groups (decay / no decay), learning-rate schedules with linear warmup
// (the formulas of transformers' get_{cosine,linear,constant}_schedule_with_warmup), and global
// gradient-norm clipping.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mmpost/config/recipe.h"

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

/// Sets the learning rate of every parameter group.
void set_lr(torch::optim::Optimizer& opt, double lr);

/// Learning-rate multiplier in [0, 1] at optimizer step `step` (0-based) of `total` steps:
/// step < warmup: step / warmup; then cosine: min + (1 - min) * 0.5 * (1 + cos(pi * progress)),
/// linear: min + (1 - min) * (1 - progress), constant: 1; progress = (step - warmup) / (total -
/// warmup). Matches transformers' schedules with min_lr_ratio = 0. Throws Error(kUsage) on an
/// unknown name.
double lr_multiplier(const std::string& schedule, int64_t step, int64_t warmup, int64_t total,
                     double min_lr_ratio);

/// Global L2 norm of the gradients of `params` (float32, 0 when no grads); if max_norm > 0, scales
/// the gradients so the norm is at most max_norm (torch.nn.utils.clip_grad_norm_ semantics).
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
};

/// The one optimizer step every stage takes after its backward passes (AdamW over the trainable
/// parameters, the recipe's schedule and clipping). The future distributed gradient all-reduce
/// belongs in step(), before the norm.
class Optimizer {
 public:
  /// AdamW (make_adamw) over the trainable tensors of `named`. Throws Error(kUsage) when none is
  /// trainable.
  Optimizer(const std::vector<std::pair<std::string, torch::Tensor>>& named,
            const config::OptimSection& optim, const config::SchedulerSection& scheduler,
            double clip_grad_norm, int64_t total_steps);
  void zero_grad() { adamw_->zero_grad(); }
  /// Scheduled learning rate at 0-based optimizer step `step`.
  double lr_at(int64_t step) const;
  /// Takes optimizer step `step` (0-based): refuses a non-finite `loss` (pass 0 when the stage has
  /// none) or gradient norm with Error(kRuntime) naming step + 1 before anything changes, so the
  /// last checkpoint stays valid; clips; sets the scheduled lr; steps AdamW.
  StepStats step(int64_t step, double loss);
  torch::optim::AdamW& adamw() { return *adamw_; }
  const std::vector<torch::Tensor>& trainable() const { return trainable_; }

 private:
  std::unique_ptr<torch::optim::AdamW> adamw_;
  std::vector<torch::Tensor> trainable_;
  config::OptimSection optim_;
  config::SchedulerSection scheduler_;
  double clip_;
  int64_t total_;
};

}  // namespace mmpost::train
