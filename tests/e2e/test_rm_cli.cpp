// End-to-end: `mmpost rm` on a tiny SFT model and digit preference pairs (chosen = the digit the
// image shows, rejected = another digit). Every seed overfits 8 pairs to pairwise accuracy 1.0 (an
// invariant, not a threshold on a trajectory), the final folder is a reward model that hub::load_reward_model reads back and that scores the
// pairs exactly as the run's own final eval did, and checkpoints carry the score head.
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "catch.h"
#include "e2e_util.h"
#include "mmpost/data/preference_dataset.h"
#include "mmpost/hub/reward_model_folder.h"
#include "mmpost/io/jsonl.h"
#include "mmpost/model/reward_model.h"
#include "mmpost/stage_common.h"
#include "test_util.h"

namespace e2e_test_rm_cli {

namespace fs = std::filesystem;
using namespace mmpost;
using mmpost::testing::read_lines_with;

namespace {
struct RunResult {
  int code;
  std::string err;
};

/// Runs the mmpost binary from the repo root; returns exit code and stderr.
RunResult run_mmpost(const std::string& args, const fs::path& tmp) {
  std::string cmd = std::string("cd ") + MMPOST_SOURCE_DIR + " && " + MMPOST_BINARY + " " + args +
                    " > " + (tmp / "stdout.txt").string() + " 2> " + (tmp / "stderr.txt").string();
  int status = std::system(cmd.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1,
          testing::read_all(tmp / "stderr.txt")};
}

/// The first n digits-vqa records as preference pairs with absolute image paths:
/// chosen = the reference digit, rejected = (digit + 1 + i % 9) % 10 (never the same digit).
fs::path write_digit_pairs(const fs::path& dir, int n, bool tag = false) {
  const fs::path src_dir = fs::path(MMPOST_SOURCE_DIR) / "data" / "digits-vqa";
  std::ifstream src(src_dir / "train.jsonl");
  fs::path out = dir / "pairs.jsonl";
  std::ofstream dst(out);
  std::string line;
  for (int i = 0; i < n && std::getline(src, line); ++i) {
    auto rec = nlohmann::json::parse(line);
    const auto& msgs = rec["messages"];
    std::string digit = msgs[1]["content"].get<std::string>();
    std::string other = std::to_string((std::stoi(digit) + 1 + i % 9) % 10);
    auto prompt = msgs[0];
    // A per-record tag makes each pair memorizable even where the tiny vision tower cannot yet
    // tell two 8x8 digits apart.
    if (tag) prompt["content"] = prompt["content"].get<std::string>() + " Record " + std::to_string(i) + ".";
    nlohmann::json pair = {
        {"id", rec["id"]},
        {"images", {(src_dir / rec["images"][0].get<std::string>()).string()}},
        {"prompt", {prompt}},
        {"chosen", {{{"role", "assistant"}, {"content", digit}}}},
        {"rejected", {{{"role", "assistant"}, {"content", other}}}}};
    dst << pair.dump() << "\n";
  }
  return out;
}

/// A 2-step tiny SFT model under `dir` and 16 digit pairs: the start of an `rm` command line on
/// them, without eval.
std::string two_step_rm_base(const fs::path& dir) {
  auto sft = run_mmpost("sft -r recipes/tiny/sft-tiny.json --set data.eval='\"\"' "
                        "train.max_steps=2 --output " + (dir / "sft").string(),
                        dir);
  REQUIRE(sft.code == 0);
  const fs::path pairs = write_digit_pairs(dir, 16);
  return "rm -r recipes/tiny/rm-tiny.json --set model.path=" + (dir / "sft").string() +
         " data.train=" + pairs.string() + " data.eval='\"\"' ";
}

}  // namespace

TEST_CASE("rm trains a reward model on digit pairs and the folder loads back", "[e2e]") {
  testing::TempDir tmp("e2e_rm");
  auto sft = run_mmpost("sft -r recipes/tiny/sft-tiny.json --set data.eval='\"\"' "
                        "train.save_every_n_steps=0 --output " + (tmp.path / "sft").string(),
                        tmp.path);
  INFO(sft.err);
  REQUIRE(sft.code == 0);
  const fs::path pairs = write_digit_pairs(tmp.path, 8, /*tag=*/true);
  for (int seed : {2, 3}) {  // seed 1 is the run checked in detail below
    INFO("seed " << seed);
    auto other = tmp.path / ("rm_seed" + std::to_string(seed));
    auto r = run_mmpost("rm -r recipes/tiny/rm-tiny.json --seed " + std::to_string(seed) +
                            " --set model.path=" + (tmp.path / "sft").string() +
                            " data.train=" + pairs.string() + " data.eval=" + pairs.string() +
                            " train.batch_size=8 train.max_steps=150 rm.center_rewards_coefficient=0"
                            " train.save_every_n_steps=0 --output " + other.string(),
                        tmp.path);
    INFO(r.err);
    REQUIRE(r.code == 0);
    auto e = read_lines_with(other / "metrics.jsonl", "eval/accuracy");
    REQUIRE(!e.empty());
    CHECK(e.back()["eval/accuracy"].get<double>() == 1.0);
  }
  const fs::path out = tmp.path / "rm";
  auto rm = run_mmpost("rm -r recipes/tiny/rm-tiny.json --set model.path=" +
                           (tmp.path / "sft").string() + " data.train=" + pairs.string() +
                           " data.eval=" + pairs.string() + " train.batch_size=8 "
                           "train.max_steps=150 train.log_every_n_steps=15 "
                           "train.save_every_n_steps=75 rm.center_rewards_coefficient=0 "
                           "--output " + out.string(),
                       tmp.path);
  INFO(rm.err);
  REQUIRE(rm.code == 0);

  // Training metrics: TRL's names.
  auto m = read_lines_with(out / "metrics.jsonl", "loss");
  REQUIRE(m.size() == 10);  // steps 15..150
  for (const char* k : {"accuracy", "rewards/chosen", "rewards/rejected", "rewards/margins",
                        "grad_norm", "lr", "tokens_per_s", "pairs_per_s"}) {
    CHECK(m.back().contains(k));
  }
  // Final eval on the 8 training pairs: memorized, for every seed.
  auto e = read_lines_with(out / "metrics.jsonl", "eval/accuracy");
  REQUIRE(!e.empty());
  const auto& final_eval = e.back();
  CHECK(final_eval["eval/n"] == 8);
  CHECK(final_eval["eval/accuracy"].get<double>() == 1.0);

  // Folder format; checkpoints carry the head.
  CHECK(fs::exists(out / hub::kRewardHeadFile));
  CHECK(fs::exists(out / "step_000075" / hub::kRewardHeadFile));
  CHECK(fs::exists(out / "step_000150" / "DONE"));

  // load_reward_model gives the rewards the run's final eval saw.
  auto loaded = hub::load_reward_model(out);
  config::ModelSection ms;
  ms.path = out.string();
  auto sm = cli::load_stage_model(ms, config::ImageSection{}, std::nullopt, torch::kCPU,
                                  torch::kFloat32, "test");
  auto ctx = cli::make_sample_context(sm, config::DataSection{}, pairs.string());
  ctx.max_length = 64;
  std::vector<data::PreferenceSample> samples;
  io::JsonlReader r(pairs);
  io::JsonlRecord rec;
  while (r.next(rec)) {
    samples.push_back(data::make_preference_sample(rec.value, rec.line, ctx, {0, 0, 64}));
  }
  auto b = data::collate_preference(samples, cli::pad_id_of(*sm.tokenizer));
  torch::NoGradGuard no_grad;
  auto f = loaded.model->model->image_features(b.pixel_values);
  auto rewards = loaded.model->forward_features(b.input_ids, torch::cat({f, f}),
                                                b.attention_mask);  // [16]
  auto rc = rewards.narrow(0, 0, 8), rr = rewards.narrow(0, 8, 8);
  CHECK(rc.mean().item<double>() ==
        Approx(final_eval["eval/rewards/chosen"].get<double>()).margin(1e-4));
  CHECK(rr.mean().item<double>() ==
        Approx(final_eval["eval/rewards/rejected"].get<double>()).margin(1e-4));
  CHECK((rc > rr).to(torch::kFloat64).mean().item<double>() ==
        Approx(final_eval["eval/accuracy"].get<double>()));
}

TEST_CASE("rm resume: 2 steps + resume + 2 steps equals 4 straight steps (head included)",
          "[e2e]") {
  testing::TempDir tmp("e2e_rm_resume");
  const std::string base =
      two_step_rm_base(tmp.path) + "train.save_every_n_steps=2 data.shuffle_buffer=8 ";
  REQUIRE(run_mmpost(base + "train.max_steps=4 --output " + (tmp.path / "a").string(), tmp.path)
              .code == 0);
  REQUIRE(run_mmpost(base + "train.max_steps=2 --output " + (tmp.path / "b").string(), tmp.path)
              .code == 0);
  auto b2 = run_mmpost(base + "train.max_steps=4 --output " + (tmp.path / "b").string(), tmp.path);
  INFO(b2.err);
  REQUIRE(b2.code == 0);
  CHECK(b2.err.find("resumed from") != std::string::npos);
  for (const char* f : {"model.safetensors", hub::kRewardHeadFile}) {
    INFO(f);
    CHECK(testing::read_all(tmp.path / "a" / f) == testing::read_all(tmp.path / "b" / f));
  }
}

TEST_CASE("rm rejects a negative center_rewards_coefficient with exit 2", "[e2e]") {
  testing::TempDir tmp("e2e_rm_bad");
  auto r = run_mmpost("rm -r recipes/tiny/rm-tiny.json --set rm.center_rewards_coefficient=-1 "
                      "--output " + (tmp.path / "x").string(),
                      tmp.path);
  CHECK(r.code == 2);
  CHECK(r.err.find("rm.center_rewards_coefficient") != std::string::npos);
}

TEST_CASE("rm train.cpu_shards=2 gives the unsharded steps, and lora.dropout refuses it",
          "[e2e]") {
  testing::TempDir tmp("e2e_rm_shards");
  // 7 pairs per micro-batch: shards of 4 and 3 (the means weighted by their pairs); centering
  // on, so both Bradley-Terry terms split.
  const std::string base = two_step_rm_base(tmp.path) +
                           "train.save_every_n_steps=0 data.shuffle_buffer=0 num_threads=2"
                           " train.batch_size=7 train.max_steps=3 train.log_every_n_steps=1 ";
  auto one = run_mmpost(base + "train.cpu_shards=1 --output " + (tmp.path / "one").string(), tmp.path);
  auto two = run_mmpost(base + "train.cpu_shards=2 --output " + (tmp.path / "two").string(), tmp.path);
  INFO(two.err);
  REQUIRE(one.code == 0);
  REQUIRE(two.code == 0);
  CHECK(two.err.find("train.cpu_shards 2") != std::string::npos);
  auto a = read_lines_with(tmp.path / "one" / "metrics.jsonl", "loss");
  auto b = read_lines_with(tmp.path / "two" / "metrics.jsonl", "loss");
  REQUIRE(a.size() == 3);
  REQUIRE(b.size() == 3);
  for (size_t i = 0; i < 3; ++i) {
    // (not accuracy: a count of signs, which rounding may flip where a margin is ~0)
    for (const char* k : {"loss", "grad_norm", "rewards/chosen", "rewards/margins"}) {
      INFO("step " << i + 1 << " " << k);
      const double x = a[i][k].get<double>(), y = b[i][k].get<double>();
      CHECK(std::abs(x - y) <= 1e-5 * std::max(1.0, std::abs(x)));
    }
  }
  auto bad = run_mmpost(base + "lora.r=2 lora.dropout=0.1 train.cpu_shards=2 --output " +
                            (tmp.path / "bad").string(),
                        tmp.path);
  CHECK(bad.code == 2);
  CHECK(bad.err.find("train.cpu_shards") != std::string::npos);
  CHECK(bad.err.find("lora.dropout") != std::string::npos);
}

}  // namespace e2e_test_rm_cli
