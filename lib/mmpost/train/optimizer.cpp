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

}  // namespace mmpost::train
