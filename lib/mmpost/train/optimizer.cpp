// Optimizer, schedule and clipping (see optimizer.h).
#include "mmpost/train/optimizer.h"

#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>

#include "mmpost/core/check.h"
#include "mmpost/train/host_adamw.h"

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

namespace {

/// A tensor the host loops handle directly: float32, on the CPU, contiguous.
bool host_float(const torch::Tensor& t) {
  return t.device().is_cpu() && t.scalar_type() == torch::kFloat32 && t.is_contiguous();
}

}  // namespace

void adamw_step(torch::optim::AdamW& opt, bool fused, double grad_scale) {
  torch::NoGradGuard no_grad;
  if (!fused) {
    if (grad_scale != 1.0) {
      for (auto& group : opt.param_groups()) scale_grads(group.params(), grad_scale);
    }
    opt.step();
    return;
  }
  std::vector<HostAdamWTensor> host;  // float32 CPU tensors: mmpost's one-pass kernel
  for (auto& group : opt.param_groups()) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
    TORCH_CHECK(!o.amsgrad(), "adamw_step: amsgrad is not supported by the fused path");
    const auto [beta1, beta2] = o.betas();
    // Others: one ATen kernel call per (device, dtype), which the CUDA kernel needs uniform.
    struct Lists {
      std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs, steps;
    };
    std::map<std::pair<std::string, int>, Lists> calls;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      auto& slot = opt.state()[p.unsafeGetTensorImpl()];
      if (!slot) {  // lazy state, as torch::optim::AdamW::step creates it
        auto st = std::make_unique<torch::optim::AdamWParamState>();
        st->step(0);
        st->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        st->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        slot = std::move(st);
      }
      auto& st = static_cast<torch::optim::AdamWParamState&>(*slot);
      st.step(st.step() + 1);
      const auto& g = p.grad();
      if (host_float(p) && host_float(g) && host_float(st.exp_avg()) &&
          host_float(st.exp_avg_sq())) {
        host.push_back({.param = p.data_ptr<float>(), .grad = g.data_ptr<float>(),
                        .exp_avg = st.exp_avg().data_ptr<float>(),
                        .exp_avg_sq = st.exp_avg_sq().data_ptr<float>(), .numel = p.numel(),
                        .lr = o.lr(), .beta1 = beta1, .beta2 = beta2, .eps = o.eps(),
                        .weight_decay = o.weight_decay(), .step = st.step()});
        continue;
      }
      if (grad_scale != 1.0) p.grad().mul_(grad_scale);
      auto& l = calls[{p.device().str(), static_cast<int>(p.scalar_type())}];
      l.params.push_back(p);
      l.grads.push_back(p.grad());
      l.exp_avgs.push_back(st.exp_avg());
      l.exp_avg_sqs.push_back(st.exp_avg_sq());
      // The kernel reads the (already incremented) step count from a float32 scalar tensor.
      l.steps.push_back(torch::full({}, static_cast<double>(st.step()),
                                    torch::TensorOptions().dtype(torch::kFloat32).device(p.device())));
    }
    for (auto& [key, l] : calls) {
      at::_fused_adamw_(l.params, l.grads, l.exp_avgs, l.exp_avg_sqs, /*max_exp_avg_sqs=*/{},
                        l.steps, o.lr(), beta1, beta2, o.weight_decay(), o.eps(),
                        /*amsgrad=*/false, /*maximize=*/false);
    }
  }
  if (!host.empty()) host_adamw(host, grad_scale);
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

double grad_norm(const std::vector<torch::Tensor>& params) {
  // Host gradients are summed in place (one pass, no kernel launches: at ~80 small tensors the
  // per-call cost of norm, stack and mul_ was ~1 ms of a 20 ms step); others (CUDA, bf16) take
  // ATen's norms with a single device sync.
  double sq = 0.0;
  std::vector<torch::Tensor> device_norms;
  for (const auto& p : params) {
    const auto& g = p.grad();
    if (!g.defined()) continue;
    if (host_float(g)) {
      sq += host_sum_squares(g.data_ptr<float>(), g.numel());
    } else {
      device_norms.push_back(g.detach().to(torch::kFloat32).norm());
    }
  }
  if (!device_norms.empty()) sq += torch::stack(device_norms).pow(2).sum().item<double>();
  return std::sqrt(sq);
}

double clip_coefficient(double norm, double max_norm) {
  if (max_norm > 0 && std::isfinite(norm) && norm > max_norm) return max_norm / (norm + 1e-6);
  return 1.0;
}

void scale_grads(const std::vector<torch::Tensor>& params, double scale) {
  const float scale_f = static_cast<float>(scale);  // as mul_(double) on a float32 tensor
  torch::NoGradGuard ng;
  for (const auto& p : params) {
    auto g = p.grad();
    if (!g.defined()) continue;
    if (!host_float(g)) {
      g.mul_(scale);
      continue;
    }
    float* gp = g.data_ptr<float>();
    at::parallel_for(0, g.numel(), int64_t{1} << 16, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) gp[i] *= scale_f;
    });
  }
}

double clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm) {
  const double total = grad_norm(params);
  const double coef = clip_coefficient(total, max_norm);
  if (coef != 1.0) scale_grads(params, coef);
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

namespace {

/// ZeRO-1 owners: contiguous runs of the trainable tensors, balanced by element count.
std::vector<int> partition_by_numel(const std::vector<torch::Tensor>& params, int world) {
  int64_t total = 0;
  for (const auto& p : params) total += p.numel();
  std::vector<int> owner(params.size(), 0);
  int64_t before = 0;
  for (size_t k = 0; k < params.size(); ++k) {
    // The rank whose share [r*total/world, (r+1)*total/world) holds this tensor's midpoint.
    const int64_t mid = before + params[k].numel() / 2;
    owner[k] = static_cast<int>(std::min<int64_t>(world - 1, mid * world / std::max<int64_t>(1, total)));
    before += params[k].numel();
  }
  return owner;
}

torch::optim::AdamWParamState* adam_state(torch::optim::Optimizer& opt, const torch::Tensor& p) {
  auto it = opt.state().find(p.unsafeGetTensorImpl());
  return it == opt.state().end() ? nullptr
                                 : static_cast<torch::optim::AdamWParamState*>(it->second.get());
}

}  // namespace

Optimizer::Optimizer(const std::vector<std::pair<std::string, torch::Tensor>>& named,
                     const config::OptimSection& optim, const config::SchedulerSection& scheduler,
                     double clip_grad_norm, int64_t total_steps, dist::ProcessGroup* pg,
                     const config::DistSection& dist)
    : optim_(optim), scheduler_(scheduler), clip_(clip_grad_norm), total_(total_steps), pg_(pg) {
  for (const auto& [name, p] : named) {
    if (p.requires_grad()) {
      trainable_.push_back(p);
      named_trainable_.emplace_back(name, p);
    }
  }
  const AdamWOptions opts{optim.lr, optim.betas[0], optim.betas[1], optim.eps, optim.weight_decay};
  if (pg_ == nullptr || pg_->world_size() == 1) {
    adamw_ = make_adamw(named, opts);
    return;
  }
  rank_ = pg_->rank();
  {  // every rank starts from rank 0's weights (all of them, frozen parts included)
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> all;
    for (const auto& [name, p] : named) all.push_back(p.detach());
    pg_->broadcast(all, 0);
  }
  sync_ = std::make_unique<dist::GradientSync>(*pg_, trainable_, dist.bucket_mb);
  if (!dist.shard_optimizer) {
    adamw_ = make_adamw(named, opts);
    return;
  }
  owner_ = partition_by_numel(trainable_, pg_->world_size());
  std::vector<std::pair<std::string, torch::Tensor>> mine;
  for (size_t k = 0; k < trainable_.size(); ++k) {
    if (owner_[k] == rank_) mine.push_back(named_trainable_[k]);
  }
  MMPOST_CHECK_USAGE(!mine.empty(), "dist.shard_optimizer: rank ", rank_, " of ",
                     pg_->world_size(), " owns no parameter (", trainable_.size(),
                     " trainable tensors); use fewer ranks or dist.shard_optimizer=false");
  adamw_ = make_adamw(mine, opts);
}

Optimizer::~Optimizer() = default;

void Optimizer::zero_grad() {
  for (auto& p : trainable_) p.mutable_grad() = torch::Tensor();  // as torch's set_to_none
}

void Optimizer::arm_gradient_sync() {
  if (sync_) sync_->arm();
}

double Optimizer::lr_at(int64_t step) const {
  return optim_.lr * lr_multiplier(scheduler_.name, step, scheduler_.warmup_steps, total_,
                                   scheduler_.min_lr_ratio);
}

StepStats Optimizer::step(int64_t step, double loss) {
  StepStats s;
  if (sync_) {
    sync_->finish();  // every rank, before any check, so no rank is left waiting
    s.comm = sync_->take_stats();
  }
  MMPOST_CHECK(std::isfinite(loss), "step ", step + 1, ": loss is ", loss,
               "; stopping before the update so the last checkpoint stays valid",
               "\n  hint: lower optim.lr, keep train.clip_grad_norm > 0, or use dtype float32");
  // Clipping is folded into the update (adamw_step's grad_scale): no separate pass over the
  // gradients.
  s.grad_norm = grad_norm(trainable_);
  MMPOST_CHECK(std::isfinite(s.grad_norm), "step ", step + 1, ": gradient norm is ", s.grad_norm,
               "; stopping before the update so the last checkpoint stays valid",
               "\n  hint: lower optim.lr or use dtype float32");
  s.lr = lr_at(step);
  set_lr(*adamw_, s.lr);
  adamw_step(*adamw_, optim_.fused, clip_coefficient(s.grad_norm, clip_));
  if (!owner_.empty()) {  // ZeRO-1: each rank's updated share to everyone
    torch::NoGradGuard no_grad;
    for (int r = 0; r < pg_->world_size(); ++r) {
      std::vector<torch::Tensor> share;
      for (size_t k = 0; k < trainable_.size(); ++k) {
        if (owner_[k] == r) share.push_back(trainable_[k].detach());
      }
      pg_->broadcast(share, r);
    }
  }
  // Autocast (mixed_precision bf16) caches the bf16 copy of each float32 leaf weight for as long
  // as its outermost region lives, and mmpost's region is the whole run (train::Run's
  // AutocastGuard), not one forward as with Python's `with torch.autocast()`. Without this the
  // next forward would reuse the copies made before this update: the model would train on its
  // step-1 weights while the float32 masters drift. No-op when autocast is off (empty cache).
  at::autocast::clear_cache();
  return s;
}

std::shared_ptr<torch::optim::AdamW> Optimizer::checkpoint_state() {
  if (owner_.empty()) {  // a non-owning view of the live optimizer
    if (rank_ != 0) return nullptr;
    return std::shared_ptr<torch::optim::AdamW>(std::shared_ptr<void>(), adamw_.get());
  }
  // ZeRO-1: rebuild the unsharded AdamW on every rank from the owners' shards (flag, step, m, v
  // per tensor, broadcast by the owner), then rank 0 serializes it.
  const AdamWOptions opts{optim_.lr, optim_.betas[0], optim_.betas[1], optim_.eps,
                          optim_.weight_decay};
  auto full = make_adamw(named_trainable_, opts);
  set_lr(*full, static_cast<torch::optim::AdamWOptions&>(adamw_->param_groups()[0].options()).lr());
  for (int r = 0; r < pg_->world_size(); ++r) {
    std::vector<size_t> ks;
    std::vector<torch::Tensor> t;
    for (size_t k = 0; k < trainable_.size(); ++k) {
      if (owner_[k] != r) continue;
      ks.push_back(k);
      const auto& p = trainable_[k];
      auto* st = r == rank_ ? adam_state(*adamw_, p) : nullptr;
      auto head = torch::zeros({2}, torch::kFloat64);
      if (st != nullptr) {
        head[0] = 1.0;
        head[1] = static_cast<double>(st->step());
      }
      t.push_back(head.to(p.device()));
      t.push_back(st != nullptr ? st->exp_avg().clone() : torch::zeros_like(p));
      t.push_back(st != nullptr ? st->exp_avg_sq().clone() : torch::zeros_like(p));
    }
    pg_->broadcast(t, r);
    for (size_t i = 0; i < ks.size(); ++i) {
      auto head = t[3 * i].cpu();
      if (head[0].item<double>() == 0) continue;
      auto st = std::make_unique<torch::optim::AdamWParamState>();
      st->step(static_cast<int64_t>(head[1].item<double>()));
      st->exp_avg(t[3 * i + 1]);
      st->exp_avg_sq(t[3 * i + 2]);
      full->state()[trainable_[ks[i]].unsafeGetTensorImpl()] = std::move(st);
    }
  }
  if (rank_ != 0) return nullptr;
  return std::shared_ptr<torch::optim::AdamW>(std::move(full));
}

void Optimizer::load_state(const std::filesystem::path& file) {
  try {
    if (owner_.empty()) {
      torch::load(*adamw_, file.string());
      return;
    }
    const AdamWOptions opts{optim_.lr, optim_.betas[0], optim_.betas[1], optim_.eps,
                            optim_.weight_decay};
    auto full = make_adamw(named_trainable_, opts);
    torch::load(*full, file.string());
    for (size_t k = 0; k < trainable_.size(); ++k) {
      if (owner_[k] != rank_) continue;
      auto* st = adam_state(*full, trainable_[k]);
      if (st == nullptr) continue;
      adamw_->state()[trainable_[k].unsafeGetTensorImpl()] =
          std::make_unique<torch::optim::AdamWParamState>(*st);
    }
  } catch (const c10::Error& e) {
    throw Error(ErrorKind::kRuntime,
                file.string() + ": cannot restore the optimizer state: " + e.what_without_backtrace());
  }
}

uint64_t Optimizer::state_bytes_estimate() const {
  uint64_t n = 0;
  for (const auto& p : trainable_) n += 2 * p.numel() * p.element_size();
  return n;
}

dist::CommStats Optimizer::take_comm_stats() {
  return sync_ ? sync_->take_stats() : dist::CommStats{};
}

}  // namespace mmpost::train
