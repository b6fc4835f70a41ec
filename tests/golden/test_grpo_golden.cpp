// Parity of algo::policy_loss and the group advantages with TRL 1.16.0: tests/golden/fixtures/grpo
// (written by scripts/golden/make_grpo_fixture.py from TRL's own GRPOTrainer._compute_loss and the
// advantage blocks of GRPOTrainer / RLOOTrainer._generate_and_score_completions) holds B = 8
// completions of T = 7 tokens and, per case of cases.json, TRL's loss, its gradient with respect to
// the per-token log-probs, and its logged metrics; and TRL's advantages for 24 rewards in groups of
// 4. Everything is float64.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <vector>

#include "catch.h"
#include "mmpost/algo/policy_gradient.h"
#include "mmpost/io/safetensors.h"

namespace golden_test_grpo_golden {

using namespace mmpost;
namespace fs = std::filesystem;

namespace {

const fs::path kDir = fs::path(MMPOST_SOURCE_DIR) / "tests/golden/fixtures/grpo";

algo::PolicyLossConfig config_from(const nlohmann::json& c) {
  algo::PolicyLossConfig cfg;
  cfg.loss_type = algo::parse_policy_loss_type(c.at("loss_type").get<std::string>());
  cfg.importance_sampling_level =
      algo::parse_importance_sampling_level(c.at("importance_sampling_level").get<std::string>());
  cfg.beta = c.at("beta").get<double>();
  cfg.epsilon = c.at("epsilon").get<double>();
  if (c.contains("epsilon_high")) cfg.epsilon_high = c["epsilon_high"].get<double>();
  if (c.contains("delta")) cfg.delta = c["delta"].get<double>();
  cfg.use_bias_correction_kl = c.value("use_bias_correction_kl", true);
  cfg.max_completion_length = c.value("max_completion_length", int64_t{512});
  cfg.sapo_temperature_pos = c.value("sapo_temperature_pos", 1.0);
  cfg.sapo_temperature_neg = c.value("sapo_temperature_neg", 1.05);
  return cfg;
}

double maxdiff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
}

}  // namespace

TEST_CASE("policy_loss matches TRL GRPOTrainer for every loss type, level and beta", "[golden][grpo]") {
  std::ifstream f(kDir / "cases.json");
  REQUIRE(f.good());
  const auto meta = nlohmann::json::parse(f);
  const auto t = io::load_safetensors(kDir / "grpo.safetensors");
  REQUIRE(meta["loss_cases"].size() >= 28);

  for (const auto& c : meta["loss_cases"]) {
    const auto name = c.at("name").get<std::string>();
    INFO("case " << name);
    const auto cfg = config_from(c);
    auto logps = t.at("logps").clone().requires_grad_(true);
    std::optional<double> n_tokens;
    if (c.contains("num_items_in_batch")) n_tokens = c["num_items_in_batch"].get<double>();
    const auto out = algo::policy_loss(logps, t.at("old_logps"), t.at("advantages"),
                                       t.at("completion_mask"), cfg, t.at("ref_logps"), n_tokens);
    out.loss.backward();
    const double d_loss = maxdiff(out.loss, t.at(name + ".loss"));
    const double d_grad = maxdiff(logps.grad(), t.at(name + ".grad"));
    std::cerr << "grpo golden " << name << ": maxdiff loss " << d_loss << " grad " << d_grad;
    CHECK(out.loss.scalar_type() == torch::kFloat64);
    CHECK(d_loss < 1e-6);
    CHECK(d_grad < 1e-6);

    const std::map<std::string, torch::Tensor> metrics = {
        {"kl", out.kl},
        {"clip_ratio_low", out.clip_ratio_low},
        {"clip_ratio_high", out.clip_ratio_high},
        {"clip_ratio_region", out.clip_ratio_region},
        {"clip_ratio_low_min", out.clip_ratio_low_min},
        {"clip_ratio_high_max", out.clip_ratio_high_max},
        {"cispo_clip_ratio", out.cispo_clip_ratio},
    };
    std::vector<std::string> logged;
    for (const auto& m : c.at("metrics")) logged.push_back(m.get<std::string>());
    for (const auto& [key, value] : metrics) {
      const bool trl_logs = std::find(logged.begin(), logged.end(), key) != logged.end();
      INFO("metric " << key);
      CHECK(value.defined() == trl_logs);  // mmpost reports exactly the metrics TRL logs
      if (!trl_logs || !value.defined()) continue;
      const double d = maxdiff(value, t.at(name + "." + key));
      std::cerr << " " << key << " " << d;
      CHECK(d < 1e-6);
    }
    std::cerr << "\n";
  }
}

TEST_CASE("grpo and rloo advantages match TRL for every scale_rewards", "[golden][grpo]") {
  std::ifstream f(kDir / "cases.json");
  REQUIRE(f.good());
  const auto meta = nlohmann::json::parse(f);
  const auto t = io::load_safetensors(kDir / "grpo.safetensors");
  const auto G = meta.at("num_generations").get<int64_t>();
  const auto& rewards = t.at("rewards");
  REQUIRE(meta["advantage_cases"].size() == 5);

  for (const auto& c : meta["advantage_cases"]) {
    const auto name = c.at("name").get<std::string>();
    INFO("case " << name);
    const auto out =
        c.at("estimator") == "grpo"
            ? algo::grpo_advantages(rewards, G, algo::parse_scale_rewards(c.at("scale_rewards").get<std::string>()))
            : algo::rloo_advantages(rewards, G, c.at("normalize_advantages").get<bool>());
    const double d_adv = maxdiff(out.advantages, t.at(name + ".advantages"));
    // NaN std (a group with < 2 scorable rewards) compares equal to NaN.
    const auto std_ref = t.at(name + ".std_rewards");
    const double d_std = maxdiff(torch::nan_to_num(out.std_rewards, -1.0), torch::nan_to_num(std_ref, -1.0));
    const double d_zero = maxdiff(out.is_std_zero, t.at(name + ".is_std_zero"));
    std::cerr << "grpo golden " << name << ": maxdiff advantages " << d_adv << " std " << d_std
              << " is_std_zero " << d_zero << "\n";
    CHECK(d_adv < 1e-6);
    CHECK(d_std < 1e-6);
    CHECK(d_zero == 0.0);
    CHECK_FALSE(out.advantages.isnan().any().item<bool>());
  }
}

}  // namespace golden_test_grpo_golden
