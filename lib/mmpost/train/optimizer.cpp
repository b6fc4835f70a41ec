// Optimizer, schedule and clipping (see optimizer.h).
#include "mmpost/train/optimizer.h"

#include <cmath>

#include "mmpost/core/check.h"

namespace mmpost::train {

std::unique_ptr<torch::optim::AdamW> make_adamw(
    const std::vector<std::pair<std::string, torch::Tensor>>& named, const AdamWOptions& o) {
  std::vector<torch::Tensor> decay, no_decay;
  for (const auto& [name, p] : named) {
    if (!p.requires_grad()) continue;
    (p.dim() >= 2 ? decay : no_decay).push_back(p);
  }
  MMPOST_CHECK_USAGE(!decay.empty() || !no_decay.empty(),
                     "no trainable parameters (is every part in model.freeze?)");
  auto base = torch::optim::AdamWOptions(o.lr).betas({o.beta1, o.beta2}).eps(o.eps);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (!decay.empty()) {
    auto opt = std::make_unique<torch::optim::AdamWOptions>(base);
    opt->weight_decay(o.weight_decay);
    groups.emplace_back(decay, std::move(opt));
  }
  if (!no_decay.empty()) {
    auto opt = std::make_unique<torch::optim::AdamWOptions>(base);
    opt->weight_decay(0.0);
    groups.emplace_back(no_decay, std::move(opt));
  }
  return std::make_unique<torch::optim::AdamW>(groups, base);
}

void set_lr(torch::optim::Optimizer& opt, double lr) {
  for (auto& g : opt.param_groups()) {
    static_cast<torch::optim::AdamWOptions&>(g.options()).lr(lr);
  }
}

double lr_multiplier(const std::string& schedule, int64_t step, int64_t warmup, int64_t total,
                     double min_lr_ratio) {
  if (step < warmup) return static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, warmup));
  double progress = static_cast<double>(step - warmup) /
                    static_cast<double>(std::max<int64_t>(1, total - warmup));
  progress = std::min(1.0, std::max(0.0, progress));
  if (schedule == "cosine") {
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + std::cos(M_PI * progress));
  }
  if (schedule == "linear") return min_lr_ratio + (1.0 - min_lr_ratio) * (1.0 - progress);
  if (schedule == "constant") return 1.0;
  throw Error(ErrorKind::kUsage, "scheduler \"" + schedule + "\" is not valid",
              "valid values: cosine, linear, constant");
}

double clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm) {
  std::vector<torch::Tensor> norms;
  for (const auto& p : params) {
    if (p.grad().defined()) norms.push_back(p.grad().detach().to(torch::kFloat32).norm());
  }
  if (norms.empty()) return 0.0;
  double total = torch::stack(norms).norm().item<double>();
  if (max_norm > 0 && std::isfinite(total) && total > max_norm) {
    double scale = max_norm / (total + 1e-6);
    torch::NoGradGuard ng;
    for (const auto& p : params) {
      if (p.grad().defined()) p.grad().mul_(scale);
    }
  }
  return total;
}

double grad_norm_of(const std::vector<std::pair<std::string, torch::Tensor>>& named,
                    const std::string& prefix) {
  std::vector<torch::Tensor> norms;
  for (const auto& [name, p] : named) {
    if (name.rfind(prefix, 0) == 0 && p.grad().defined()) {
      norms.push_back(p.grad().detach().to(torch::kFloat32).norm());
    }
  }
  if (norms.empty()) return 0.0;
  return torch::stack(norms).norm().item<double>();
}

std::vector<std::pair<std::string, torch::Tensor>> named_parameters_of(torch::nn::Module& m) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& item : m.named_parameters(/*recurse=*/true)) {
    out.emplace_back(item.key(), item.value());
  }
  return out;
}

Optimizer::Optimizer(const std::vector<std::pair<std::string, torch::Tensor>>& named,
                     const config::OptimSection& optim, const config::SchedulerSection& scheduler,
                     double clip_grad_norm, int64_t total_steps)
    : adamw_(make_adamw(named, {optim.lr, optim.betas[0], optim.betas[1], optim.eps,
                                optim.weight_decay})),
      optim_(optim), scheduler_(scheduler), clip_(clip_grad_norm), total_(total_steps) {
  for (const auto& [name, p] : named) {
    if (p.requires_grad()) trainable_.push_back(p);
  }
}

double Optimizer::lr_at(int64_t step) const {
  return optim_.lr * lr_multiplier(scheduler_.name, step, scheduler_.warmup_steps, total_,
                                   scheduler_.min_lr_ratio);
}

StepStats Optimizer::step(int64_t step, double loss) {
  MMPOST_CHECK(std::isfinite(loss), "step ", step + 1, ": loss is ", loss,
               "; stopping before the update so the last checkpoint stays valid",
               "\n  hint: lower optim.lr, keep train.clip_grad_norm > 0, or use dtype float32");
  StepStats s;
  s.grad_norm = clip_grad_norm(trainable_, clip_);
  MMPOST_CHECK(std::isfinite(s.grad_norm), "step ", step + 1, ": gradient norm is ", s.grad_norm,
               "; stopping before the update so the last checkpoint stays valid",
               "\n  hint: lower optim.lr or use dtype float32");
  s.lr = lr_at(step);
  set_lr(*adamw_, s.lr);
  adamw_->step();
  return s;
}

}  // namespace mmpost::train
