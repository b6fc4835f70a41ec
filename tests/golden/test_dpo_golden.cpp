// Parity of algo::dpo_loss with TRL 1.16.0: tests/golden/fixtures/dpo (written by
// scripts/golden/make_dpo_fixture.py from TRL's own DPOTrainer._compute_loss, CPOTrainer.cpo_loss
// and ORPOTrainer.odds_ratio_loss) holds per-sequence inputs for B = 6 pairs and, per case of
// cases.json, TRL's per-pair losses, rewards and scalar loss. Everything is float64.
#include <filesystem>
#include <fstream>
#include <iostream>

#include "catch.h"
#include "mmpost/algo/dpo_loss.h"
#include "mmpost/io/safetensors.h"

namespace golden_test_dpo_golden {

using namespace mmpost;
namespace fs = std::filesystem;

namespace {

const fs::path kDir = fs::path(MMPOST_SOURCE_DIR) / "tests/golden/fixtures/dpo";

algo::PreferenceLogps side(const std::map<std::string, torch::Tensor>& t, const std::string& who) {
  algo::PreferenceLogps p;
  p.chosen = t.at(who + ".chosen");
  p.rejected = t.at(who + ".rejected");
  p.n_chosen = t.at("n_chosen");
  p.n_rejected = t.at("n_rejected");
  p.chosen_tail = t.at(who + ".chosen_tail");
  p.rejected_tail = t.at(who + ".rejected_tail");
  if (who == "policy") {
    p.chosen_log_sum_sq = t.at("policy.chosen_log_sum_sq");
    p.rejected_log_sum_sq = t.at("policy.rejected_log_sum_sq");
  }
  return p;
}

algo::DpoLossConfig config_from(const nlohmann::json& c) {
  algo::DpoLossConfig cfg;
  cfg.beta = c.at("beta").get<double>();
  cfg.label_smoothing = c.value("label_smoothing", 0.0);
  cfg.loss_types.clear();
  for (const auto& n : c.at("loss_types"))
    cfg.loss_types.push_back(algo::parse_dpo_loss_type(n.get<std::string>()));
  if (c.contains("loss_weights")) cfg.loss_weights = c["loss_weights"].get<std::vector<double>>();
  cfg.simpo_gamma = c.value("simpo_gamma", cfg.simpo_gamma);
  cfg.discopop_tau = c.value("discopop_tau", cfg.discopop_tau);
  cfg.use_weighting = c.value("use_weighting", false);
  if (c.contains("ld_alpha")) cfg.ld_alpha = c["ld_alpha"].get<double>();
  return cfg;
}

double maxdiff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
}

}  // namespace

TEST_CASE("dpo_loss matches TRL for every loss type and option", "[golden][dpo]") {
  std::ifstream f(kDir / "cases.json");
  REQUIRE(f.good());
  const auto meta = nlohmann::json::parse(f);
  const auto t = io::load_safetensors(kDir / "dpo_losses.safetensors");
  const auto policy = side(t, "policy");
  const auto reference = side(t, "reference");
  REQUIRE(meta["cases"].size() >= 20);

  for (const auto& c : meta["cases"]) {
    const auto name = c.at("name").get<std::string>();
    INFO("case " << name);
    const auto cfg = config_from(c);
    const auto out = algo::dpo_loss(policy, &reference, cfg);
    const double d_loss = maxdiff(out.losses, t.at(name + ".losses"));
    const double d_rc = maxdiff(out.rewards_chosen, t.at(name + ".rewards_chosen"));
    const double d_rr = maxdiff(out.rewards_rejected, t.at(name + ".rewards_rejected"));
    const double d_mean = maxdiff(out.losses.mean(), t.at(name + ".loss"));
    std::cerr << "dpo golden " << name << ": maxdiff losses " << d_loss << " rewards_chosen "
              << d_rc << " rewards_rejected " << d_rr << " mean " << d_mean << "\n";
    CHECK(out.losses.scalar_type() == torch::kFloat64);
    CHECK(d_loss < 1e-6);
    CHECK(d_rc < 1e-6);
    CHECK(d_rr < 1e-6);
    CHECK(d_mean < 1e-6);
  }
}

}  // namespace golden_test_dpo_golden
