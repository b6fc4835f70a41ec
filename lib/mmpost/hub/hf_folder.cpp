// HF model folder load/save (see hub/hf_folder.h).
#include "mmpost/hub/hf_folder.h"

#include <fstream>

#include "mmpost/core/check.h"
#include "mmpost/io/checkpoint.h"
#include "mmpost/io/safetensors.h"
#include "mmpost/model/hf.h"

namespace mmpost::hub {
namespace fs = std::filesystem;

namespace {
nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  MMPOST_CHECK_USAGE(in.good(), path.string(), ": cannot open");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(ErrorKind::kUsage, path.string() + ": invalid JSON: " + e.what());
  }
}
}  // namespace

namespace {
/// Parameter count a config implies (weights only, biases and norms ignored): enough to catch a
/// config that does not describe the stored weights before allocating the model.
int64_t approx_num_params(const model::VlmConfig& c) {
  const auto& v = c.vision_config;
  const auto& t = c.text_config;
  const int64_t kv = t.num_key_value_heads * t.head_dim, q = t.num_attention_heads * t.head_dim;
  int64_t n = t.vocab_size * t.hidden_size * (c.tie_word_embeddings ? 1 : 2);
  n += t.num_hidden_layers * (t.hidden_size * (2 * q + 2 * kv) + 3 * t.hidden_size * t.intermediate_size);
  n += v.num_hidden_layers * (4 * v.hidden_size * v.hidden_size + 2 * v.hidden_size * v.intermediate_size);
  n += v.num_channels * v.patch_size * v.patch_size * v.hidden_size;
  n += v.hidden_size * t.hidden_size + t.hidden_size * t.hidden_size;  // projector
  return n;
}
}  // namespace

Pretrained load_pretrained(const fs::path& dir) {
  MMPOST_CHECK_USAGE(fs::is_directory(dir), dir.string(), ": model folder not found");
  fs::path cfg_path = dir / "config.json";
  MMPOST_CHECK_USAGE(fs::is_regular_file(cfg_path), cfg_path.string(), ": missing",
                     "\n  hint: a model folder holds config.json, model.safetensors and tokenizer.model");
  nlohmann::json j = read_json(cfg_path);
  Pretrained p;
  try {
    p.config = model::vlm_config_from_json(j);
  } catch (const Error& e) {
    throw Error(e.kind(), cfg_path.string() + ": " + e.message(), e.hint());
  }
  // Check the size before allocating: a config.json that lost its sub-configs falls back to HF's
  // LLaVA-7B defaults, which would allocate gigabytes before any shape check.
  auto tensors = io::load_safetensors(dir);
  int64_t stored = 0;
  for (const auto& [name, t] : tensors) stored += t.numel();
  const int64_t expected = approx_num_params(p.config);
  MMPOST_CHECK_USAGE(expected <= 2 * stored + (int64_t{1} << 20), cfg_path.string(),
                     ": describes a model of about ", expected, " parameters but the weights in ",
                     dir.string(), " hold ", stored,
                     "\n  hint: check that config.json has its vision_config and text_config");
  p.model = model::build_vlm(p.config);
  model::load_hf_weights(*p.model, tensors, dir.string());
  if (fs::is_regular_file(dir / "tokenizer.model")) p.tokenizer_path = dir / "tokenizer.model";
  p.image.image_size = p.config.vision_config.image_size;
  for (const char* name : {"preprocessor_config.json", "processor_config.json"}) {
    if (fs::is_regular_file(dir / name)) {
      p.image = data::read_preprocessor_config((dir / name).string(), p.image);
      break;
    }
  }
  return p;
}

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
  if (fs::is_regular_file(tok_json)) {
    const auto j = read_json(tok_json);
    try {
      for (const auto& t : j.value("added_tokens", nlohmann::json::array())) {
        add(tok_json, t.at("id").get<int64_t>(), t.at("content").get<std::string>());
      }
    } catch (const nlohmann::json::exception& e) {
      throw Error(ErrorKind::kUsage, tok_json.string() + ": added_tokens: " + e.what());
    }
  }
  if (!fs::is_regular_file(tok_cfg)) return;
  const auto j = read_json(tok_cfg);
  try {
    const auto decoder = j.value("added_tokens_decoder", nlohmann::json::object());
    for (const auto& [key, t] : decoder.items()) {
      add(tok_cfg, std::stoll(key), t.at("content").get<std::string>());
    }
    if (j.contains("pad_token") && !j["pad_token"].is_null()) {
      const auto& v = j["pad_token"];
      const int64_t pad = tok.piece_to_id(v.is_object() ? v.at("content").get<std::string>()
                                                        : v.get<std::string>());
      if (pad >= 0) tok.set_pad_id(pad);
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorKind::kUsage, tok_cfg.string() + ": " + e.what());
  } catch (const std::logic_error& e) {  // std::stoll on a non-numeric key
    throw Error(ErrorKind::kUsage,
                tok_cfg.string() + ": added_tokens_decoder: bad id: " + e.what());
  }
}

void save_pretrained(const fs::path& dir, model::Vlm& model, const fs::path& tokenizer_path,
                     const data::ImageProcessorConfig& image, torch::Dtype save_dtype,
                     int64_t max_shard_bytes, const data::Tokenizer* tokenizer) {
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
  if (tokenizer != nullptr || !tokenizer_path.empty()) {
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
        {"tokenizer_class", "LlamaTokenizer"}, {"add_bos_token", true}, {"add_eos_token", false},
        {"legacy", false}, {"model_max_length", tc.max_position_embeddings},
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
    } else if (tc.pad_token_id) {
      tok_cfg["pad_token"] = "<pad>";
    }
    io::write_text_atomic(dir / "tokenizer_config.json", tok_cfg.dump(2) + "\n");
    io::write_text_atomic(dir / "special_tokens_map.json", special.dump(2) + "\n");
  }
  io::write_text_atomic(dir / "preprocessor_config.json",
                    data::preprocessor_config_json(image).dump(2) + "\n");
}

}  // namespace mmpost::hub
