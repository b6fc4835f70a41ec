// End-to-end RL: a tiny SFT policy on digit images, prompts whose verifiable answer is "7".
// Invariants: `mmpost rlhf` (GRPO, exact_match) makes greedy decoding answer "7" on those prompts
// for every seed; groups whose rewards are all equal leave the policy byte-identical; the
// diagnostics are logged; every algorithm runs; checkpoints resume exactly; a bad recipe exits 2.
#include <filesystem>
#include <fstream>

#include "catch.h"
#include "mmpost/io/jsonl.h"
#include "test_util.h"

namespace e2e_test_rlhf_cli {

namespace fs = std::filesystem;
using mmpost::testing::read_all;
using mmpost::testing::run_cli;
using mmpost::testing::TempDir;

namespace {
/// `n` digit prompts from data/digits-vqa/train.jsonl with "answer": "7".
fs::path write_prompts(const fs::path& dir, int n = 64) {
  const fs::path digits = fs::path(MMPOST_SOURCE_DIR) / "data/digits-vqa";
  mmpost::io::JsonlReader in(digits / "train.jsonl");
  mmpost::io::JsonlRecord rec;
  fs::create_directories(dir);
  auto path = dir / "prompts.jsonl";
  std::ofstream out(path);
  for (int i = 0; i < n && in.next(rec); ++i) {
    auto r = rec.value;
    r["images"] = {(digits / r["images"][0].get<std::string>()).string()};
    r["answer"] = "7";
    r["difficulty"] = i % 2;
    out << r.dump() << "\n";
  }
  return path;
}

std::vector<nlohmann::json> step_metrics(const fs::path& file) {
  std::vector<nlohmann::json> out;
  mmpost::io::JsonlReader r(file);
  mmpost::io::JsonlRecord rec;
  while (r.next(rec)) {
    if (rec.value.contains("reward")) out.push_back(rec.value);
  }
  return out;
}
}  // namespace

TEST_CASE("rlhf: GRPO raises a tiny policy's mean reward", "[e2e][rlhf]") {
  TempDir dir("rlhf_e2e");
  auto sft = dir.path / "sft";
  auto r = run_cli("sft -r recipes/tiny/sft-tiny.json --no-resume --output " + sft.string() +
                       " --set data.eval=",
                   dir.path / "log_sft");
  INFO(r.err);
  REQUIRE(r.code == 0);
  auto prompts = write_prompts(dir.path);
  const std::string common = "rlhf -r recipes/tiny/grpo-tiny.json --no-resume --set model.path=" +
                             sft.string() + " --set data.train=" + prompts.string();
  auto run = dir.path / "grpo";
  r = run_cli(common + " --output " + run.string(), dir.path / "log_grpo");
  INFO(r.err);
  REQUIRE(r.code == 0);
  auto m = step_metrics(run / "metrics.jsonl");
  REQUIRE(m.size() == 6);  // every 5 of 30 steps
  for (const char* k :
       {"rewards/exact_match/mean", "rewards/exact_match/std", "frac_reward_zero_std",
        "advantages/mean", "advantages/std", "entropy", "approx_kl", "clip_ratio/region_mean",
        "completions/mean_length", "completions/max_length", "completions/clipped_ratio",
        "grad_norm", "grad_norm/vision_tower", "grad_norm/projector", "grad_norm/language_model",
        "lr", "rollout_tokens_per_s", "update_tokens_per_s", "pass_rate", "curriculum/stage"}) {
    CHECK(m.back().contains(k));
  }
  // GRPO advantages are centred per group.
  CHECK(std::abs(m.back()["advantages/mean"].get<double>()) < 1e-5);
  CHECK(fs::exists(run / "model.safetensors"));

  // Every seed learns the rewarded answer on 8 prompts: greedy decoding then says "7" for all.
  auto eight = write_prompts(dir.path / "eight", 8);
  for (int seed : {1, 2, 3}) {
    INFO("seed " << seed);
    auto out = dir.path / ("seed" + std::to_string(seed));
    r = run_cli("rlhf -r recipes/tiny/grpo-tiny.json --seed " + std::to_string(seed) +
                    " --set model.path=" + sft.string() + " --set data.train=" + eight.string() +
                    " --set data.eval=" + eight.string() + " --output " + out.string(),
                dir.path / "log_seed");
    INFO(r.err);
    REQUIRE(r.code == 0);
    auto summary = nlohmann::json::parse(r.out.substr(r.out.rfind('\n', r.out.size() - 2) + 1));
    CHECK(summary["eval"]["eval/n"] == 8);
    CHECK(summary["eval"]["eval/rewards/exact_match"].get<double>() == 1.0);
  }

  // Rewards that are equal within every group carry no signal: advantages 0, zero gradient, and
  // AdamW (no weight decay) leaves every weight byte-identical.
  auto flat = dir.path / "flat";
  r = run_cli("rlhf -r recipes/tiny/grpo-tiny.json --set model.path=" + sft.string() +
                  " --set data.train=" + eight.string() +
                  " --set rlhf.rewards=[{\\\"name\\\":\\\"format\\\"}] --set train.max_steps=3"
                  " --output " + flat.string(),
              dir.path / "log_flat");
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK(step_metrics(flat / "metrics.jsonl").back()["frac_reward_zero_std"].get<double>() == 1.0);
  CHECK(read_all(flat / "model.safetensors") == read_all(sft / "model.safetensors"));

  // Every algorithm, with a reference model (KL), runs and logs.
  for (const std::string extra :
       {"--set rlhf.algorithm=rloo --set rlhf.beta=0.04",
        "--set rlhf.algorithm=reinforce_pp --set rlhf.beta=0.04 --set rlhf.kl_in_reward=true",
        "--set rlhf.algorithm=reinforce_pp_baseline --set rlhf.kl_estimator=full --set rlhf.beta=0.1",
        "--set rlhf.algorithm=ppo --set rlhf.beta=0.05 --set rlhf.num_generations=2",
        "--set rlhf.loss_type=grpo --set rlhf.importance_sampling_level=sequence "
        "--set rlhf.num_iterations=2 --set rlhf.filter_zero_std_groups=true "
        "--set rlhf.curriculum={\\\"mode\\\":\\\"adaptive\\\"}"}) {
    auto out = dir.path / "alg";
    fs::remove_all(out);
    r = run_cli(common + " --set train.max_steps=4 --set train.log_every_n_steps=2 --output " +
                    out.string() + " " + extra,
                dir.path / "log_alg");
    INFO(extra << "\n" << r.err);
    CHECK(r.code == 0);
    auto am = step_metrics(out / "metrics.jsonl");
    REQUIRE(am.size() == 2);
    CHECK(std::isfinite(am.back()["reward"].get<double>()));
    if (extra.find("beta") != std::string::npos) CHECK(am.back().contains("kl"));
    if (extra.find("ppo") != std::string::npos) CHECK(am.back().contains("value_loss"));
  }

  // Resume: 2 steps + resume + 2 steps == 4 straight steps (weights byte-identical).
  auto straight = dir.path / "straight", resumed = dir.path / "resumed";
  const std::string ppo = " --set rlhf.algorithm=ppo --set rlhf.beta=0.05 --set rlhf.num_generations=2";
  r = run_cli(common + ppo + " --set train.max_steps=4 --output " + straight.string(), dir.path / "l1");
  REQUIRE(r.code == 0);
  r = run_cli(common + ppo + " --set train.max_steps=2 --output " + resumed.string(), dir.path / "l2");
  REQUIRE(r.code == 0);
  const std::string resume_args = "rlhf -r recipes/tiny/grpo-tiny.json --set model.path=" +
                                  sft.string() + " --set data.train=" + prompts.string() + ppo +
                                  " --set train.max_steps=4 --output " + resumed.string();
  r = run_cli(resume_args, dir.path / "l3");
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.err, HasSubstr("resumed from"));
  CHECK(read_all(straight / "model.safetensors") == read_all(resumed / "model.safetensors"));
  CHECK(read_all(straight / "value_head.safetensors") == read_all(resumed / "value_head.safetensors"));

  // A wrong recipe key names its JSON path and exits 2.
  r = run_cli(common + " --set rlhf.num_generation=4 --output " + (dir.path / "x").string(),
              dir.path / "log_bad");
  CHECK(r.code == 2);
  CHECK_THAT(r.err, HasSubstr("rlhf.num_generation") && HasSubstr("num_generations"));
  // rlhf does not split micro-batches into CPU shards: an explicit count is refused, not ignored.
  r = run_cli(common + " --set train.cpu_shards=2 --output " + (dir.path / "y").string(),
              dir.path / "log_shards");
  CHECK(r.code == 2);
  CHECK_THAT(r.err, HasSubstr("train.cpu_shards") && HasSubstr("rlhf does not"));
}

}  // namespace e2e_test_rlhf_cli
