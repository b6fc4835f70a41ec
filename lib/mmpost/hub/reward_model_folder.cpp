// Reward-model folder save/load (see hub/reward_model_folder.h).
#include "mmpost/hub/reward_model_folder.h"

#include <fstream>

#include <nlohmann/json.hpp>

#include "mmpost/core/check.h"
#include "mmpost/hub/hf_folder.h"
#include "mmpost/io/checkpoint.h"
#include "mmpost/io/safetensors.h"

namespace mmpost::hub {
namespace fs = std::filesystem;

void save_reward_model(const fs::path& dir, model::RewardModel& rm, const fs::path& tokenizer_path,
                       const data::ImageProcessorConfig& image, const data::Tokenizer* tokenizer) {
  save_pretrained(dir, rm->model, tokenizer_path, image, torch::kFloat32, int64_t{5} << 30,
                  tokenizer);
  io::save_safetensors(dir / kRewardHeadFile,
                       {{"score.weight", rm->score->weight.detach().to(torch::kFloat32)}},
                       {{"format", "pt"}, {"mmpost", "reward_head"}});
  // config.json last: its reward-model keys promise a head that is already on disk.
  const fs::path cfg_path = dir / "config.json";
  std::ifstream in(cfg_path);
  MMPOST_CHECK(in.good(), cfg_path.string(), ": cannot read back");
  auto j = nlohmann::json::parse(in);
  j["num_labels"] = 1;
  j["mmpost_reward_model"] = {{"format_version", kRewardModelFormatVersion},
                              {"head", kRewardHeadFile}};
  io::write_text_atomic(cfg_path, j.dump(2) + "\n");
}

bool has_reward_head(const fs::path& dir) { return fs::is_regular_file(dir / kRewardHeadFile); }

void load_reward_head(model::RewardModel& rm, const fs::path& dir) {
  if (!has_reward_head(dir)) {
    throw Error(ErrorKind::kUsage,
                dir.string() + ": not a reward model (no " + kRewardHeadFile + ")",
                "train one with `mmpost rm` (its output folder or a step_* checkpoint)");
  }
  const fs::path file = dir / kRewardHeadFile;
  auto tensors = io::load_safetensors(file);
  auto it = tensors.find("score.weight");
  MMPOST_CHECK(it != tensors.end(), file.string(), ": missing tensor score.weight");
  const auto& w = rm->score->weight;
  MMPOST_CHECK(it->second.sizes() == w.sizes(), file.string(), ": score.weight has shape ",
               it->second.sizes(), " but the model needs ", w.sizes(),
               " (text_config.hidden_size differs)");
  torch::NoGradGuard no_grad;
  w.copy_(it->second.to(w.device(), w.scalar_type()));
}

PretrainedRewardModel load_reward_model(const fs::path& dir) {
  MMPOST_CHECK_USAGE(fs::is_directory(dir), dir.string(), ": reward model folder not found");
  if (!has_reward_head(dir)) {
    throw Error(ErrorKind::kUsage,
                dir.string() + ": not a reward model (no " + kRewardHeadFile +
                    "; a plain VLM folder has no score head)",
                "train one with `mmpost rm` and pass its output folder");
  }
  auto p = load_pretrained(dir);
  PretrainedRewardModel out;
  out.model = model::RewardModel(p.model);
  load_reward_head(out.model, dir);
  out.model->eval();
  out.tokenizer_path = p.tokenizer_path;
  out.image = p.image;
  return out;
}

}  // namespace mmpost::hub
