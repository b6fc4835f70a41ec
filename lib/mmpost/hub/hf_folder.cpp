// HF model folder load/save (see hub/hf_folder.h).
#include "mmpost/hub/hf_folder.h"
#include "mmpost/hub/qwen2_vl_folder.h"

#include <fstream>
#include <set>

#include "mmpost/core/check.h"
#include "mmpost/core/log.h"
#include "mmpost/io/atomic_file.h"
#include "mmpost/data/chat_template.h"
#include "mmpost/io/checkpoint.h"
#include "mmpost/io/safetensors.h"
#include "mmpost/model/hf.h"

namespace mmpost::hub {
namespace fs = std::filesystem;

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  MMPOST_CHECK_USAGE(in.good(), path.string(), ": cannot open");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(ErrorKind::kUsage, path.string() + ": invalid JSON: " + e.what());
  }
}


model::VlmConfig read_model_config(const fs::path& dir) {
  MMPOST_CHECK_USAGE(fs::is_directory(dir), dir.string(), ": model folder not found");
  fs::path cfg_path = dir / "config.json";
  MMPOST_CHECK_USAGE(fs::is_regular_file(cfg_path), cfg_path.string(), ": missing",
                     "\n  hint: a model folder holds config.json, model.safetensors and tokenizer.model");
  nlohmann::json j = read_json(cfg_path);
  try {
    return model::vlm_config_from_json(j);
  } catch (const Error& e) {  // "config.json: PATH: why" -> "DIR/config.json: PATH: why"
    std::string m = e.message();
    if (m.rfind("config.json: ", 0) == 0) m = m.substr(13);
    throw Error(e.kind(), cfg_path.string() + ": " + m, e.hint());
  }
}

Pretrained load_pretrained(const fs::path& dir, bool merge_adapter) {
  const fs::path cfg_path = dir / "config.json";
  Pretrained p;
  if (is_qwen2_vl_folder(dir)) {
    auto q = load_qwen2_vl_pretrained(dir);
    p.model = model::Vlm(q.model);
    if (merge_adapter && has_lora_adapter(dir)) merge_lora_adapter(*p.model, dir);
    p.config = p.model->config();
    p.tokenizer_path = find_tokenizer(dir);
    p.image.qwen = q.image;
    p.has_processor_config = q.has_processor_config;
    return p;
  }
  p.config = read_model_config(dir);
  // Check the size before allocating: a config.json that lost its sub-configs falls back to HF's
  // LLaVA-7B defaults, which would allocate gigabytes before any shape check.
  auto tensors = io::load_safetensors(dir);
  int64_t stored = 0;
  for (const auto& [name, t] : tensors) stored += t.numel();
  const int64_t expected = model::num_params(p.config);
  MMPOST_CHECK_USAGE(expected <= 2 * stored + (int64_t{1} << 20), cfg_path.string(),
                     ": describes a model of about ", expected, " parameters but the weights in ",
                     dir.string(), " hold ", stored,
                     "\n  hint: check that config.json has its vision_config and text_config");
  p.model = model::build_vlm(p.config);
  model::load_hf_weights(*p.model, tensors, dir.string());
  if (merge_adapter && has_lora_adapter(dir)) merge_lora_adapter(*p.model, dir);
  p.tokenizer_path = find_tokenizer(dir);
  p.image.image_size = p.config.vision_config.image_size;
  // Both files are read when present: transformers 5 loads processor_config.json, 4.x
  // preprocessor_config.json; each must describe the preprocessing the model was trained with.
  const data::ImageProcessorConfig defaults = p.image;
  std::string first;
  for (const char* name : {"processor_config.json", "preprocessor_config.json"}) {
    const fs::path file = dir / name;
    if (!fs::is_regular_file(file)) continue;
    data::ProcessorFileInfo info;
    const auto cfg = data::read_preprocessor_config(file.string(), defaults, &info);
    MMPOST_CHECK_USAGE(info.image_tokens < 0 || info.image_tokens == p.config.n_image_tokens(),
                       file.string(), ": patch_size, num_additional_image_tokens and "
                       "vision_feature_select_strategy expand <image> to ", info.image_tokens,
                       " tokens, but config.json's vision tower yields ", p.config.n_image_tokens());
    if (!info.has_image_settings) continue;
    MMPOST_CHECK_USAGE(first.empty() || data::preprocessor_config_json(cfg) ==
                                            data::preprocessor_config_json(p.image),
                       file.string(), " and ", first, " describe different preprocessing "
                       "(transformers 4 reads one, 5 the other)");
    first = file.string();
    p.image = cfg;
    data::check_processor_for_model(p.image, p.config.vision_config.image_size, file.string());
    p.has_processor_config = true;
  }
  return p;
}

namespace {
/// A special-token field of tokenizer_config.json: "text", {"content": "text"} or null -> text
/// or "".
std::string token_name(const nlohmann::json& cfg, const char* key) {
  if (!cfg.contains(key) || cfg[key].is_null()) return "";
  const auto& v = cfg[key];
  return v.is_object() ? v.at("content").get<std::string>() : v.get<std::string>();
}

/// Whether tokenizer.json's post_processor puts BOS before the text (TemplateProcessing
/// [BOS, $A]); [$A], ByteLevel (offsets only) and none add nothing. Anything else is refused.
bool post_processor_adds_bos(const nlohmann::json& pp, const data::Tokenizer& tok,
                             const fs::path& file) {
  if (pp.is_null()) return false;
  const std::string type = pp.value("type", std::string("?"));
  if (type == "ByteLevel") return false;
  if (type == "Sequence") {
    bool bos = false;
    for (const auto& p : pp.at("processors")) bos = post_processor_adds_bos(p, tok, file) || bos;
    return bos;
  }
  MMPOST_CHECK_USAGE(type == "TemplateProcessing", file.string(), ": post_processor.type ", type,
                     " is not reproduced (mmpost reads TemplateProcessing, ByteLevel, Sequence)");
  std::vector<std::string> single;
  for (const auto& item : pp.at("single")) {
    single.push_back(item.contains("SpecialToken") ? item["SpecialToken"].at("id").get<std::string>()
                                                   : std::string("$A"));
  }
  if (single == std::vector<std::string>{"$A"}) return false;
  const std::string bos = tok.bos_id() >= 0 ? tok.id_to_piece(tok.bos_id()) : "(none)";
  MMPOST_CHECK_USAGE(single == (std::vector<std::string>{bos, "$A"}), file.string(),
                     ": post_processor.single adds tokens mmpost does not reproduce (it "
                     "reproduces [", bos, ", $A] and [$A])");
  return true;
}
}  // namespace

void add_hf_added_tokens(data::Tokenizer& tok, const fs::path& dir) {
  auto add = [&](const fs::path& file, int64_t id, const std::string& content) {
    if (id == tok.bos_id() || id == tok.eos_id() || id == tok.unk_id()) return;
    try {
      tok.add_special_token(content, id);
    } catch (const Error& e) {
      throw Error(e.kind(), file.string() + ": " + e.message(), e.hint());
    }
  };
  const fs::path tok_json = dir / "tokenizer.json", tok_cfg = dir / "tokenizer_config.json";
  const auto cfg = fs::is_regular_file(tok_cfg) ? read_json(tok_cfg) : nlohmann::json::object();
  try {
    const auto decoder = cfg.value("added_tokens_decoder", nlohmann::json::object());
    for (const auto& [key, t] : decoder.items()) {
      add(tok_cfg, std::stoll(key), t.at("content").get<std::string>());
    }
    if (tok.kind() == "bpe") {
      // A tokenizer.json names no roles: bos/eos/unk/pad come from tokenizer_config.json by
      // text, each of which must be a token (e.g. SmolLM2: <|im_start|>, <|im_end|> = pad).
      const std::pair<const char*, void (data::Tokenizer::*)(int64_t)> roles[] = {
          {"bos_token", &data::Tokenizer::set_bos_id}, {"eos_token", &data::Tokenizer::set_eos_id},
          {"unk_token", &data::Tokenizer::set_unk_id}, {"pad_token", &data::Tokenizer::set_pad_id}};
      for (const auto& [key, set] : roles) {
        const std::string name = token_name(cfg, key);
        if (name.empty()) continue;
        const int64_t id = tok.piece_to_id(name);
        MMPOST_CHECK_USAGE(id >= 0, tok_cfg.string(), ": ", key, " \"", name,
                           "\" is not a token of ", tok_json.string());
        (tok.*set)(id);
      }
    }
    // transformers 5 builds a Llama tokenizer's pre-tokenizer from this flag (not from
    // tokenizer.json): legacy true puts the "▁" prefix on every chunk after a special token too.
    if (cfg.contains("legacy") && cfg["legacy"].is_boolean()) tok.set_legacy(cfg["legacy"].get<bool>());
    if (cfg.contains("chat_template") && cfg["chat_template"].is_string()) {
      tok.set_chat_template(cfg["chat_template"].get<std::string>());
    } else if (cfg.contains("chat_template") && cfg["chat_template"].is_array()) {
      for (const auto& t : cfg["chat_template"]) {  // [{name, template}]: the "default" one
        if (t.value("name", "") == "default") tok.set_chat_template(t.at("template").get<std::string>());
      }
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorKind::kUsage, tok_cfg.string() + ": " + e.what());
  } catch (const std::logic_error& e) {  // std::stoll on a non-numeric key
    throw Error(ErrorKind::kUsage,
                tok_cfg.string() + ": added_tokens_decoder: bad id: " + e.what());
  }
  // transformers 5 writes the template to its own file, which wins over tokenizer_config.json.
  if (const fs::path jinja = dir / "chat_template.jinja"; fs::is_regular_file(jinja)) {
    std::ifstream in(jinja, std::ios::binary);
    tok.set_chat_template(std::string(std::istreambuf_iterator<char>(in), {}));
  } else if (const fs::path cj = dir / "chat_template.json";
             tok.chat_template().empty() && fs::is_regular_file(cj)) {
    const auto j = read_json(cj);  // processor template (llava-hf, Qwen2-VL)
    if (j.contains("chat_template") && j["chat_template"].is_string())
      tok.set_chat_template(j["chat_template"].get<std::string>());
  }
  if (fs::is_regular_file(tok_json)) {
    const auto j = read_json(tok_json);
    try {
      for (const auto& t : j.value("added_tokens", nlohmann::json::array())) {
        add(tok_json, t.at("id").get<int64_t>(), t.at("content").get<std::string>());
      }
      // The post-processor decides whether transformers puts BOS (or EOS) around the text.
      tok.set_add_bos(post_processor_adds_bos(j.value("post_processor", nlohmann::json()), tok,
                                              tok_json));
    } catch (const nlohmann::json::exception& e) {
      throw Error(ErrorKind::kUsage, tok_json.string() + ": added_tokens: " + e.what());
    }
  }
  if (tok.kind() != "bpe") {  // after both files: <pad> may be an added token of either
    const std::string pad_name = token_name(cfg, "pad_token");
    const int64_t pad = pad_name.empty() ? -1 : tok.piece_to_id(pad_name);
    if (pad >= 0) tok.set_pad_id(pad);
  }
  if (tok.kind() == "bpe") {
    MMPOST_CHECK_USAGE(tok.eos_id() >= 0, tok_cfg.string(),
                       ": no eos_token: a tokenizer.json needs tokenizer_config.json to name its "
                       "EOS (replies end with it)");
  }
}

std::unique_ptr<data::Tokenizer> load_tokenizer(const fs::path& file) {
  auto tok = std::make_unique<data::Tokenizer>(file.string());
  add_hf_added_tokens(*tok, file.parent_path().empty() ? fs::path(".") : file.parent_path());
  return tok;
}

fs::path find_tokenizer(const fs::path& dir) {
  if (fs::is_regular_file(dir / "tokenizer.model")) return dir / "tokenizer.model";
  if (fs::is_regular_file(dir / "tokenizer.json")) return dir / "tokenizer.json";
  return {};
}

namespace {
/// tokenizer.json (the loaded bytes, plus added tokens registered since, e.g. <image>),
/// tokenizer_config.json naming bos/eos/unk/pad and carrying the chat template, and
/// special_tokens_map.json: what PreTrainedTokenizerFast (transformers 4 and 5) reads back.
void save_bpe_tokenizer(const fs::path& dir, const data::Tokenizer& tok, int64_t max_length) {
  nlohmann::json j = nlohmann::json::parse(tok.model_bytes());
  std::set<int64_t> have;
  for (const auto& t : j["added_tokens"]) have.insert(t.at("id").get<int64_t>());
  for (const auto& [id, text] : tok.added_tokens()) {
    if (have.count(id)) continue;
    j["added_tokens"].push_back({{"id", id}, {"content", text}, {"single_word", false},
                                 {"lstrip", false}, {"rstrip", false}, {"normalized", false},
                                 {"special", true}});
  }
  io::write_text_atomic(dir / "tokenizer.json", j.dump(2) + "\n");
  nlohmann::json decoder = nlohmann::json::object();
  for (const auto& t : j["added_tokens"]) {
    decoder[std::to_string(t.at("id").get<int64_t>())] = {
        {"content", t.at("content")}, {"lstrip", t.value("lstrip", false)},
        {"normalized", t.value("normalized", false)}, {"rstrip", t.value("rstrip", false)},
        {"single_word", t.value("single_word", false)}, {"special", t.value("special", true)}};
  }
  auto name = [&](int64_t id) { return id >= 0 ? nlohmann::json(tok.id_to_piece(id)) : nlohmann::json(); };
  nlohmann::json special = {{"bos_token", name(tok.bos_id())}, {"eos_token", name(tok.eos_id())},
                            {"unk_token", name(tok.unk_id())}, {"pad_token", name(tok.pad_id())}};
  nlohmann::json cfg = special;
  cfg.update({{"tokenizer_class", "PreTrainedTokenizerFast"},
              {"model_max_length", max_length},
              {"added_tokens_decoder", decoder},
              {"padding_side", "left"}});
  if (tok.piece_to_id(data::kImagePlaceholder) >= 0) {
    cfg["image_token"] = data::kImagePlaceholder;
    cfg["processor_class"] = "LlavaProcessor";
  }
  if (!tok.chat_template().empty()) cfg["chat_template"] = tok.chat_template();
  io::write_text_atomic(dir / "tokenizer_config.json", cfg.dump(2) + "\n");
  io::write_text_atomic(dir / "special_tokens_map.json", special.dump(2) + "\n");
}
}  // namespace

void save_pretrained(const fs::path& dir, model::Vlm& model, const fs::path& tokenizer_path,
                     const data::ImageProcessorConfig& image, torch::Dtype save_dtype,
                     int64_t max_shard_bytes, const data::Tokenizer* tokenizer) {
  if (model->is_qwen2_vl()) {
    MMPOST_CHECK(image.qwen.has_value(), dir.string(),
                 ": a Qwen2-VL model is saved with its Qwen2VLImageProcessor settings");
    // The hub tokenizer files (tokenizer.json + tokenizer_config.json with the vision tokens
    // and chat template) are copied as they are.
    save_qwen2_vl_pretrained(dir, *model->qwen2_vl, *image.qwen,
                             tokenizer_path.empty() ? fs::path() : tokenizer_path.parent_path(),
                             save_dtype, max_shard_bytes);
    return;
  }
  fs::create_directories(dir);
  auto tensors = model::hf_state_dict(*model);
  uint64_t bytes = 0;
  for (auto& [name, t] : tensors) {
    if (t.is_floating_point()) t = t.to(save_dtype);
    bytes += t.numel() * t.element_size();
  }
  io::check_free_space(dir, bytes + (bytes / 10) + (1 << 20));
  nlohmann::json cfg = model::vlm_config_to_json(model->config());
  cfg["torch_dtype"] = save_dtype == torch::kBFloat16 ? "bfloat16"
                       : save_dtype == torch::kFloat16 ? "float16" : "float32";
  io::write_text_atomic(dir / "config.json", cfg.dump(2) + "\n");
  io::save_safetensors_sharded(dir, tensors, max_shard_bytes);
  const auto& tc = model->config().text_config;
  if (tokenizer != nullptr && tokenizer->kind() == "bpe") {
    save_bpe_tokenizer(dir, *tokenizer, tc.max_position_embeddings);
  } else if (tokenizer != nullptr || !tokenizer_path.empty()) {
    if (tokenizer != nullptr) {  // the bytes in memory: the file it came from may be pruned
      io::write_text_atomic(dir / "tokenizer.model", tokenizer->model_bytes());
    } else if (fs::absolute(tokenizer_path) != fs::absolute(dir / "tokenizer.model")) {
      std::ifstream in(tokenizer_path, std::ios::binary);
      MMPOST_CHECK(in.good(), tokenizer_path.string(), ": cannot read tokenizer");
      std::string bytes_tok((std::istreambuf_iterator<char>(in)),
                            std::istreambuf_iterator<char>());
      io::write_text_atomic(dir / "tokenizer.model", bytes_tok);
    }
    nlohmann::json special = {{"bos_token", "<s>"}, {"eos_token", "</s>"}, {"unk_token", "<unk>"}};
    if (tc.pad_token_id) special["pad_token"] = "<pad>";
    nlohmann::json tok_cfg = {
        {"tokenizer_class", "LlamaTokenizer"}, {"add_bos_token", tokenizer == nullptr || tokenizer->add_bos()}, {"add_eos_token", false},
        {"legacy", tokenizer != nullptr && tokenizer->legacy()}, {"model_max_length", tc.max_position_embeddings},
        {"bos_token", "<s>"}, {"eos_token", "</s>"}, {"unk_token", "<unk>"},
        {"image_token", "<image>"}, {"processor_class", "LlavaProcessor"},
        {"padding_side", "left"}, {"mmpost_chat_template", "llava"}};
    if (tokenizer != nullptr) {
      nlohmann::json decoder = nlohmann::json::object();
      for (const auto& [id, text] : tokenizer->added_tokens()) {
        decoder[std::to_string(id)] = {{"content", text}, {"lstrip", false}, {"normalized", false},
                                       {"rstrip", false}, {"single_word", false}, {"special", true}};
      }
      if (!decoder.empty()) tok_cfg["added_tokens_decoder"] = decoder;
      if (tokenizer->pad_id() >= 0) tok_cfg["pad_token"] = tokenizer->id_to_piece(tokenizer->pad_id());
      if (tokenizer->pad_id() >= 0) special["pad_token"] = tokenizer->id_to_piece(tokenizer->pad_id());
      if (!tokenizer->chat_template().empty()) tok_cfg["chat_template"] = tokenizer->chat_template();
    } else if (tc.pad_token_id) {
      tok_cfg["pad_token"] = "<pad>";
    }
    io::write_text_atomic(dir / "tokenizer_config.json", tok_cfg.dump(2) + "\n");
    io::write_text_atomic(dir / "special_tokens_map.json", special.dump(2) + "\n");
  }
  io::write_text_atomic(dir / "preprocessor_config.json",
                    data::preprocessor_config_json(image).dump(2) + "\n");
}

bool has_lora_adapter(const fs::path& dir) {
  const bool config = fs::is_regular_file(dir / "adapter_config.json");
  const bool weights = fs::is_regular_file(dir / "adapter_model.safetensors");
  MMPOST_CHECK_DATA(config == weights, (dir / (config ? "adapter_model.safetensors"
                                                      : "adapter_config.json")).string(),
                    ": missing, but ", (config ? "adapter_config.json" : "adapter_model.safetensors"),
                    " is there (a PEFT adapter needs both)",
                    "\n  hint: restore the file, or delete the other one to use the base model alone");
  return config;
}

model::LoraSettings read_lora_settings(const fs::path& dir) {
  const fs::path file = dir / "adapter_config.json";
  const auto j = read_json(file);
  MMPOST_CHECK_USAGE(j.value("peft_type", std::string()) == "LORA", file.string(),
                     ": peft_type must be LORA");
  for (const char* key : {"use_dora", "fan_in_fan_out"}) {
    MMPOST_CHECK_USAGE(!j.value(key, false), file.string(), ": ", key, " is not supported");
  }
  for (const char* key : {"rank_pattern", "alpha_pattern"}) {
    MMPOST_CHECK_USAGE(!j.contains(key) || j[key].is_null() || j[key].empty(), file.string(),
                       ": ", key, " is not supported");
  }
  MMPOST_CHECK_USAGE(!j.contains("layers_to_transform") || j["layers_to_transform"].is_null(),
                     file.string(), ": layers_to_transform is not supported");
  MMPOST_CHECK_USAGE(!j.contains("bias") || j["bias"] == "none", file.string(),
                     ": bias ", j.value("bias", nlohmann::json()).dump(),
                     " is not supported (only \"none\": LoRA does not train biases)");
  model::LoraSettings s;
  std::string key;  // the field being read, named in the error
  try {
    key = "r";
    s.r = j.at(key).get<int64_t>();
    key = "lora_alpha";
    s.lora_alpha = j.at(key).get<double>();
    key = "lora_dropout";
    s.lora_dropout = j.value(key, 0.0);
    key = "use_rslora";
    s.use_rslora = j.value(key, false);
    key = "target_modules";
    const auto& t = j.at(key);
    if (t.is_string()) {
      s.target_regex = t.get<std::string>();
    } else {
      s.target_modules = t.get<std::vector<std::string>>();
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorKind::kUsage, file.string() + ": " + key + ": " + e.what());
  }
  return s;
}

void merge_lora_adapter(model::VlmImpl& m, const fs::path& dir) {
  model::LoraAdapters adapters(m, read_lora_settings(dir));
  const fs::path file = dir / "adapter_model.safetensors";
  adapters.load(io::load_safetensors(file), file.string());
  adapters.merge_and_unload();
  log_info(dir.string() + ": LoRA adapter merged into the weights (" +
           std::to_string(adapters.size()) + " layers)");
}

void save_lora_adapter(const fs::path& dir, const model::VlmImpl& m,
                       const model::LoraAdapters& adapters,
                       const std::vector<std::string>& modules_to_save,
                       const std::string& base_model) {
  std::map<std::string, torch::Tensor> tensors;
  for (const auto& [key, t] : adapters.named_parameters()) {
    tensors[key] = t.detach().to(torch::kCPU, torch::kFloat32).contiguous();
  }
  std::vector<std::string> saved_modules;
  const std::map<std::string, std::string> prefix_of = {
      {"vision_tower", "vision_tower."},
      {"multi_modal_projector", "multi_modal_projector."},
      {"language_model", "language_model."}};
  for (const auto& part : modules_to_save) {
    saved_modules.push_back(part);
    // transformers keeps an untied lm_head beside model.language_model, not in it.
    if (part == "language_model" && m.language_model->named_parameters().contains("lm_head.weight")) {
      saved_modules.push_back("lm_head");
    }
    for (const auto& item : m.named_parameters(/*recurse=*/true)) {
      const std::string& name = item.key();
      if (name.rfind(prefix_of.at(part), 0) != 0) continue;
      const auto dot = name.rfind('.');
      tensors["base_model.model." + model::transformers_module_path(name.substr(0, dot)) +
              name.substr(dot)] = item.value().detach().to(torch::kCPU, torch::kFloat32).contiguous();
    }
  }
  fs::create_directories(dir);
  io::save_safetensors(dir / "adapter_model.safetensors", tensors);
  const std::string text = adapters.adapter_config(base_model, saved_modules).dump(2) + "\n";
  io::AtomicFile f(dir / "adapter_config.json");
  f.write(text.data(), text.size());
  f.commit();
}

}  // namespace mmpost::hub
