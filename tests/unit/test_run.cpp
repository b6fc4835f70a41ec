// Tests for the run harness components: MetricWindow means and rates, format_rate,
// total_steps_of, the one name table per enum (core/names.h), and the Checkpointer: a complete
// folder appears only at the end of a save (hidden temp folder, DONE inside), a second save of
// the same step writes nothing, the tokenizer comes from memory after its source file is gone,
// pruning keeps the newest, and a value head round-trips.
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "catch.h"
#include "mmpost/algo/kl.h"
#include "mmpost/algo/policy_gradient.h"
#include "mmpost/config/recipe.h"
#include "mmpost/config/schema.h"
#include "mmpost/core/log.h"
#include "mmpost/core/names.h"
#include "mmpost/data/tokenizer.h"
#include "mmpost/io/checkpoint.h"
#include "mmpost/model/vlm.h"
#include "mmpost/train/checkpointing.h"
#include "mmpost/train/optimizer.h"
#include "mmpost/train/run.h"
#include "test_util.h"

namespace unit_test_run {

namespace fs = std::filesystem;
using namespace mmpost;
using mmpost::testing::read_all;
using mmpost::testing::TempDir;

namespace {

model::VlmConfig tiny_config() { return testing::tiny_vlm_config(512, 4); }

}  // namespace

TEST_CASE("MetricWindow: per-key means, rates, reset", "[unit][run]") {
  train::MetricWindow w;
  w.add("loss", 1.0);
  w.add("loss", 3.0);
  w.add("kl", 0.5);  // added once: its own mean
  w.count(100, 4);
  w.count(50, 2);
  auto m = w.flush("pairs");
  CHECK(m["loss"].get<double>() == 2.0);
  CHECK(m["kl"].get<double>() == 0.5);
  REQUIRE(m.contains("tokens_per_s"));
  REQUIRE(m.contains("pairs_per_s"));
  // Both rates share the window's wall time: their ratio is 150 tokens / 6 pairs.
  CHECK(m["tokens_per_s"].get<double>() / m["pairs_per_s"].get<double>() == Approx(25.0));
  auto empty = w.flush("pairs");
  CHECK(empty.empty());  // flushed: nothing carried over
}

TEST_CASE("MetricWindow: merging another rank's sums gives the mean of all observations",
          "[unit][run]") {
  // What Run::flush does with the all-gathered windows of 2 ranks.
  train::MetricWindow rank0, rank1;
  rank0.add("loss", 1.0);
  rank0.add("loss", 3.0);
  rank0.count(100, 4);
  rank1.add("loss", 8.0);           // one observation: the mean is (1 + 3 + 8) / 3, not (2 + 8) / 2
  rank1.add("value_loss", 0.25);    // a key only rank 1 saw
  rank1.count(200, 2);
  const auto sums1 = nlohmann::json::parse(rank1.sums().dump());  // through the wire format
  CHECK(sums1["n"]["loss"] == 1);
  rank0.add_sums(sums1);
  auto m = rank0.flush("samples");
  CHECK(m["loss"].get<double>() == 4.0);
  CHECK(m["value_loss"].get<double>() == 0.25);
  // Rates count both ranks' work over one wall time: 300 tokens / 6 samples.
  CHECK(m["tokens_per_s"].get<double>() / m["samples_per_s"].get<double>() == Approx(50.0));
}

TEST_CASE("format_rate and total_steps_of", "[unit][run]") {
  CHECK(train::format_rate(812) == "812");
  CHECK(train::format_rate(12345) == "12.3k");
  CHECK(train::format_rate(4.512e6) == "4.51M");
  CHECK(train::format_rate(3.25) == "3.25");
  config::TrainSection t;
  t.max_steps = 7;
  CHECK(train::total_steps_of(t, 1000, 16) == 7);
  t.max_steps = 0;
  t.epochs = 2.0;
  CHECK(train::total_steps_of(t, 100, 16) == 13);  // ceil(200 / 16)
  t.epochs = 0.001;
  CHECK(train::total_steps_of(t, 100, 16) == 1);   // at least one step
}

TEST_CASE("names: one table drives parse, errors and help", "[unit][run]") {
  CHECK(algo::parse_rl_algorithm("rloo") == algo::RlAlgorithm::kRloo);
  CHECK(algo::to_string(algo::RlAlgorithm::kReinforcePpBaseline) == "reinforce_pp_baseline");
  CHECK(algo::rl_algorithm_names() == "grpo | rloo | reinforce_pp | reinforce_pp_baseline | ppo");
  try {
    algo::parse_rl_algorithm("dpo");
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::kUsage);
    CHECK_THAT(std::string(e.what()), HasSubstr("rlhf.algorithm: unknown value 'dpo'") &&
                                          HasSubstr("grpo, rloo, reinforce_pp"));
  }
}

TEST_CASE("names: rlhf help text lists exactly the names the algo tables parse", "[unit][run]") {
  // The --print-defaults description of each enum key starts with "a | b | c"; every listed name
  // must parse, and every value of the enum must be listed under its canonical name.
  auto doc_of = [](const std::string& key) {
    for (const auto& row : config::to_rows(config::RlhfConfig{})) {
      if (row.path == key) return row.doc;
    }
    FAIL("no row " << key);
    return std::string();
  };
  auto listed = [&](const std::string& key) {
    std::string doc = doc_of(key);
    doc = doc.substr(0, doc.find(" ("));
    std::vector<std::string> names;
    for (size_t a = 0; a <= doc.size();) {
      size_t b = doc.find(" | ", a);
      names.push_back(doc.substr(a, b == std::string::npos ? std::string::npos : b - a));
      if (b == std::string::npos) break;
      a = b + 3;
    }
    return names;
  };
  auto check = [&](const std::string& key, auto parse, auto all_values) {
    std::set<std::string> canonical_listed, canonical_all;
    for (const auto& n : listed(key)) {
      INFO(key << ": " << n);
      CHECK_NOTHROW(parse(n));
      canonical_listed.insert(algo::to_string(parse(n)));
    }
    for (auto v : all_values) canonical_all.insert(algo::to_string(v));
    CHECK(canonical_listed == canonical_all);
  };
  using algo::RlAlgorithm;
  check("rlhf.algorithm", algo::parse_rl_algorithm,
        std::vector{RlAlgorithm::kGrpo, RlAlgorithm::kRloo, RlAlgorithm::kReinforcePp,
                    RlAlgorithm::kReinforcePpBaseline, RlAlgorithm::kPpo});
  using algo::ScaleRewards;
  check("rlhf.scale_rewards", algo::parse_scale_rewards,
        std::vector{ScaleRewards::kGroup, ScaleRewards::kBatch, ScaleRewards::kNone});
  using algo::ImportanceSamplingLevel;
  check("rlhf.importance_sampling_level", algo::parse_importance_sampling_level,
        std::vector{ImportanceSamplingLevel::kToken, ImportanceSamplingLevel::kSequence});
  std::vector<algo::PolicyLossType> losses;
  for (const auto& n : {"grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo"}) {
    losses.push_back(algo::parse_policy_loss_type(n));
  }
  CHECK(algo::policy_loss_type_names() == "grpo, bnpo, dr_grpo, dapo, cispo, sapo, luspo");
  check("rlhf.loss_type", algo::parse_policy_loss_type, losses);
  std::vector<algo::KlEstimator> kls;
  for (const auto& n : {"k1", "k2", "k3", "low_var_kl", "abs", "full"}) {
    kls.push_back(algo::parse_kl_estimator(n));
  }
  check("rlhf.kl_estimator", algo::parse_kl_estimator, kls);
  CHECK_THROWS_WITH(algo::parse_kl_estimator("k4"), HasSubstr("rlhf.kl_estimator: unknown value 'k4'"));
}

TEST_CASE("names: each recipe choice's help text lists exactly the values validation accepts",
          "[unit][run]") {
  // Descriptions read "[label: ]a | b | c [(note)] ..."; the listed names are the identifiers
  // next to a '|', parentheticals removed. They must equal recipe_choices()'s values.
  std::map<std::string, std::string> docs;
  for (const auto& row : config::to_rows(config::DpoConfig{})) docs[row.path] = row.doc;
  for (const auto& c : config::recipe_choices()) {
    INFO(c.key);
    REQUIRE(docs.count(c.key) == 1);
    std::string doc = docs[c.key];
    for (size_t a; (a = doc.find('(')) != std::string::npos;) {
      doc.erase(a, doc.find(')', a) == std::string::npos ? std::string::npos : doc.find(')', a) - a + 1);
    }
    if (auto colon = doc.find(": "); colon != std::string::npos && colon < doc.find('|')) {
      doc = doc.substr(colon + 2);
    }
    std::set<std::string> listed;
    std::vector<std::string> words;
    std::string w;
    for (char ch : doc + " ") {
      if (std::isalnum(static_cast<unsigned char>(ch)) || ch == '_') {
        w += ch;
      } else {
        if (!w.empty()) words.push_back(w);
        w.clear();
        if (ch == '|') words.push_back("|");
      }
    }
    for (size_t i = 0; i < words.size(); ++i) {
      const bool next_to_bar = (i > 0 && words[i - 1] == "|") || (i + 1 < words.size() && words[i + 1] == "|");
      if (words[i] != "|" && (next_to_bar || c.values.size() == 1)) listed.insert(words[i]);
    }
    if (c.values.size() == 1) listed = {words.empty() ? "" : words[0]};
    CHECK(listed == std::set<std::string>(c.values.begin(), c.values.end()));
  }
  // The scheduler's formulas accept exactly the validated names.
  for (const auto& c : config::recipe_choices()) {
    if (c.key != "scheduler.name") continue;
    for (const auto& name : c.values) CHECK_NOTHROW(train::lr_multiplier(name, 5, 2, 10, 0.0));
  }
  CHECK_THROWS(train::lr_multiplier("step", 5, 2, 10, 0.0));
}

TEST_CASE("Checkpointer: atomic folders, one save per step, tokenizer from memory, pruning",
          "[unit][run]") {
  TempDir tmp("ckpt");
  torch::manual_seed(0);
  auto vlm = model::build_vlm(tiny_config());
  // The tokenizer is loaded from a copy that is deleted before the saves (a pruned step folder).
  fs::copy_file(fs::path(MMPOST_SOURCE_DIR) / "data/tokenizer/tokenizer.model",
                tmp.path / "tok.model");
  auto tok = std::make_unique<data::Tokenizer>((tmp.path / "tok.model").string());
  fs::remove(tmp.path / "tok.model");
  torch::nn::Linear value_head(32, 1);
  auto named = train::named_parameters_of(*vlm);
  named.emplace_back("value_head.weight", value_head->weight);
  named.emplace_back("value_head.bias", value_head->bias);
  config::OptimSection o;
  train::Optimizer opt(named, o, config::SchedulerSection{}, 1.0, 10);
  const fs::path out = tmp.path / "run";
  fs::create_directories(out);
  train::Checkpointer ck(out, /*keep_last=*/2,
                         {.vlm = vlm, .value_head = value_head, .tokenizer = tok.get()},
                         opt, /*last_saved_step=*/-1);
  // fp32 model + two AdamW moments per trainable parameter (all are) + tokenizer, plus slack.
  int64_t n = 0;
  for (const auto& [k, p] : named) n += p.numel();
  CHECK(ck.bytes_needed() >= static_cast<uint64_t>(12 * n) + tok->model_bytes().size());

  train::TrainState st;
  for (int64_t step : {1, 2, 3}) {
    st.step = step;
    auto dir = ck.save(st, nlohmann::json{{"k", 1}});
    CHECK(dir == io::step_dir(out, step));
    CHECK(io::is_complete(dir));
  }
  // Pruned to the newest two; no temporary folder is left behind.
  CHECK_FALSE(fs::exists(io::step_dir(out, 1)));
  CHECK(fs::exists(io::step_dir(out, 2)));
  for (const auto& e : fs::directory_iterator(out)) {
    CHECK(e.path().filename().string().rfind(".step_", 0) != 0);
  }
  const fs::path last = io::step_dir(out, 3);
  CHECK(read_all(last / "tokenizer.model") == tok->model_bytes());
  CHECK(train::read_train_state(last).step == 3);
  // A stop signal on a save step saves again: nothing is rewritten.
  auto before = fs::last_write_time(last / "state.json");
  ::usleep(20000);
  CHECK(ck.save(st, nlohmann::json{{"k", 2}}) == last);
  CHECK(fs::last_write_time(last / "state.json") == before);
  // The value head comes back.
  torch::nn::Linear other(32, 1);
  train::load_value_head(other, last);
  CHECK(torch::equal(other->weight, value_head->weight));
  CHECK(torch::equal(other->bias, value_head->bias));
  // export_final writes the model folder at the top level.
  ck.export_final();
  CHECK(read_all(out / "model.safetensors") == read_all(last / "model.safetensors"));
  CHECK(fs::exists(out / train::kValueHeadFile));
}

TEST_CASE("Progress: elapsed_s runs from the first update, so update(0) before a loop times all of it",
          "[unit][run]") {
  // generate divides all its tokens by elapsed_s(): without update(0) before its loop the clock
  // started after the first batch, and a one-batch run reported millions of tokens/s.
  mmpost::Progress from_zero("t", 2);
  from_zero.update(0);
  mmpost::Progress from_first("t", 2);
  std::this_thread::sleep_for(std::chrono::milliseconds(60));  // the first "batch"
  from_zero.update(1);
  from_first.update(1);
  CHECK(from_zero.elapsed_s() >= 0.06);
  CHECK(from_first.elapsed_s() < from_zero.elapsed_s());
  // A resumed prefix (first update at 1 of 2) counts as neither work nor time in the ETA.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(from_first.eta_s() == 0.0);  // no work done by this process yet: unknown
  CHECK(from_zero.eta_s() > 0.0);
}

}  // namespace unit_test_run
