// Hugging Face checkpoint names <-> the Vlm's parameters. The module's own names are the hub
// layout (`vision_tower.vision_model.*`, `multi_modal_projector.*`, `language_model.model.*`,
// `language_model.lm_head.weight`); loading also accepts the transformers >= 4.52 in-memory layout
// (`model.vision_tower.*`, `model.multi_modal_projector.*`, `model.language_model.*`, `lm_head.*`)
// and the transformers 5.x one without `vision_model.` under the vision tower.
#pragma once

#include "mmpost/model/vlm.h"

#include <torch/torch.h>

#include <functional>
#include <map>
#include <string>

namespace mmpost::model {

/// Maps a checkpoint tensor name in any accepted layout to the hub name the Vlm uses;
/// e.g. "model.language_model.norm.weight" -> "language_model.model.norm.weight",
/// "vision_tower.embeddings.class_embedding"
///   -> "vision_tower.vision_model.embeddings.class_embedding".
std::string hub_name(const std::string& checkpoint_name);

/// Copies checkpoint `tensors` into `model`'s parameters: tensor NAME fills parameter
/// param_name(NAME) (empty: ignored), converted to the parameter's dtype and device;
/// non-persistent buffers older checkpoints carry (`*.position_ids`, `*.rotary_emb.inv_freq`) are
/// skipped. Throws Error(kData) naming `source_name` and listing every missing and unexpected
/// tensor, two tensors mapping to one parameter, or a shape mismatch (both shapes).
void load_named_weights(torch::nn::Module& model,
                        const std::map<std::string, torch::Tensor>& tensors,
                        const std::string& source_name,
                        const std::function<std::string(const std::string&)>& param_name);

/// Copies `tensors` into the model's parameters (converted to each parameter's dtype and device).
/// With tied embeddings one tensor fills both; an lm_head tensor is then ignored, as HF does.
/// Non-persistent buffers older checkpoints carry (`*.position_ids`, `*.rotary_emb.inv_freq`) are
/// skipped. Throws mmpost::Error (kData) naming `source_name` and listing every missing and
/// unexpected tensor, or naming a tensor whose shape differs (both shapes).
void load_hf_weights(VlmImpl& model, const std::map<std::string, torch::Tensor>& tensors,
                     const std::string& source_name);
inline void load_hf_weights(Vlm& model, const std::map<std::string, torch::Tensor>& tensors,
                            const std::string& source_name) {
  load_hf_weights(*model, tensors, source_name);
}

/// The tensors to write as model.safetensors, in the hub layout (contiguous, on CPU, in the
/// parameters' dtype). With tied embeddings `language_model.lm_head.weight` is omitted, as
/// save_pretrained does. The hub layout is what published LLaVA checkpoints use and what both
/// transformers 4.x and 5.x load; transformers 5.24's own save_pretrained writes
/// `vision_tower.*` without `vision_model.`, which 4.x cannot load.
std::map<std::string, torch::Tensor> hf_state_dict(const VlmImpl& model);
inline std::map<std::string, torch::Tensor> hf_state_dict(const Vlm& model) {
  return hf_state_dict(*model);
}

}  // namespace mmpost::model
