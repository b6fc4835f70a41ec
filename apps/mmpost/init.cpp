// mmpost init: a LLaVA-style model folder on a pretrained language model (hub::compose_vlm):
//   mmpost init --language-model SMOLLM2_DIR --config vision.json --out DIR [--seed N]
//   mmpost init --language-model SMOLLM2_DIR --vision-from LLAVA_DIR --out DIR
// --config holds LLaVA config.json fields besides the text model (a file or inline JSON):
//   {"vision_config": {"hidden_size": 64, ...}, "projector_hidden_act": "gelu"}
// Writes the folder (config.json, model.safetensors, tokenizer with <image>, chat template,
// preprocessor_config.json) and prints one JSON summary on stdout; logs go to stderr.
#include <filesystem>
#include <fstream>
#include <iostream>

#include "mmpost/cli_common.h"
#include "mmpost/core/check.h"
#include "mmpost/core/log.h"
#include "mmpost/hub/compose.h"
#include "mmpost/model/config.h"

namespace mmpost::cli {
namespace fs = std::filesystem;

namespace {
struct InitArgs {
  std::string language_model, config, vision_from, out;
  int64_t seed = 0;
  bool force = false;
};

nlohmann::json read_config_arg(const std::string& arg) {
  if (arg.empty()) return nlohmann::json::object();
  const bool inline_json = !arg.empty() && arg.front() == '{';
  std::string text = arg;
  if (!inline_json) {
    std::ifstream in(arg);
    MMPOST_CHECK_USAGE(in.good(), "--config ", arg, ": cannot open (a file, or inline JSON)");
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(ErrorKind::kUsage, "--config " + (inline_json ? std::string("(inline)") : arg) +
                                       ": invalid JSON: " + e.what());
  }
}

int run_init(const InitArgs& a) {
  const fs::path out(a.out);
  MMPOST_CHECK_USAGE(a.force || !fs::exists(out / "config.json"), out.string(),
                     ": already holds a model (config.json); pass --force to overwrite");
  hub::ComposeOptions o;
  o.language_model = a.language_model;
  o.vlm_config = read_config_arg(a.config);
  o.vision_from = a.vision_from;
  o.seed = a.seed;
  auto c = hub::compose_vlm(o);
  for (const auto& n : c.notes) log_info("init: " + n);
  hub::save_pretrained(out, c.pretrained.model, c.pretrained.tokenizer_path, c.pretrained.image,
                       torch::kFloat32, int64_t{5} << 30, c.tokenizer.get());
  const auto n = model::param_counts(c.pretrained.config);
  log_info("init: wrote " + out.string());
  std::cout << nlohmann::json({{"out", out.string()},
                               {"image_token_index", c.pretrained.config.image_token_index},
                               {"vocab_size", c.pretrained.config.text_config.vocab_size},
                               {"params", {{"vision_tower", n.vision_tower},
                                           {"projector", n.projector},
                                           {"language_model", n.language_model}}}})
                   .dump()
            << std::endl;
  return 0;
}
}  // namespace

Stage setup_init(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "init", "a LLaVA-style model folder on a pretrained language model (e.g. SmolLM2)");
  static InitArgs a;
  sub->add_option("--language-model", a.language_model,
                  "LlamaForCausalLM folder (config.json, safetensors, tokenizer)")
      ->required();
  sub->add_option("--config", a.config,
                  "LLaVA config fields besides the text model: a JSON file or inline JSON "
                  "(vision_config, projector_hidden_act, vision_feature_layer, ...)");
  sub->add_option("--vision-from", a.vision_from,
                  "LLaVA folder whose vision tower (and projector, if it fits) to take");
  sub->add_option("--out", a.out, "output model folder")->required();
  sub->add_option("--seed", a.seed, "seed of the new weights (default 0)");
  sub->add_flag("--force", a.force, "overwrite a model already in --out");
  return {sub, [] { return run_init(a); }};
}

}  // namespace mmpost::cli
