// Training checkpoint save/restore (see checkpointing.h).
#include "mmpost/train/checkpointing.h"

#include <fstream>

#include "mmpost/core/check.h"
#include "mmpost/io/checkpoint.h"
#include "mmpost/io/hf_folder.h"
#include "mmpost/io/safetensors.h"

namespace mmpost::train {
namespace fs = std::filesystem;

fs::path save_checkpoint(const fs::path& output_dir, const TrainState& state, model::Vlm& model,
                         const fs::path& tokenizer_path, const data::ImageProcessorConfig& image,
                         torch::optim::Optimizer& optimizer, const nlohmann::json& recipe,
                         int64_t keep_last, const data::Tokenizer* tokenizer,
                                      const std::map<std::string, torch::Tensor>& extra_tensors) {
  fs::path dir = io::step_dir(output_dir, state.step);
  if (fs::exists(dir)) fs::remove_all(dir);  // a stale, incomplete folder from a crash
  io::save_pretrained(dir, model, tokenizer_path, image, torch::kFloat32, int64_t{5} << 30,
                      tokenizer);
  try {
    torch::save(optimizer, (dir / "optimizer.pt").string());
    torch::save(at::detail::getDefaultCPUGenerator().get_state(), (dir / "rng.pt").string());
  } catch (const c10::Error& e) {
    throw Error(ErrorKind::kRuntime, dir.string() + ": cannot write optimizer/RNG state: " +
                                         e.what_without_backtrace(),
                "check free disk space; the previous checkpoint is intact");
  }
  nlohmann::json j = {{"format_version", kStateFormatVersion},
                      {"step", state.step},
                      {"loader", {{"epoch", state.loader.epoch}, {"consumed", state.loader.consumed}}},
                      {"n_skipped", state.n_skipped},
                      {"tokens_seen", state.tokens_seen},
                      {"extra", state.extra},
                      {"recipe", recipe}};
  if (!extra_tensors.empty()) io::save_safetensors(dir / "extra.safetensors", extra_tensors);
  io::write_text_atomic(dir / "state.json", j.dump(2) + "\n");
  io::mark_done(dir);
  io::prune_checkpoints(output_dir, static_cast<int>(keep_last));
  return dir;
}

TrainState read_train_state(const fs::path& dir) {
  std::ifstream in(dir / "state.json");
  MMPOST_CHECK(in.good(), (dir / "state.json").string(), ": missing");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
    MMPOST_CHECK(j.at("format_version").get<int64_t>() == kStateFormatVersion,
                 (dir / "state.json").string(), ": format_version ", j.at("format_version").dump(),
                 " is not supported (expected ", kStateFormatVersion, ")");
    TrainState s;
    s.step = j.at("step").get<int64_t>();
    s.loader.epoch = j.at("loader").at("epoch").get<int64_t>();
    s.loader.consumed = j.at("loader").at("consumed").get<int64_t>();
    s.n_skipped = j.value("n_skipped", int64_t{0});
    s.tokens_seen = j.value("tokens_seen", int64_t{0});
    s.extra = j.value("extra", nlohmann::json::object());
    return s;
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorKind::kRuntime, (dir / "state.json").string() + ": " + e.what());
  }
}

void load_optimizer_and_rng(const fs::path& dir, torch::optim::Optimizer& optimizer) {
  try {
    torch::load(optimizer, (dir / "optimizer.pt").string());
    torch::Tensor rng;
    torch::load(rng, (dir / "rng.pt").string());
    auto gen = at::detail::getDefaultCPUGenerator();
    gen.set_state(rng);
  } catch (const c10::Error& e) {
    throw Error(ErrorKind::kRuntime,
                dir.string() + ": cannot restore optimizer/RNG state: " + e.what_without_backtrace());
  }
}

std::map<std::string, torch::Tensor> load_extra_tensors(const std::filesystem::path& dir) {
  if (!std::filesystem::exists(dir / "extra.safetensors")) return {};
  return io::load_safetensors(dir / "extra.safetensors");
}

}  // namespace mmpost::train
