// Activation checkpointing as an autograd node of its own (see activation_checkpoint.h): the
// node's edges point at x and the parameters; its apply() recomputes and differentiates.
#include "mmpost/model/activation_checkpoint.h"

#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <mutex>

#include "mmpost/model/lora.h"

namespace mmpost::model {
namespace {

/// The backward of checkpointed(): inputs = {dL/dy}; outputs, one per next edge = {dL/dx,
/// dL/dparams...}.
struct CheckpointBackward : torch::autograd::Node {
  std::function<torch::Tensor(const torch::Tensor&)> fn;
  torch::Tensor x;  // detached input
  bool x_requires_grad = false;
  std::vector<torch::Tensor> params;
  // Autocast as it was during the forward, for every device type that had it on.
  std::vector<std::pair<at::DeviceType, at::ScalarType>> autocast;
  // The input device's default generator as it was before the forward, so that the recompute
  // draws the same dropout masks (LoRA dropout), as torch.utils.checkpoint's preserve_rng_state.
  at::Generator generator;
  torch::Tensor rng_state;

  std::string name() const override { return "mmpost::CheckpointBackward"; }

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    TORCH_CHECK(x.defined(), "checkpointed: backward through the same layer output twice");
    torch::AutoGradMode grad_on(true);
    std::vector<std::pair<at::DeviceType, std::pair<bool, at::ScalarType>>> before;
    for (auto [dev, dtype] : autocast) {
      before.push_back({dev, {at::autocast::is_autocast_enabled(dev),
                              at::autocast::get_autocast_dtype(dev)}});
      at::autocast::set_autocast_enabled(dev, true);
      at::autocast::set_autocast_dtype(dev, dtype);
    }
    if (!autocast.empty()) at::autocast::increment_nesting();
    auto input = x.detach().requires_grad_(x_requires_grad);
    torch::Tensor now;
    {  // the lock guards get/set only: fn's own draws take it
      std::lock_guard<std::mutex> lock(generator.mutex());
      now = generator.get_state();
      generator.set_state(rng_state);
    }
    torch::Tensor y = fn(input);
    {
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_state(now);
    }
    if (!autocast.empty() && at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    for (auto& [dev, st] : before) {
      at::autocast::set_autocast_enabled(dev, st.first);
      at::autocast::set_autocast_dtype(dev, st.second);
    }
    std::vector<torch::Tensor> wrt;
    if (x_requires_grad) wrt.push_back(input);
    for (const auto& p : params) wrt.push_back(p);
    torch::Tensor g = grads[0].defined() ? grads[0] : torch::zeros_like(y);
    auto dw = torch::autograd::grad({y}, wrt, {g}, /*retain_graph=*/false,
                                    /*create_graph=*/false, /*allow_unused=*/true);
    torch::autograd::variable_list out;
    size_t k = 0;
    out.push_back(x_requires_grad ? dw[k++] : torch::Tensor());
    for (size_t i = 0; i < params.size(); ++i) out.push_back(dw[k++]);
    x = torch::Tensor();  // the saved input is freed once used
    return out;
  }
};

}  // namespace

std::vector<torch::Tensor> trainable_parameters(const torch::nn::Module& m) {
  std::vector<torch::Tensor> out;
  for (const auto& p : m.parameters(/*recurse=*/true)) {
    if (p.requires_grad()) out.push_back(p);
  }
  // LoRA adapter tensors are not registered parameters (see lora.h) but are trained.
  for (const auto& sub : m.modules(/*include_self=*/false)) {
    if (const auto* l = dynamic_cast<const LoraLinearImpl*>(sub.get())) {
      for (const auto* t : {&l->lora_A, &l->lora_B}) {
        if (t->defined() && t->requires_grad()) out.push_back(*t);
      }
    }
  }
  return out;
}

torch::Tensor checkpointed(const std::function<torch::Tensor(const torch::Tensor&)>& fn,
                           const torch::Tensor& x, const std::vector<torch::Tensor>& params) {
  const bool needs = torch::GradMode::is_enabled() &&
                     (x.requires_grad() || !params.empty());
  if (!needs) return fn(x);
  auto node = c10::make_intrusive<CheckpointBackward>();
  node->generator = at::globalContext().defaultGenerator(x.device());
  {
    std::lock_guard<std::mutex> lock(node->generator.mutex());
    node->rng_state = node->generator.get_state();
  }
  torch::Tensor y;
  {
    torch::NoGradGuard no_grad;
    y = fn(x);
  }
  node->fn = fn;
  node->x = x.detach();
  node->x_requires_grad = x.requires_grad();
  node->params = params;
  for (auto dev : {at::kCPU, at::kCUDA}) {
    if (at::autocast::is_autocast_enabled(dev)) {
      node->autocast.emplace_back(dev, at::autocast::get_autocast_dtype(dev));
    }
  }
  std::vector<torch::Tensor> edges_of{x};
  edges_of.insert(edges_of.end(), params.begin(), params.end());
  node->set_next_edges(torch::autograd::collect_next_edges(edges_of));
  torch::autograd::set_history(y, node);
  return y;
}

}  // namespace mmpost::model
