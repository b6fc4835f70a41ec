// Reward model: VLM + scalar head, and its folder format (see reward_model.h).
#include "mmpost/model/reward_model.h"

#include <fstream>

#include <nlohmann/json.hpp>

#include "mmpost/core/check.h"
#include "mmpost/io/checkpoint.h"
#include "mmpost/io/hf_folder.h"
#include "mmpost/io/safetensors.h"

namespace mmpost::model {
namespace fs = std::filesystem;

torch::Tensor last_token_hidden(const torch::Tensor& hidden, const torch::Tensor& attention_mask) {
  TORCH_CHECK(hidden.dim() == 3 && attention_mask.dim() == 2 &&
                  hidden.size(0) == attention_mask.size(0) &&
                  hidden.size(1) == attention_mask.size(1),
              "last_token_hidden: hidden [B, T, C] and attention_mask [B, T] expected, got ",
              hidden.sizes(), " and ", attention_mask.sizes());
  const int64_t T = attention_mask.size(1);
  auto pos = torch::arange(T, attention_mask.options().dtype(torch::kLong));  // [T]
  auto last = (pos * (attention_mask != 0).to(torch::kLong)).amax(/*dim=*/-1);  // [B]
  auto index = last.view({-1, 1, 1}).expand({hidden.size(0), 1, hidden.size(2)});
  return hidden.gather(/*dim=*/1, index).squeeze(1);  // [B, C]
}

RewardModelImpl::RewardModelImpl(Vlm vlm, double init_std) {
  const int64_t C = vlm->config().text_config.hidden_size;
  model = register_module("model", std::move(vlm));
  score = register_module("score", torch::nn::Linear(torch::nn::LinearOptions(C, 1).bias(false)));
  {
    torch::NoGradGuard no_grad;
    score->weight.normal_(0.0, init_std);
  }
  auto params = model->parameters();
  if (!params.empty()) score->to(params.front().device(), params.front().scalar_type());
}

torch::Tensor RewardModelImpl::forward_features(const torch::Tensor& input_ids,
                                                const torch::Tensor& features,
                                                const torch::Tensor& attention_mask) {
  auto mask = attention_mask.defined() ? attention_mask : torch::ones_like(input_ids);
  auto hidden = model->forward_hidden_features(input_ids, features, mask);  // [B, T, C]
  auto last = last_token_hidden(hidden, mask);                              // [B, C]
  return score(last).squeeze(-1).to(torch::kFloat32);                      // [B]
}

torch::Tensor RewardModelImpl::forward(const torch::Tensor& input_ids,
                                       const torch::Tensor& pixel_values,
                                       const torch::Tensor& attention_mask) {
  const bool has_images = pixel_values.defined() && pixel_values.size(0) > 0;
  return forward_features(input_ids, has_images ? model->image_features(pixel_values)
                                                : torch::Tensor(),
                          attention_mask);
}

void save_reward_model(const fs::path& dir, RewardModel& rm, const fs::path& tokenizer_path,
                       const data::ImageProcessorConfig& image, const data::Tokenizer* tokenizer) {
  io::save_pretrained(dir, rm->model, tokenizer_path, image, torch::kFloat32, int64_t{5} << 30,
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

void load_reward_head(RewardModel& rm, const fs::path& dir) {
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
  auto p = io::load_pretrained(dir);
  PretrainedRewardModel out;
  out.model = RewardModel(p.model);
  load_reward_head(out.model, dir);
  out.model->eval();
  out.tokenizer_path = p.tokenizer_path;
  out.image = p.image;
  return out;
}

}  // namespace mmpost::model
