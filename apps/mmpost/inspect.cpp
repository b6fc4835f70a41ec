// mmpost inspect model DIR: what a model folder holds — architecture (from config.json), parameter
// counts per part (vision tower / projector / language model), stored dtypes and tensors the model
// does not use. Reads the weights without building the model, so it also diagnoses folders that
// fail to load.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>

#include "mmpost/cli_common.h"
#include "mmpost/core/check.h"
#include "mmpost/hub/hf_folder.h"
#include "mmpost/io/safetensors.h"
#include "mmpost/model/hf.h"
#include "mmpost/model/vlm.h"

namespace mmpost::cli {
namespace fs = std::filesystem;

namespace {
std::string part_of(const std::string& hub) {
  if (hub.rfind("vision_tower.", 0) == 0) return "vision";
  if (hub.rfind("multi_modal_projector.", 0) == 0) return "projector";
  if (hub.rfind("language_model.", 0) == 0) return "language";
  return "other";
}

std::string human(int64_t n) {
  char buf[32];
  if (n >= 1000000000) std::snprintf(buf, sizeof(buf), "%.2fB", n / 1e9);
  else if (n >= 1000000) std::snprintf(buf, sizeof(buf), "%.2fM", n / 1e6);
  else if (n >= 1000) std::snprintf(buf, sizeof(buf), "%.1fK", n / 1e3);
  else std::snprintf(buf, sizeof(buf), "%lld", static_cast<long long>(n));
  return buf;
}

int run_inspect_model(const std::string& dir, bool as_json) {
  fs::path cfg_path = fs::path(dir) / "config.json";
  MMPOST_CHECK_USAGE(fs::is_regular_file(cfg_path), cfg_path.string(), ": missing");
  std::ifstream in(cfg_path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(ErrorKind::kUsage, cfg_path.string() + ": invalid JSON: " + e.what());
  }
  auto cfg = model::vlm_config_from_json(j);
  auto contents = io::read_safetensors(dir);
  // Expected names: the parameters of a model built from the config (no weights loaded).
  auto m = model::build_vlm(cfg);
  std::set<std::string> expected;
  for (const auto& kv : model::hf_state_dict(m)) expected.insert(kv.first);

  std::map<std::string, int64_t> per_part;
  std::map<std::string, int64_t> per_dtype;
  std::vector<std::string> unused;
  std::set<std::string> seen;
  for (const auto& [name, t] : contents.tensors) {
    std::string hub = model::hub_name(name);
    per_dtype[std::string(c10::toString(t.scalar_type()))] += t.numel();
    if (expected.count(hub) == 0) {
      unused.push_back(name);
      continue;
    }
    seen.insert(hub);
    per_part[part_of(hub)] += t.numel();
  }
  std::vector<std::string> missing;
  for (const auto& e : expected) {
    if (seen.count(e) == 0) missing.push_back(e);
  }
  int64_t total = 0;
  for (const auto& kv : per_part) total += kv.second;
  const auto& v = cfg.vision_config;
  const auto& t = cfg.text_config;
  nlohmann::json out = {
      {"folder", dir},
      {"architecture", "LlavaForConditionalGeneration"},
      {"vision", {{"layers", v.num_hidden_layers}, {"hidden_size", v.hidden_size},
                  {"heads", v.num_attention_heads}, {"image_size", v.image_size},
                  {"patch_size", v.patch_size}, {"hidden_act", v.hidden_act}}},
      {"projector", {{"hidden_act", cfg.projector_hidden_act}}},
      {"language", {{"layers", t.num_hidden_layers}, {"hidden_size", t.hidden_size},
                    {"heads", t.num_attention_heads}, {"kv_heads", t.num_key_value_heads},
                    {"vocab_size", t.vocab_size}, {"rope_theta", t.rope_theta},
                    {"tie_word_embeddings", t.tie_word_embeddings}}},
      {"image_token_index", cfg.image_token_index},
      {"n_image_tokens", cfg.n_image_tokens()},
      {"vision_feature_layer", cfg.vision_feature_layer},
      {"vision_feature_select_strategy", cfg.vision_feature_select_strategy},
      {"parameters", {{"vision", per_part["vision"]}, {"projector", per_part["projector"]},
                      {"language", per_part["language"]}, {"total", total}}},
      {"dtypes", per_dtype},
      {"metadata", contents.metadata},
      {"unused_tensors", unused},
      {"missing_tensors", missing}};
  if (as_json) {
    std::cout << out.dump() << std::endl;
    return 0;
  }
  std::cout << "model folder  " << dir << "\n"
            << "architecture  LlavaForConditionalGeneration\n"
            << "vision        CLIP ViT " << v.num_hidden_layers << " layers x " << v.hidden_size
            << " (" << v.num_attention_heads << " heads, " << v.hidden_act << "), image "
            << v.image_size << " / patch " << v.patch_size << " -> " << cfg.n_image_tokens()
            << " image tokens (layer " << cfg.vision_feature_layer << ", "
            << cfg.vision_feature_select_strategy << ")\n"
            << "projector     linear_1 -> " << cfg.projector_hidden_act << " -> linear_2\n"
            << "language      Llama " << t.num_hidden_layers << " layers x " << t.hidden_size
            << " (" << t.num_attention_heads << " heads, " << t.num_key_value_heads
            << " kv heads), vocab " << t.vocab_size << ", rope_theta " << t.rope_theta
            << (t.tie_word_embeddings ? ", tied embeddings" : "") << "\n"
            << "parameters    vision " << human(per_part["vision"]) << ", projector "
            << human(per_part["projector"]) << ", language " << human(per_part["language"])
            << ", total " << human(total) << "\n"
            << "dtypes       ";
  for (const auto& [d, n] : per_dtype) std::cout << " " << d << " (" << human(n) << ")";
  std::cout << "\nunused        " << (unused.empty() ? "none" : "");
  for (const auto& u : unused) std::cout << "\n  " << u;
  std::cout << "\nmissing       " << (missing.empty() ? "none" : "");
  for (const auto& u : missing) std::cout << "\n  " << u;
  std::cout << std::endl;
  return missing.empty() ? 0 : 1;
}
/// Runs the model on tensors from a safetensors file (input_ids [B,T] int64, attention_mask [B,T],
/// optional pixel_values [N,3,H,W]) and writes {"logits": [B,T,V] float32} — the parity probe the
/// transformers round-trip check (scripts/golden/check_roundtrip.py) compares against.
int run_inspect_forward(const std::string& dir, const std::string& inputs, const std::string& out) {
  auto p = hub::load_pretrained(dir);
  auto t = io::load_safetensors(inputs);
  MMPOST_CHECK_USAGE(t.count("input_ids") == 1, inputs, ": needs an input_ids tensor");
  auto ids = t.at("input_ids").to(torch::kInt64);
  auto mask = t.count("attention_mask") ? t.at("attention_mask").to(torch::kInt64)
                                        : torch::ones_like(ids);
  torch::Tensor pix;
  if (t.count("pixel_values")) pix = t.at("pixel_values").to(torch::kFloat32);
  p.model->eval();
  torch::NoGradGuard no_grad;
  auto logits = p.model->forward(ids, pix, mask);  // [B, T, V]
  io::save_safetensors(out, {{"logits", logits.contiguous()}});
  std::cout << nlohmann::json({{"logits", logits.sizes().vec()}, {"out", out}}).dump() << std::endl;
  return 0;
}
}  // namespace

Stage setup_inspect(CLI::App& app) {
  auto* sub = app.add_subcommand("inspect", "describe a model folder");
  sub->require_subcommand(1);
  auto* model_cmd = sub->add_subcommand("model", "architecture, parameter counts, dtypes, unused tensors");
  static std::string dir;
  static bool as_json = false;
  model_cmd->add_option("dir", dir, "HF-layout model folder")->required();
  model_cmd->add_flag("--json", as_json, "one JSON object on stdout instead of the table");
  auto* fwd = sub->add_subcommand("forward", "logits of a model on tensors from a safetensors file");
  static std::string fwd_dir, fwd_inputs, fwd_out;
  fwd->add_option("dir", fwd_dir, "HF-layout model folder")->required();
  fwd->add_option("--inputs", fwd_inputs, "safetensors with input_ids, attention_mask, pixel_values")
      ->required();
  fwd->add_option("--out", fwd_out, "safetensors file to write {logits}")->required();
  return {sub, [model_cmd, fwd] {
            if (fwd->parsed()) return run_inspect_forward(fwd_dir, fwd_inputs, fwd_out);
            return run_inspect_model(dir, as_json);
          }};
}

}  // namespace mmpost::cli
