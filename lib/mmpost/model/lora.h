// LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models", arXiv:2106.09685,
// eq. 3) as PEFT implements it (peft.tuners.lora.Linear): y = x W^T + b + s * dropout(x) A^T B^T
// with A [r, in] (Kaiming-uniform init, as nn.Linear), B [out, r] (zeros, so training starts at
// the base model) and s = lora_alpha / r (use_rslora: lora_alpha / sqrt(r)). The adapter tensors
// are not registered as module parameters, so the model's named parameters, its checkpoint
// names and hf_state_dict stay the base model's; LoraAdapters owns them.
#pragma once

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

namespace mmpost::model {

class VlmImpl;

/// torch::nn::Linear with an optional LoRA branch (attached by LoraAdapters). Without an adapter,
/// or with it disabled, forward is PyTorch's nn.Linear (at::linear: one addmm with the bias for
/// 2-D and contiguous 3-D inputs, as transformers runs it; LibTorch's C++ LinearImpl::forward
/// instead does matmul + a separate bias add for 3-D input).
class LoraLinearImpl : public torch::nn::LinearImpl {
 public:
  using torch::nn::LinearImpl::LinearImpl;
  /// x [..., in] -> [..., out].
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor lora_A;  // [r, in], undefined: no adapter
  torch::Tensor lora_B;  // [out, r]
  double scaling = 0;
  double dropout = 0;
  bool adapter_enabled = true;
};
TORCH_MODULE(LoraLinear);

/// The recipe's LoRA settings, in PEFT's LoraConfig names.
struct LoraSettings {
  int64_t r = 8;
  double lora_alpha = 16;
  double lora_dropout = 0;
  bool use_rslora = false;
  /// Module names as PEFT matches a list: a module is targeted when its name equals an entry or
  /// ends with "." + entry (e.g. "q_proj", "language_model.layers.0.mlp.up_proj").
  std::vector<std::string> target_modules;
  /// Or a regular expression matched against the whole module name (PEFT's string form, e.g.
  /// ".*language_model.*\\.(q_proj|v_proj)"); used when not empty.
  std::string target_regex;
};

/// The transformers (>= 4.52, 5.x) module path of a Vlm module name, the names PEFT sees and
/// writes: "language_model.model.layers.0.self_attn.q_proj" -> "model.language_model.layers.0.
/// self_attn.q_proj", "vision_tower.vision_model.encoder..." -> "model.vision_tower.encoder...",
/// "multi_modal_projector.linear_1" -> "model.multi_modal_projector.linear_1",
/// "language_model.lm_head" -> "lm_head"; Qwen2-VL family: "visual.blocks.0.attn.qkv" ->
/// "model.visual.blocks.0.attn.qkv" (Qwen2VLForConditionalGeneration's paths).
std::string transformers_module_path(const std::string& vlm_name);

/// The LoRA adapters of one model: attached to every targeted LoraLinear at construction, on the
/// weight's device, in float32 (or the weight's dtype if that is wider), trainable.
class LoraAdapters {
 public:
  /// Targets are matched against transformers_module_path names. Throws Error(kUsage) for r < 1,
  /// an invalid regex, or settings that match no linear layer (listing some of the names).
  LoraAdapters(VlmImpl& model, const LoraSettings& settings);
  ~LoraAdapters();
  LoraAdapters(const LoraAdapters&) = delete;
  LoraAdapters& operator=(const LoraAdapters&) = delete;

  /// (PEFT key, tensor) for every adapter tensor, e.g.
  /// "base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_A.weight", in model
  /// order; the tensors are the live, trainable ones.
  std::vector<std::pair<std::string, torch::Tensor>> named_parameters() const;
  /// Number of adapted linear layers.
  size_t size() const { return targets_.size(); }
  /// The settings and the matched module names (transformers paths).
  const LoraSettings& settings() const { return settings_; }
  std::vector<std::string> target_names() const;
  /// Turns every adapter off (the base model) or back on.
  void set_enabled(bool on);
  /// Copies adapter tensors in (PEFT keys as named_parameters gives them; the ".default" adapter
  /// name PEFT uses in memory is accepted too). Throws Error(kData) naming `source` for missing,
  /// unexpected or mis-shaped tensors.
  void load(const std::map<std::string, torch::Tensor>& tensors, const std::string& source);
  /// W += s * B A in every adapted layer (in float32, cast back to W's dtype), then detaches the
  /// adapters: the model is then a plain model with the adapted weights (PEFT merge_and_unload).
  void merge_and_unload();
  /// PEFT's adapter_config.json for these adapters; `base_model` is written as
  /// base_model_name_or_path, `modules_to_save` as given (transformers module names).
  nlohmann::json adapter_config(const std::string& base_model,
                                const std::vector<std::string>& modules_to_save) const;

 private:
  struct Target {
    std::string name;  // transformers module path
    LoraLinearImpl* layer;
  };
  LoraSettings settings_;
  std::vector<Target> targets_;
};

/// Turns `adapters` off while alive (nullptr: does nothing): the frozen base model serves as the
/// DPO/RLHF reference without a second copy of the weights (as TRL does with a PEFT model).
class AdaptersDisabled {
 public:
  explicit AdaptersDisabled(LoraAdapters* adapters);
  ~AdaptersDisabled();
  AdaptersDisabled(const AdaptersDisabled&) = delete;
  AdaptersDisabled& operator=(const AdaptersDisabled&) = delete;

 private:
  LoraAdapters* adapters_;
};

}  // namespace mmpost::model
