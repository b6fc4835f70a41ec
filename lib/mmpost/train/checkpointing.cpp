// Training checkpoint save/restore (see checkpointing.h).
#include "mmpost/train/checkpointing.h"

#include <fcntl.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "mmpost/core/check.h"
#include "mmpost/core/log.h"
#include "mmpost/hub/hf_folder.h"
#include "mmpost/hub/reward_model_folder.h"
#include "mmpost/io/atomic_file.h"
#include "mmpost/io/checkpoint.h"
#include "mmpost/io/safetensors.h"

namespace mmpost::train {
namespace fs = std::filesystem;

namespace {

/// Streams torch::save's output of `value` into an AtomicFile (fsynced, renamed at the end),
/// without a copy of the bytes in memory (AdamW's state at 100M parameters is 800 MB). Write
/// errors (disk full) are held back until torch's writer is done and then thrown: failing inside
/// its callback would make its destructor abort the process.
template <class T>
void save_torch_atomic(const T& value, const fs::path& file) {
  io::AtomicFile f(file);
  std::exception_ptr error;
  torch::save(value, [&](const void* data, size_t n) -> size_t {
    if (!error) {
      try {
        f.write(data, n);
      } catch (...) {
        error = std::current_exception();
      }
    }
    return n;
  });
  if (error) std::rethrow_exception(error);
  f.commit();
}

void fsync_dir(const fs::path& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}


}  // namespace

void save_model_bundle(const fs::path& dir, const ModelBundle& b) {
  const fs::path tok_path = b.tokenizer ? fs::path(b.tokenizer->path()) : fs::path();
  if (b.reward_model) {
    auto rm = b.reward_model;
    hub::save_reward_model(dir, rm, tok_path, b.image, b.tokenizer);
  } else {
    auto vlm = b.vlm;
    hub::save_pretrained(dir, vlm, tok_path, b.image, torch::kFloat32, int64_t{5} << 30,
                         b.tokenizer);
  }
  if (b.lora != nullptr && b.lora->size() > 0 && !b.lora->named_parameters().empty()) {
    hub::save_lora_adapter(dir, *b.vlm, *b.lora, b.lora_modules_to_save, b.lora_base_model);
  } else {
    // A folder reused by a run without an adapter (or with a merged one): an earlier run's
    // adapter files would be merged again on load.
    fs::remove(dir / "adapter_config.json");
    fs::remove(dir / "adapter_model.safetensors");
  }
  if (b.value_head) {
    io::save_safetensors(dir / kValueHeadFile,
                         {{"weight", b.value_head->weight}, {"bias", b.value_head->bias}});
  }
}

void load_value_head(torch::nn::Linear& head, const fs::path& dir) {
  const fs::path file = dir / kValueHeadFile;
  MMPOST_CHECK(fs::is_regular_file(file), file.string(), ": missing (a PPO checkpoint holds the "
               "value head)");
  auto t = io::load_safetensors(file);
  MMPOST_CHECK(t.count("weight") && t.count("bias") &&
                   t.at("weight").sizes() == head->weight.sizes() &&
                   t.at("bias").sizes() == head->bias.sizes(),
               file.string(), ": expected weight ", head->weight.sizes(), " and bias ",
               head->bias.sizes());
  torch::NoGradGuard no_grad;
  head->weight.copy_(t.at("weight"));
  head->bias.copy_(t.at("bias"));
}

Checkpointer::Checkpointer(fs::path output_dir, int64_t keep_last, ModelBundle bundle,
                           Optimizer& optimizer, int64_t last_saved_step, bool writer)
    : out_(std::move(output_dir)), keep_last_(keep_last), bundle_(std::move(bundle)),
      optimizer_(optimizer), last_saved_(last_saved_step), writer_(writer) {
  torch::nn::Module* m = bundle_.reward_model ? static_cast<torch::nn::Module*>(
                                                    bundle_.reward_model.ptr().get())
                                              : bundle_.vlm.ptr().get();
  for (const auto& p : m->parameters()) bytes_needed_ += p.numel() * 4;  // saved as float32
  if (bundle_.value_head) bytes_needed_ += (bundle_.value_head->weight.numel() + 1) * 4;
  bytes_needed_ += optimizer_.state_bytes_estimate();  // AdamW m and v
  if (bundle_.tokenizer) bytes_needed_ += bundle_.tokenizer->model_bytes().size();
  bytes_needed_ += bytes_needed_ / 20 + (uint64_t{256} << 10);  // headers, json, file system
}

fs::path Checkpointer::save(const TrainState& state, const nlohmann::json& recipe) {
  const fs::path dir = io::step_dir(out_, state.step);
  if (state.step == last_saved_) return dir;  // a stop signal on a save step (or the resumed one)
  const auto optimizer_state = optimizer_.checkpoint_state();  // collective under ZeRO-1
  if (!writer_) {
    last_saved_ = state.step;
    return dir;
  }
  const fs::path tmp = out_ / ("." + dir.filename().string() + ".tmp." + std::to_string(::getpid()));
  try {
    io::check_free_space(out_, bytes_needed_);
    fs::remove_all(tmp);
    fs::create_directories(tmp);
    save_model_bundle(tmp, bundle_);
    TORCH_CHECK(optimizer_state != nullptr, "the checkpoint writer holds no optimizer state");
    save_torch_atomic(*optimizer_state, tmp / "optimizer.pt");
    save_torch_atomic(at::detail::getDefaultCPUGenerator().get_state(), tmp / "rng.pt");
    nlohmann::json j = {
        {"format_version", kStateFormatVersion},
        {"step", state.step},
        {"loader", {{"epoch", state.loader.epoch}, {"consumed", state.loader.consumed}}},
        {"n_skipped", state.n_skipped},
        {"tokens_seen", state.tokens_seen},
        {"extra", state.extra},
        {"recipe", recipe}};
    io::write_text_atomic(tmp / "state.json", j.dump(2) + "\n");
    io::mark_done(tmp);
    // An older folder of this step can only be a crash leftover without DONE (a complete one was
    // skipped above, or belongs to the run we resumed from): replace it.
    if (fs::exists(dir)) fs::remove_all(dir);
    fs::rename(tmp, dir);
    fsync_dir(out_);
  } catch (const std::exception& e) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    auto prev = io::latest_complete_checkpoint(out_);
    std::string what = e.what();
    if (auto* te = dynamic_cast<const c10::Error*>(&e)) what = te->what_without_backtrace();
    throw Error(ErrorKind::kRuntime,
                dir.string() + ": cannot write the checkpoint (needs about " + io::format_bytes(bytes_needed_) +
                    "): " + what,
                prev ? "the previous checkpoint " + prev->string() + " is intact; free disk space "
                           "and rerun the same command to resume from it"
                     : "no checkpoint was written; free disk space and rerun");
  }
  last_saved_ = state.step;
  io::prune_checkpoints(out_, static_cast<int>(keep_last_));
  return dir;
}

void Checkpointer::export_final() {
  if (!writer_) return;
  try {
    io::check_free_space(out_, bytes_needed_);
    if (bundle_.lora != nullptr && bundle_.lora_merge_on_save) {
      bundle_.lora->merge_and_unload();  // the run is over: the live model becomes the merged one
      ModelBundle merged = bundle_;
      merged.lora = nullptr;
      save_model_bundle(out_, merged);
    } else {
      save_model_bundle(out_, bundle_);
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    std::string what = e.what();
    if (auto* te = dynamic_cast<const c10::Error*>(&e)) what = te->what_without_backtrace();
    throw Error(ErrorKind::kRuntime, out_.string() + ": cannot write the final model: " + what,
                "the last checkpoint is intact; free disk space and rerun to finish the export");
  }
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
    s.recipe = j.value("recipe", nlohmann::json());
    return s;
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorKind::kRuntime, (dir / "state.json").string() + ": " + e.what());
  }
}

void load_optimizer_and_rng(const fs::path& dir, Optimizer& optimizer) {
  optimizer.load_state(dir / "optimizer.pt");
  try {
    torch::Tensor rng;
    torch::load(rng, (dir / "rng.pt").string());
    auto gen = at::detail::getDefaultCPUGenerator();
    gen.set_state(rng);
  } catch (const c10::Error& e) {
    throw Error(ErrorKind::kRuntime,
                dir.string() + ": cannot restore optimizer/RNG state: " + e.what_without_backtrace());
  }
}

}  // namespace mmpost::train
