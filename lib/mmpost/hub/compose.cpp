// LLaVA on a pretrained language model (see hub/compose.h).
#include "mmpost/hub/compose.h"

#include <fstream>
#include <set>

#include "mmpost/core/check.h"
#include "mmpost/data/chat_template.h"
#include "mmpost/io/safetensors.h"
#include "mmpost/model/hf.h"

namespace mmpost::hub {
namespace fs = std::filesystem;

namespace {
/// Rows [V, H] grown to `rows` with the mean of the existing rows (float32 math).
torch::Tensor grow_rows(const torch::Tensor& w, int64_t rows) {
  if (w.size(0) >= rows) return w;
  auto mean = w.to(torch::kFloat32).mean(0, /*keepdim=*/true).to(w.dtype());
  return torch::cat({w, mean.expand({rows - w.size(0), w.size(1)})}, 0);
}
}  // namespace

Composed compose_vlm(const ComposeOptions& opts) {
  const fs::path& lm = opts.language_model;
  MMPOST_CHECK_USAGE(fs::is_directory(lm), lm.string(), ": language model folder not found");
  const fs::path lm_cfg = lm / "config.json";
  MMPOST_CHECK_USAGE(fs::is_regular_file(lm_cfg), lm_cfg.string(), ": missing");
  model::TextConfig text = model::causal_lm_config_from_json(read_json(lm_cfg), lm_cfg.string());

  Composed out;
  const fs::path tok_file = find_tokenizer(lm);
  MMPOST_CHECK_USAGE(!tok_file.empty(), lm.string(), ": no tokenizer.model or tokenizer.json");
  out.tokenizer = load_tokenizer(tok_file);
  auto& tok = *out.tokenizer;
  MMPOST_CHECK_USAGE(tok.vocab_size() <= text.vocab_size || tok.piece_to_id(data::kImagePlaceholder) < 0,
                     tok_file.string(), ": ", tok.vocab_size(), " ids but ", lm_cfg.string(),
                     " has vocab_size ", text.vocab_size);

  // The LLaVA fields: the caller's, or the vision folder's.
  nlohmann::json top = opts.vlm_config.is_null() ? nlohmann::json::object() : opts.vlm_config;
  MMPOST_CHECK_USAGE(top.is_object(), "init config: expected a JSON object");
  for (const char* key : {"text_config", "image_token_index", "image_seq_length", "vocab_size"}) {
    MMPOST_CHECK_USAGE(!top.contains(key), "init config: ", key,
                       ": comes from the language model (", lm_cfg.string(), ") and its tokenizer");
  }
  Pretrained vision;
  if (!opts.vision_from.empty()) {
    MMPOST_CHECK_USAGE(!top.contains("vision_config"), "init config: vision_config: given twice ",
                       "(also by the vision folder ", opts.vision_from.string(), ")");
    vision = load_pretrained(opts.vision_from);
    const auto& vc = vision.config;
    top["vision_config"] = model::vlm_config_to_json(vc)["vision_config"];
    if (!top.contains("vision_feature_layer")) top["vision_feature_layer"] = vc.vision_feature_layer;
    if (!top.contains("vision_feature_select_strategy"))
      top["vision_feature_select_strategy"] = vc.vision_feature_select_strategy;
    if (!top.contains("projector_hidden_act")) top["projector_hidden_act"] = vc.projector_hidden_act;
    if (!top.contains("multimodal_projector_bias"))
      top["multimodal_projector_bias"] = vc.multimodal_projector_bias;
  }
  MMPOST_CHECK_USAGE(top.contains("vision_config"), "init config: vision_config: missing",
                     "\n  hint: give a CLIPVisionConfig object (hidden_size, num_hidden_layers, "
                     "image_size, patch_size, ...) or a LLaVA folder to take the tower from");
  model::VlmConfig c = model::vlm_config_from_json(top, "init config");

  // <image>: the tokenizer's own token, else a new one after every id it has.
  int64_t image_id = tok.piece_to_id(data::kImagePlaceholder);
  if (image_id < 0) {
    image_id = tok.vocab_size();
    out.notes.push_back(std::string("added ") + data::kImagePlaceholder + " = " +
                        std::to_string(image_id) + " to the tokenizer");
  }
  tok.add_special_token(data::kImagePlaceholder, image_id);
  const int64_t lm_vocab = text.vocab_size;
  text.vocab_size = std::max(text.vocab_size, image_id + 1);
  if (text.vocab_size != lm_vocab) {
    out.notes.push_back("embeddings " + std::to_string(lm_vocab) + " -> " +
                        std::to_string(text.vocab_size) + " rows (new rows: the mean row)");
  }
  c.text_config = text;
  c.image_token_index = image_id;
  c.image_seq_length = c.n_image_tokens();
  c.tie_word_embeddings = text.tie_word_embeddings;
  model::validate(c);

  torch::manual_seed(static_cast<uint64_t>(opts.seed));
  auto m = model::build_vlm(c);
  auto tensors = model::hf_state_dict(m);  // the random init; overwritten part by part

  // The language model: LlamaForCausalLM names -> the LLaVA hub layout.
  std::vector<std::string> unexpected, missing;
  std::set<std::string> filled;
  for (auto& [name, t] : io::load_safetensors(lm)) {
    std::string hub;
    if (name.rfind("model.", 0) == 0) hub = "language_model." + name;
    else if (name == "lm_head.weight") hub = "language_model.lm_head.weight";
    if (name.find("rotary_emb.inv_freq") != std::string::npos) continue;  // old buffers
    if (hub == "language_model.lm_head.weight" && c.tie_word_embeddings) continue;  // as HF
    auto it = hub.empty() ? tensors.end() : tensors.find(hub);
    if (it == tensors.end()) {
      unexpected.push_back(name);
      continue;
    }
    if (hub == "language_model.model.embed_tokens.weight" ||
        hub == "language_model.lm_head.weight") {
      t = grow_rows(t, text.vocab_size);
    }
    MMPOST_CHECK_DATA(t.sizes() == it->second.sizes(), lm.string(), ": ", name, " has shape ",
                      t.sizes(), " but ", lm_cfg.string(), " gives ", it->second.sizes());
    it->second = t;
    filled.insert(hub);
  }
  for (const auto& [hub, t] : tensors) {
    if (hub.rfind("language_model.", 0) == 0 && !filled.count(hub)) missing.push_back(hub);
  }
  auto list = [](const std::vector<std::string>& v) {
    std::string s;
    for (size_t i = 0; i < v.size() && i < 8; ++i) s += (i ? ", " : "") + v[i];
    if (v.size() > 8) s += ", ... (" + std::to_string(v.size()) + " in all)";
    return s;
  };
  MMPOST_CHECK_DATA(unexpected.empty(), lm.string(), ": tensors a LlamaForCausalLM does not have: ",
                    list(unexpected));
  MMPOST_CHECK_DATA(missing.empty(), lm.string(), ": missing tensors: ", list(missing));

  // The vision tower (and projector when it fits) from another folder.
  if (vision.model) {
    auto theirs = model::hf_state_dict(vision.model);
    bool projector_fits = true;
    for (const auto& [hub, t] : theirs) {
      if (hub.rfind("multi_modal_projector.", 0) == 0) {
        projector_fits = projector_fits && tensors.count(hub) && tensors[hub].sizes() == t.sizes();
      }
    }
    for (const auto& [hub, t] : theirs) {
      const bool tower = hub.rfind("vision_tower.", 0) == 0;
      const bool proj = hub.rfind("multi_modal_projector.", 0) == 0;
      if (tower || (proj && projector_fits)) tensors[hub] = t;
    }
    out.notes.push_back("vision tower from " + opts.vision_from.string() +
                        (projector_fits ? ", projector too"
                                        : "; projector new (its shapes differ)"));
    out.pretrained.image = vision.image;
    out.pretrained.has_processor_config = vision.has_processor_config;
  } else {
    out.notes.push_back("vision tower and projector new (seed " + std::to_string(opts.seed) + ")");
  }
  model::load_hf_weights(m, tensors, lm.string());
  out.pretrained.config = c;
  out.pretrained.model = m;
  out.pretrained.tokenizer_path = tok_file;
  out.pretrained.image.image_size = c.vision_config.image_size;
  return out;
}

}  // namespace mmpost::hub
