// End-to-end DPO: a tiny SFT model, preference pairs from the digits data (chosen = the right
// digit, rejected = another). Invariants only: step 1 (policy == reference) has loss ln 2 and
// rewards 0; one small batch of pairs is overfit to reward accuracy 1.0 for every seed;
// precomputed reference log-probs give the same run; `mmpost eval` reports the same reward
// accuracy as training's eval; a bad record exits 3 naming FILE:LINE.
#include <filesystem>
#include <fstream>

#include "catch.h"
#include "mmpost/io/jsonl.h"
#include "test_util.h"

namespace e2e_test_dpo_cli {

namespace fs = std::filesystem;
using mmpost::testing::run_cli;
using mmpost::testing::TempDir;

namespace {
/// `n` pairs from data/digits-vqa/train.jsonl; `bad_line` (1-based, 0 = none) lacks "rejected".
fs::path write_prefs(const fs::path& dir, int bad_line = 0, int n = 64) {
  const fs::path digits = fs::path(MMPOST_SOURCE_DIR) / "data/digits-vqa";
  mmpost::io::JsonlReader in(digits / "train.jsonl");
  mmpost::io::JsonlRecord rec;
  auto path = dir / "prefs.jsonl";
  std::ofstream out(path);
  for (int i = 1; i <= n && in.next(rec); ++i) {
    auto& r = rec.value;
    auto answer = r["messages"][1]["content"].get<std::string>();
    nlohmann::json p = {
        {"id", r["id"]},
        {"images", {(digits / r["images"][0].get<std::string>()).string()}},
        {"prompt", {r["messages"][0]}},
        {"chosen", {{{"role", "assistant"}, {"content", answer}}}},
        {"rejected",
         {{{"role", "assistant"}, {"content", std::to_string((std::stoi(answer) + 3) % 10)}}}}};
    if (i == bad_line) p.erase("rejected");
    out << p.dump() << "\n";
  }
  return path;
}

std::vector<nlohmann::json> metrics_with(const fs::path& file, const std::string& key) {
  std::vector<nlohmann::json> out;
  mmpost::io::JsonlReader r(file);
  mmpost::io::JsonlRecord rec;
  while (r.next(rec)) {
    if (rec.value.contains(key)) out.push_back(rec.value);
  }
  return out;
}
}  // namespace

TEST_CASE("dpo: step-1 loss is ln 2 and a small batch is overfit for every seed",
          "[e2e][dpo]") {
  TempDir dir("dpo_e2e");
  auto sft = dir.path / "sft";
  auto r = run_cli("sft -r recipes/tiny/sft-tiny.json --no-resume --output " + sft.string() +
                       " --set data.eval=",
                   dir.path / "log_sft");
  INFO(r.err);
  REQUIRE(r.code == 0);
  auto eight_dir = dir.path / "eight";
  fs::create_directories(eight_dir);
  auto eight = write_prefs(eight_dir, /*bad_line=*/0, /*n=*/8);
  for (int seed : {1, 2, 3}) {
    INFO("seed " << seed);
    auto run = dir.path / ("overfit" + std::to_string(seed));
    r = run_cli("dpo -r recipes/tiny/dpo-tiny.json --seed " + std::to_string(seed) +
                    " --set model.path=" + sft.string() + " --set data.train=" + eight.string() +
                    " --set data.eval=" + eight.string() + " --set train.batch_size=8"
                    " --set train.max_steps=30 --set train.log_every_n_steps=1 --output " +
                    run.string(),
                dir.path / "log_overfit");
    INFO(r.err);
    REQUIRE(r.code == 0);
    auto train = metrics_with(run / "metrics.jsonl", "rewards/accuracies");
    REQUIRE(train.size() == 30);
    // Step 1: the policy is the reference, so every reward is 0 and the sigmoid loss is ln 2.
    CHECK(train[0]["loss"].get<double>() == Approx(std::log(2.0)).margin(1e-6));
    for (const char* k : {"rewards/chosen", "rewards/rejected", "rewards/margins"}) {
      INFO(k);
      CHECK(std::abs(train[0][k].get<double>()) < 1e-7);
    }
    auto eval = metrics_with(run / "metrics.jsonl", "eval/rewards/accuracies");
    REQUIRE(!eval.empty());
    CHECK(eval.back()["eval/rewards/accuracies"].get<double>() == 1.0);
    CHECK(eval.back()["eval/n"] == 8);
  }

  auto prefs = write_prefs(dir.path);
  const std::string common = "dpo -r recipes/tiny/dpo-tiny.json --no-resume --set model.path=" +
                             sft.string() + " --set data.train=" + prefs.string() +
                             " --set data.eval=" + prefs.string();
  auto run = dir.path / "dpo";
  r = run_cli(common + " --output " + run.string(), dir.path / "log_dpo");
  INFO(r.err);
  REQUIRE(r.code == 0);
  auto train = metrics_with(run / "metrics.jsonl", "rewards/accuracies");
  REQUIRE(train.size() == 8);  // every 5 of 40 steps
  for (const char* k : {"loss", "rewards/chosen", "rewards/rejected", "rewards/margins",
                        "logps/chosen", "logps/rejected", "logits/chosen", "logits/rejected",
                        "grad_norm", "lr", "tokens_per_s", "pairs_per_s"}) {
    CHECK(train.back().contains(k));
  }
  auto eval = metrics_with(run / "metrics.jsonl", "eval/rewards/accuracies");
  REQUIRE(!eval.empty());
  CHECK(fs::exists(run / "step_000040" / "DONE"));
  CHECK(fs::exists(run / "model.safetensors"));

  // Precomputed reference log-probs: the same trajectory as the live reference, step for step
  // and bit for bit (same reference values, same order). Precomputing implies the padding-free
  // forward, so the live run it is compared with uses it too.
  auto pre = dir.path / "dpo_pre";
  r = run_cli(common + " --output " + pre.string() + " --set dpo.precompute_ref_log_probs=true",
              dir.path / "log_pre");
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK(fs::exists(pre / "ref_logps.safetensors"));
  auto live = dir.path / "dpo_live_pf";
  r = run_cli(common + " --output " + live.string() + " --set dpo.padding_free=true",
              dir.path / "log_live_pf");
  REQUIRE(r.code == 0);
  auto train_pre = metrics_with(pre / "metrics.jsonl", "rewards/accuracies");
  auto train_live = metrics_with(live / "metrics.jsonl", "rewards/accuracies");
  REQUIRE(train_pre.size() == train.size());
  REQUIRE(train_live.size() == train.size());
  for (size_t i = 0; i < train_pre.size(); ++i) {
    INFO("log row " << i);
    for (const char* k : {"loss", "rewards/chosen", "rewards/rejected", "grad_norm"}) {
      CHECK(train_pre[i][k].get<double>() == train_live[i][k].get<double>());
    }
  }

  // `mmpost eval` on preference JSONL: the reward accuracy against the reference.
  r = run_cli("eval --model " + run.string() + " --ref-model " + sft.string() + " --data " +
                  prefs.string(),
              dir.path / "log_eval");
  INFO(r.err);
  REQUIRE(r.code == 0);
  auto last = nlohmann::json::parse(r.out.substr(r.out.rfind('{')));
  CHECK(last["n"].get<int64_t>() == 64);
  CHECK(last["rewards/accuracies"].get<double>() ==
        Approx(eval.back()["eval/rewards/accuracies"].get<double>()).margin(1e-9));

  // A bad record: exit 3 with FILE:LINE (on_bad_sample: error).
  auto bad_dir = dir.path / "bad";
  fs::create_directories(bad_dir);
  auto bad = write_prefs(bad_dir, /*bad_line=*/5);
  r = run_cli(common + " --set data.train=" + bad.string() + " --output " +
                  (dir.path / "dpo_bad").string(),
              dir.path / "log_bad");
  CHECK(r.code == 3);
  CHECK_THAT(r.err, HasSubstr("prefs.jsonl:5") && HasSubstr("missing \"rejected\""));
}

TEST_CASE("dpo: precomputed reference log-probs equal the policy's at step 1, whatever the "
          "batching", "[e2e]") {
  // At step 1 the policy is the reference, so every reward beta * (logp - ref_logp) is 0 and
  // rewards/accuracies is 0, if the precompute pass (file order, its own batches and padding)
  // gives exactly the values the training forward gives in shuffled batches. The padding-free
  // forward (each row at its own length, its images alone) makes a row's logps independent of
  // its batch; a padded forward differs by ~1e-5 nats, enough for accuracies of 0.1-0.2.
  TempDir dir("dpo_pre_exact");
  const auto start = dir.path / "start";
  // Wider than the tiny recipe: at hidden size 32 the padded GEMMs happen to round alike; at 256
  // (2 threads) the padded forward's step-1 accuracies read 0.17 instead of 0.
  auto r = run_cli("sft -r recipes/tiny/sft-tiny.json --output " + start.string() +
                       " --set data.eval= train.max_steps=1 model.config.text_config.hidden_size=256"
                       " model.config.text_config.intermediate_size=704"
                       " model.config.text_config.num_attention_heads=4"
                       " model.config.vision_config.hidden_size=128"
                       " model.config.vision_config.intermediate_size=256",
                   dir.path / "log_start");
  REQUIRE(r.code == 0);
  auto prefs = write_prefs(dir.path, /*bad_line=*/0, /*n=*/48);
  auto out = dir.path / "pre";
  r = run_cli("dpo -r recipes/tiny/dpo-tiny.json --no-resume --set model.path=" +
                       start.string() + " data.train=" + prefs.string() + " data.eval=" +
                       prefs.string() + " dpo.precompute_ref_log_probs=true train.max_steps=1 "
                       "train.log_every_n_steps=1 train.batch_size=12 num_threads=2 --output " + out.string(),
                   dir.path / "log");
  INFO(r.err);
  REQUIRE(r.code == 0);
  auto rows = metrics_with(out / "metrics.jsonl", "rewards/accuracies");
  REQUIRE(rows.size() == 1);
  CHECK(rows[0]["rewards/chosen"].get<double>() == 0.0);
  CHECK(rows[0]["rewards/rejected"].get<double>() == 0.0);
  CHECK(rows[0]["rewards/accuracies"].get<double>() == 0.0);
  CHECK(rows[0]["loss"].get<double>() == Approx(std::log(2.0)).margin(1e-7));
}

TEST_CASE("dpo: train.cpu_shards=2 gives the unsharded steps (rpo term, live and LoRA "
          "references), and refuses aot", "[e2e][dpo]") {
  TempDir dir("dpo_shards");
  auto sft = dir.path / "sft";
  auto r = run_cli("sft -r recipes/tiny/sft-tiny.json --no-resume --set train.max_steps=10 "
                   "--output " + sft.string() + " --set data.eval=",
                   dir.path / "log_sft");
  INFO(r.err);
  REQUIRE(r.code == 0);
  auto prefs = write_prefs(dir.path, /*bad_line=*/0, /*n=*/32);
  // 7 pairs per micro-batch: shards of 4 and 3, so unequal shards are weighted right.
  const std::string common =
      "dpo -r recipes/tiny/dpo-tiny.json --no-resume --set model.path=" + sft.string() +
      " --set data.train=" + prefs.string() + " --set data.eval= --set num_threads=2"
      " --set train.batch_size=7 --set train.gradient_accumulation_steps=2"
      " --set train.max_steps=3 --set train.log_every_n_steps=1 --set dpo.rpo_alpha=0.5"
      " --set data.shuffle_buffer=0";
  auto rows_of = [&](const std::string& name, const std::string& sets) {
    auto run = dir.path / name;
    auto res = run_cli(common + " " + sets + " --output " + run.string(), dir.path / ("log_" + name));
    INFO(name << ": " << res.err);
    REQUIRE(res.code == 0);
    return std::make_pair(metrics_with(run / "metrics.jsonl", "rewards/accuracies"), res.err);
  };
  for (const std::string lora : {"", "--set lora.r=2"}) {
    INFO("lora: " << lora);
    auto [one, one_log] = rows_of("one", lora + " --set train.cpu_shards=1");
    auto [two, two_log] = rows_of("two", lora + " --set train.cpu_shards=2");
    CHECK(one_log.find("row shards") == std::string::npos);
    CHECK(two_log.find("train.cpu_shards 2: each micro-batch runs as 2 row shards") !=
          std::string::npos);
    REQUIRE(one.size() == 3);
    REQUIRE(two.size() == 3);
    CHECK(one[0]["loss"].get<double>() > std::log(2.0) + 0.1);  // ln 2 + the rpo term
    for (size_t i = 0; i < 3; ++i) {
      // (not rewards/accuracies: a count of signs, which rounding flips where a margin is ~0)
      for (const char* k : {"loss", "grad_norm", "rewards/chosen", "rewards/margins",
                            "logps/chosen", "logits/rejected"}) {
        INFO("step " << i + 1 << " " << k);
        const double a = one[i][k].get<double>(), b = two[i][k].get<double>();
        CHECK(std::abs(a - b) <= 1e-5 * std::max(1.0, std::abs(a)));
      }
    }
  }
  auto bad = run_cli(common + " --set 'dpo.loss_type=[\"aot\"]' --set train.cpu_shards=2 --output " +
                         (dir.path / "aot").string(),
                     dir.path / "log_aot");
  CHECK(bad.code == 2);
  CHECK(bad.err.find("train.cpu_shards") != std::string::npos);
  CHECK(bad.err.find("aot") != std::string::npos);
}

}  // namespace e2e_test_dpo_cli
