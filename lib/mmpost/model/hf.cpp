// Checkpoint-name mapping for LLaVA (see hf.h). Mirrors the renamings in transformers'
// conversion_mapping.py for "llava" and "CLIPVisionModel", in the load direction.
#include "mmpost/model/hf.h"

#include "mmpost/core/check.h"
#include "mmpost/io/safetensors.h"

#include <set>
#include <sstream>

namespace mmpost::model {
namespace {

// Buffers some checkpoints store that are recomputed here.
bool is_ignored_buffer(const std::string& name) {
  return name.ends_with("embeddings.position_ids") || name.ends_with("rotary_emb.inv_freq");
}

std::string list(const std::vector<std::string>& names, size_t max_shown = 20) {
  std::ostringstream os;
  for (size_t i = 0; i < names.size() && i < max_shown; ++i) os << "\n    " << names[i];
  if (names.size() > max_shown) os << "\n    ... and " << names.size() - max_shown << " more";
  return os.str();
}

}  // namespace

std::string hub_name(const std::string& checkpoint_name) {
  std::string n = checkpoint_name;
  if (n.starts_with("lm_head.")) return "language_model." + n;
  if (n.starts_with("model.language_model.")) return "language_model.model." + n.substr(21);
  if (n.starts_with("model.vision_tower.") || n.starts_with("model.multi_modal_projector."))
    n = n.substr(6);
  if (n.starts_with("vision_tower.") && !n.starts_with("vision_tower.vision_model."))
    n = "vision_tower.vision_model." + n.substr(13);
  return n;
}

void load_named_weights(torch::nn::Module& model,
                        const std::map<std::string, torch::Tensor>& tensors,
                        const std::string& source_name,
                        const std::function<std::string(const std::string&)>& param_name) {
  auto params = model.named_parameters(/*recurse=*/true);
  std::map<std::string, std::string> source_of;  // parameter name -> checkpoint name
  std::vector<std::string> unexpected;
  for (const auto& [name, tensor] : tensors) {
    if (is_ignored_buffer(name)) continue;
    const std::string target = param_name(name);
    if (target.empty()) continue;
    if (params.find(target) == nullptr) {
      unexpected.push_back(name);
      continue;
    }
    auto [it, inserted] = source_of.emplace(target, name);
    MMPOST_CHECK_DATA(inserted, source_name, ": tensors \"", it->second, "\" and \"", name,
                      "\" both map to parameter \"", target, "\"",
                      "\n  hint: the file mixes two name layouts");
  }
  std::vector<std::string> missing;
  for (const auto& item : params) {
    if (!source_of.count(item.key())) missing.push_back(item.key());
  }
  if (!missing.empty() || !unexpected.empty()) {
    std::ostringstream os;
    os << source_name << ": checkpoint does not match the model config";
    if (!missing.empty()) os << "\n  missing " << missing.size() << " tensor(s):" << list(missing);
    if (!unexpected.empty())
      os << "\n  unexpected " << unexpected.size() << " tensor(s):" << list(unexpected);
    throw Error(ErrorKind::kData, os.str(),
                "check that config.json belongs to these weights "
                "(layer counts, tie_word_embeddings)");
  }
  torch::NoGradGuard no_grad;
  for (const auto& [target, name] : source_of) {
    auto& param = params[target];
    const auto& src = tensors.at(name);
    MMPOST_CHECK_DATA(src.sizes() == param.sizes(), source_name, ": tensor \"", name,
                      "\" has shape ", src.sizes(), " but the model expects ", param.sizes(),
                      " for \"", target, "\"");
    param.copy_(src.to(param.device(), param.scalar_type()));
    io::release_mapped_pages(src);  // peak RSS: the model plus one tensor, not plus the file
  }
}

void load_hf_weights(VlmImpl& model, const std::map<std::string, torch::Tensor>& tensors,
                     const std::string& source_name) {
  const bool tied = model.language_model->tied();
  load_named_weights(model, tensors, source_name, [tied](const std::string& name) {
    std::string hub = hub_name(name);
    return tied && hub == "language_model.lm_head.weight" ? std::string() : hub;
  });
}

std::map<std::string, torch::Tensor> hf_state_dict(const VlmImpl& model) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    out[item.key()] = item.value().detach().to(torch::kCPU).contiguous();
  }
  return out;
}

}  // namespace mmpost::model
