// LoRA adapters (see lora.h).
#include "mmpost/model/lora.h"

#include <cmath>
#include <regex>
#include <set>
#include <sstream>

#include "mmpost/core/check.h"
#include "mmpost/core/cpu_gemm.h"
#include "mmpost/model/vlm.h"

namespace mmpost::model {
namespace {

const std::string kPrefix = "base_model.model.";

}  // namespace

torch::Tensor LoraLinearImpl::forward(const torch::Tensor& x) {
  auto y = mmpost::gemm_linear(x, weight, bias.defined() ? std::optional<torch::Tensor>(bias) : std::nullopt);
  if (!lora_A.defined() || !adapter_enabled) return y;
  // The adapter runs in its own dtype (float32 over a bfloat16 base) and its output is cast to
  // the base output's, as PEFT does; under autocast the two small matmuls run in the autocast
  // dtype.
  auto h = x.to(lora_A.scalar_type());
  if (dropout > 0) h = torch::dropout(h, dropout, is_training());
  auto delta = mmpost::gemm_linear(mmpost::gemm_linear(h, lora_A), lora_B);
  return y + (delta * scaling).to(y.scalar_type());
}

std::string transformers_module_path(const std::string& n) {
  if (n.starts_with("language_model.model.")) return "model.language_model." + n.substr(21);
  if (n == "language_model.lm_head") return "lm_head";
  if (n.starts_with("vision_tower.vision_model.")) return "model.vision_tower." + n.substr(26);
  if (n.starts_with("multi_modal_projector.")) return "model." + n;
  if (n.starts_with("visual.")) return "model." + n;  // Qwen2-VL family
  return n;
}

LoraAdapters::LoraAdapters(VlmImpl& model, const LoraSettings& s) : settings_(s) {
  MMPOST_CHECK_USAGE(s.r >= 1, "lora.r: must be >= 1 (0 turns LoRA off)");
  MMPOST_CHECK_USAGE(s.lora_dropout >= 0 && s.lora_dropout < 1, "lora.dropout: must be in [0, 1)");
  MMPOST_CHECK_USAGE(!s.target_modules.empty() || !s.target_regex.empty(),
                     "lora.target_modules: name at least one module (e.g. [\"q_proj\", \"v_proj\"])");
  std::regex re;
  if (!s.target_regex.empty()) {
    try {
      re = std::regex(s.target_regex, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      throw Error(ErrorKind::kUsage, "lora.target_modules: invalid regular expression \"" +
                                         s.target_regex + "\": " + e.what());
    }
  }
  const double scaling = s.use_rslora ? s.lora_alpha / std::sqrt(static_cast<double>(s.r))
                                      : s.lora_alpha / static_cast<double>(s.r);
  std::vector<std::string> linear_names;
  std::set<std::string> used_entries;
  for (const auto& item : model.named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
    auto* layer = dynamic_cast<LoraLinearImpl*>(item.value().get());
    if (layer == nullptr) continue;
    const std::string name = transformers_module_path(item.key());
    linear_names.push_back(name);
    bool hit = false;
    if (!s.target_regex.empty()) {
      hit = std::regex_match(name, re);
    } else {
      for (const auto& t : s.target_modules) {
        if (name == t || name.ends_with("." + t)) {
          hit = true;
          used_entries.insert(t);
        }
      }
    }
    if (!hit) continue;
    MMPOST_CHECK_USAGE(!layer->lora_A.defined(), name, ": already has a LoRA adapter");
    const auto& w = layer->weight;
    auto opts = w.options().dtype(w.scalar_type() == torch::kFloat64 ? torch::kFloat64
                                                                    : torch::kFloat32);
    const int64_t out = w.size(0), in = w.size(1);
    // A as nn.Linear(in, r) initialises its weight: kaiming_uniform_(a = sqrt(5)), i.e.
    // U(-1/sqrt(in), 1/sqrt(in)) (PEFT init_lora_weights=True); B = 0.
    auto a = torch::empty({s.r, in}, opts);
    torch::nn::init::kaiming_uniform_(a, std::sqrt(5.0));
    layer->lora_A = a.requires_grad_(true);
    layer->lora_B = torch::zeros({out, s.r}, opts).requires_grad_(true);
    layer->scaling = scaling;
    layer->dropout = s.lora_dropout;
    layer->adapter_enabled = true;
    targets_.push_back({name, layer});
  }
  if (targets_.empty()) {
    std::ostringstream os;
    for (size_t i = 0; i < linear_names.size() && i < 12; ++i) os << "\n    " << linear_names[i];
    if (linear_names.size() > 12) os << "\n    ... and " << linear_names.size() - 12 << " more";
    throw Error(ErrorKind::kUsage,
                "lora.target_modules: matches no linear layer of the model; its linear layers "
                "are named (transformers module paths):" + os.str());
  }
  for (const auto& t : s.target_modules) {
    MMPOST_CHECK_USAGE(used_entries.count(t) == 1, "lora.target_modules: \"", t,
                       "\" matches no linear layer (e.g. q_proj, k_proj, v_proj, o_proj, "
                       "gate_proj, up_proj, down_proj; vision: out_proj, fc1, fc2; projector: "
                       "linear_1, linear_2)");
  }
}

LoraAdapters::~LoraAdapters() = default;

std::vector<std::pair<std::string, torch::Tensor>> LoraAdapters::named_parameters() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& t : targets_) {
    if (!t.layer->lora_A.defined()) continue;  // merged
    out.emplace_back(kPrefix + t.name + ".lora_A.weight", t.layer->lora_A);
    out.emplace_back(kPrefix + t.name + ".lora_B.weight", t.layer->lora_B);
  }
  return out;
}

std::vector<std::string> LoraAdapters::target_names() const {
  std::vector<std::string> out;
  for (const auto& t : targets_) out.push_back(t.name);
  return out;
}

void LoraAdapters::set_enabled(bool on) {
  for (auto& t : targets_) t.layer->adapter_enabled = on;
}

void LoraAdapters::load(const std::map<std::string, torch::Tensor>& tensors,
                        const std::string& source) {
  std::set<std::string> used;
  std::vector<std::string> missing;
  torch::NoGradGuard no_grad;
  for (auto& [key, param] : named_parameters()) {
    // PEFT keeps ".default" (the adapter name) in memory and drops it when saving.
    const std::string alt = key.substr(0, key.size() - 7) + ".default.weight";
    const std::string* found = tensors.count(key) ? &key : tensors.count(alt) ? &alt : nullptr;
    if (found == nullptr) {
      missing.push_back(key);
      continue;
    }
    const auto& t = tensors.at(*found);
    MMPOST_CHECK_DATA(t.sizes() == param.sizes(), source, ": ", *found, " has shape ", t.sizes(),
                      ", the adapter expects ", param.sizes(), " (lora.r or the model differ)");
    param.copy_(t);
    used.insert(*found);
  }
  std::vector<std::string> unexpected;
  for (const auto& [key, t] : tensors) {
    if (used.count(key) == 0 && key.find(".lora_") != std::string::npos) unexpected.push_back(key);
  }
  if (!missing.empty() || !unexpected.empty()) {
    std::ostringstream os;
    os << source << ": the LoRA adapter does not fit the recipe's lora settings";
    for (size_t i = 0; i < missing.size() && i < 10; ++i) os << "\n    missing: " << missing[i];
    for (size_t i = 0; i < unexpected.size() && i < 10; ++i) os << "\n    unexpected: " << unexpected[i];
    throw Error(ErrorKind::kData, os.str());
  }
}

void LoraAdapters::merge_and_unload() {
  torch::NoGradGuard no_grad;
  for (auto& t : targets_) {
    auto* l = t.layer;
    if (!l->lora_A.defined()) continue;
    auto delta = torch::mm(l->lora_B.to(torch::kFloat32), l->lora_A.to(torch::kFloat32)) * l->scaling;
    l->weight.copy_((l->weight.to(torch::kFloat32) + delta).to(l->weight.scalar_type()));
    l->lora_A = torch::Tensor();
    l->lora_B = torch::Tensor();
  }
}

nlohmann::json LoraAdapters::adapter_config(const std::string& base_model,
                                            const std::vector<std::string>& modules_to_save) const {
  nlohmann::json targets;
  if (!settings_.target_regex.empty()) {
    targets = settings_.target_regex;
  } else {
    targets = settings_.target_modules;
  }
  return {{"peft_type", "LORA"},
          {"task_type", nullptr},
          {"base_model_name_or_path", base_model},
          {"r", settings_.r},
          {"lora_alpha", settings_.lora_alpha},
          {"lora_dropout", settings_.lora_dropout},
          {"use_rslora", settings_.use_rslora},
          {"target_modules", targets},
          {"modules_to_save", modules_to_save.empty() ? nlohmann::json(nullptr)
                                                      : nlohmann::json(modules_to_save)},
          {"bias", "none"},
          {"fan_in_fan_out", false},
          {"init_lora_weights", true},
          {"inference_mode", true},
          {"use_dora", false},
          {"layers_to_transform", nullptr},
          {"layers_pattern", nullptr},
          {"rank_pattern", nlohmann::json::object()},
          {"alpha_pattern", nlohmann::json::object()},
          {"revision", nullptr}};
}

AdaptersDisabled::AdaptersDisabled(LoraAdapters* adapters) : adapters_(adapters) {
  if (adapters_ != nullptr) adapters_->set_enabled(false);
}

AdaptersDisabled::~AdaptersDisabled() {
  if (adapters_ != nullptr) adapters_->set_enabled(true);
}

}  // namespace mmpost::model
