// Reward modelling: algo::bradley_terry_loss against hand-computed values (TRL RewardTrainer's
// compute_loss, with margin and centering), the reward read at the last real token (right padding
// changes nothing), and the reward-model folder round trip (save -> load -> same rewards; a plain
// VLM folder is refused naming the folder).
#include <cmath>

#include "catch.h"
#include "mmpost/algo/reward_loss.h"
#include "mmpost/core/check.h"
#include "mmpost/hub/hf_folder.h"
#include "mmpost/hub/reward_model_folder.h"
#include "mmpost/model/reward_model.h"
#include "test_util.h"

namespace unit_test_reward_model {

using namespace mmpost;

namespace {

// Tiny LLaVA text side (no images needed here): C = 32, 1 layer, GQA 4:2.
model::VlmConfig tiny_config() { return testing::tiny_vlm_config(64, 63); }

double sp(double x) { return std::log1p(std::exp(x)); }  // -log sigmoid(-x)

}  // namespace

TEST_CASE("bradley_terry_loss: -log sigmoid(r_c - r_r), accuracy, gradient", "[unit][rm]") {
  // r_c = [2, 0, 1], r_r = [1, 1, 1] -> d = [1, -1, 0]
  //   losses: log(1 + e^-1) = 0.3132617, log(1 + e^1) = 1.3132617, log 2 = 0.6931472
  //   mean = 2.3196706 / 3 = 0.7732235; accuracy = 1/3 (ties are not wins)
  //   d loss / d r_c[i] = -sigmoid(-d_i) / 3 = [-0.0896471, -0.2436862, -0.1666667]
  auto rc = torch::tensor({2.0, 0.0, 1.0}).requires_grad_(true);
  auto rr = torch::tensor({1.0, 1.0, 1.0}).requires_grad_(true);
  auto out = algo::bradley_terry_loss(rc, rr);
  CHECK(out.loss.item<double>() == Approx((sp(-1) + sp(1) + std::log(2.0)) / 3).epsilon(1e-6));
  CHECK(out.loss.item<double>() == Approx(0.7732235).epsilon(1e-6));
  CHECK(out.accuracy.item<double>() == Approx(1.0 / 3));
  out.loss.backward();
  CHECK(rc.grad()[0].item<double>() == Approx(-0.0896471).epsilon(1e-5));
  CHECK(rc.grad()[1].item<double>() == Approx(-0.2436862).epsilon(1e-5));
  CHECK(rc.grad()[2].item<double>() == Approx(-1.0 / 6).epsilon(1e-5));
  CHECK(rr.grad()[0].item<double>() == Approx(0.0896471).epsilon(1e-5));
}

TEST_CASE("bradley_terry_loss: margin inside the sigmoid, centering term", "[unit][rm]") {
  auto rc = torch::tensor({2.0, 0.0, 1.0}), rr = torch::tensor({1.0, 1.0, 1.0});
  // margin = [1, -1, 0]: d - margin = [0, 0, 0] -> loss = log 2; accuracy ignores the margin.
  auto m = algo::bradley_terry_loss(rc, rr, torch::tensor({1.0, -1.0, 0.0}));
  CHECK(m.loss.item<double>() == Approx(std::log(2.0)).epsilon(1e-6));
  CHECK(m.accuracy.item<double>() == Approx(1.0 / 3));
  // center 0.01: r_c + r_r = [3, 1, 2] -> mean of squares 14/3 -> + 0.0466667 = 0.8198902
  auto c = algo::bradley_terry_loss(rc, rr, {}, 0.01);
  CHECK(c.loss.item<double>() == Approx(0.7732235 + 0.01 * 14.0 / 3).epsilon(1e-6));
  CHECK(c.loss.item<double>() == Approx(0.8198902).epsilon(1e-6));
  CHECK_THROWS(algo::bradley_terry_loss(rc, torch::tensor({1.0, 1.0})));
}

TEST_CASE("last_token_hidden picks the rightmost real token (right or left padding)",
          "[unit][rm]") {
  auto hidden = torch::arange(2 * 4 * 3, torch::kFloat32).view({2, 4, 3});  // [B=2, T=4, C=3]
  auto mask = torch::tensor({{1, 1, 0, 0}, {0, 1, 1, 1}}, torch::kLong);
  auto last = model::last_token_hidden(hidden, mask);  // rows: t = 1 and t = 3
  CHECK(torch::equal(last[0], hidden[0][1]));
  CHECK(torch::equal(last[1], hidden[1][3]));
}

TEST_CASE("reward at the last real token ignores right padding", "[unit][rm]") {
  torch::manual_seed(0);
  model::RewardModel rm(model::build_vlm(tiny_config()), /*init_std=*/0.5);
  rm->eval();
  torch::NoGradGuard no_grad;
  auto ids = torch::tensor({{1, 7, 9, 11, 2}}, torch::kLong);  // [1, 5], no image tokens
  auto alone = rm->forward(ids, {}, torch::ones_like(ids));       // [1]
  // The same row padded to 8 (pad id 0 and pad id = EOS 2), next to a longer row.
  for (int64_t pad : {0, 2}) {
    auto padded = torch::full({2, 8}, pad, torch::kLong);
    padded[0].narrow(0, 0, 5).copy_(ids[0]);
    padded[1] = torch::tensor({1, 5, 6, 7, 8, 9, 10, 2}, torch::kLong);
    auto mask = torch::zeros({2, 8}, torch::kLong);
    mask[0].narrow(0, 0, 5).fill_(1);
    mask[1].fill_(1);
    auto r = rm->forward(padded, {}, mask);  // [2] float32
    REQUIRE(r.sizes() == torch::IntArrayRef{2});
    CHECK(r.scalar_type() == torch::kFloat32);
    CHECK(r[0].item<double>() == Approx(alone[0].item<double>()).margin(1e-5));
  }
  // Reading one token earlier gives another reward, so the check above is not vacuous.
  auto prefix = rm->forward(ids.narrow(1, 0, 4), {}, torch::ones({1, 4}, torch::kLong));
  CHECK(std::abs(prefix[0].item<double>() - alone[0].item<double>()) > 1e-3);
}

TEST_CASE("reward model folder: save, load, same rewards, a plain VLM is refused", "[unit][rm]") {
  testing::TempDir tmp("rm_folder");
  torch::manual_seed(1);
  model::RewardModel rm(model::build_vlm(tiny_config()), /*init_std=*/0.5);
  rm->eval();
  data::ImageProcessorConfig image;  // the tower's own input size, as every stage writes it
  image.image_size = tiny_config().vision_config.image_size;
  hub::save_reward_model(tmp.path / "rm", rm, {}, image);
  CHECK(std::filesystem::exists(tmp.path / "rm" / hub::kRewardHeadFile));
  auto cfg = nlohmann::json::parse(testing::read_all(tmp.path / "rm" / "config.json"));
  CHECK(cfg["num_labels"] == 1);
  CHECK(cfg["mmpost_reward_model"]["head"] == hub::kRewardHeadFile);
  // The folder is still a plain VLM folder for VLM loaders (the head is ignored there).
  CHECK_NOTHROW(hub::load_pretrained(tmp.path / "rm"));

  auto loaded = hub::load_reward_model(tmp.path / "rm");
  auto ids = torch::tensor({{1, 7, 9, 11, 2, 0}, {1, 3, 4, 5, 6, 2}}, torch::kLong);
  auto mask = torch::tensor({{1, 1, 1, 1, 1, 0}, {1, 1, 1, 1, 1, 1}}, torch::kLong);
  torch::NoGradGuard no_grad;
  auto a = rm->forward(ids, {}, mask), b = loaded.model->forward(ids, {}, mask);
  CHECK(torch::allclose(a, b, /*rtol=*/0, /*atol=*/1e-6));
  CHECK(torch::equal(rm->score->weight, loaded.model->score->weight));

  hub::save_pretrained(tmp.path / "vlm", rm->model, {}, data::ImageProcessorConfig{});
  try {
    hub::load_reward_model(tmp.path / "vlm");
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::kUsage);
    CHECK(std::string(e.what()).find((tmp.path / "vlm").string()) != std::string::npos);
    CHECK(std::string(e.what()).find("mmpost rm") != std::string::npos);
  }
}

}  // namespace unit_test_reward_model
