// Qwen2-VL family folders (see qwen2_vl_folder.h).
#include "mmpost/hub/qwen2_vl_folder.h"

#include "mmpost/core/check.h"
#include "mmpost/io/atomic_file.h"
#include "mmpost/io/checkpoint.h"
#include "mmpost/io/jsonl.h"
#include "mmpost/io/safetensors.h"

#include <fstream>
#include <iterator>

namespace mmpost::hub {
namespace fs = std::filesystem;

namespace {
// Tokenizer and chat files a Qwen2-VL folder carries; copied as they are.
const char* const kTokenizerFiles[] = {"tokenizer.json", "tokenizer_config.json", "vocab.json",
                                       "merges.txt", "special_tokens_map.json",
                                       "added_tokens.json", "chat_template.json",
                                       "chat_template.jinja", "generation_config.json"};
}  // namespace

bool is_qwen2_vl_folder(const fs::path& dir) {
  const fs::path file = dir / "config.json";
  if (!fs::is_regular_file(file)) return false;
  return model::is_qwen2_vl_config(io::read_json_object_file(file));
}

Qwen2VLPretrained load_qwen2_vl_pretrained(const fs::path& dir) {
  const fs::path cfg_path = dir / "config.json";
  MMPOST_CHECK_USAGE(fs::is_regular_file(cfg_path), cfg_path.string(), ": not found");
  Qwen2VLPretrained p;
  try {
    p.config = model::qwen2_vl_config_from_json(io::read_json_object_file(cfg_path));
  } catch (const Error& e) {  // "config.json: PATH" -> "DIR/config.json: PATH"
    std::string m = e.message();
    if (m.rfind("config.json: ", 0) == 0) m = cfg_path.string() + m.substr(11);
    throw Error(e.kind(), m, e.hint());
  }
  p.model = model::build_qwen2_vl(p.config);
  model::load_qwen2_vl_weights(*p.model, io::load_safetensors(dir), dir.string());
  const fs::path proc = dir / "preprocessor_config.json";
  if (fs::is_regular_file(proc)) {
    p.image = data::read_qwen2_vl_preprocessor_config(proc.string());
    p.has_processor_config = true;
    MMPOST_CHECK_USAGE(p.image.patch_size == p.config.vision_config.patch_size &&
                           p.image.merge_size == p.config.vision_config.spatial_merge_size &&
                           p.image.temporal_patch_size == p.config.vision_config.temporal_patch_size,
                       proc.string(), ": patch_size ", p.image.patch_size, ", merge_size ",
                       p.image.merge_size, ", temporal_patch_size ", p.image.temporal_patch_size,
                       " differ from config.json's vision_config (", p.config.vision_config.patch_size,
                       ", ", p.config.vision_config.spatial_merge_size, ", ",
                       p.config.vision_config.temporal_patch_size, ")");
  }
  return p;
}

void save_qwen2_vl_pretrained(const fs::path& dir, const model::Qwen2VLImpl& model,
                              const data::Qwen2VLImageConfig& image, const fs::path& tokenizer_dir,
                              torch::Dtype save_dtype, int64_t max_shard_bytes) {
  fs::create_directories(dir);
  auto tensors = model::qwen2_vl_state_dict(model);
  uint64_t bytes = 0;
  for (auto& [name, t] : tensors) {
    if (t.is_floating_point()) t = t.to(save_dtype);
    bytes += t.numel() * t.element_size();
  }
  io::check_free_space(dir, bytes + (bytes / 10) + (1 << 20));
  nlohmann::json cfg = model::qwen2_vl_config_to_json(model.config());
  cfg["dtype"] = save_dtype == torch::kBFloat16 ? "bfloat16"
                 : save_dtype == torch::kFloat16 ? "float16" : "float32";
  io::write_text_atomic(dir / "config.json", cfg.dump(2) + "\n");
  io::save_safetensors_sharded(dir, tensors, max_shard_bytes);
  io::write_text_atomic(dir / "preprocessor_config.json",
                        data::qwen2_vl_preprocessor_config_json(image).dump(2) + "\n");
  if (tokenizer_dir.empty() || !fs::is_directory(tokenizer_dir) || fs::equivalent(tokenizer_dir, dir))
    return;
  for (const char* name : kTokenizerFiles) {
    const fs::path src = tokenizer_dir / name;
    if (!fs::is_regular_file(src)) continue;
    std::ifstream in(src, std::ios::binary);
    MMPOST_CHECK(in.good(), src.string(), ": cannot read");
    std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    io::write_text_atomic(dir / name, content);
  }
}

}  // namespace mmpost::hub
