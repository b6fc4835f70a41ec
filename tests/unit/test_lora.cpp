// LoRA at the model level (model/lora.h): PEFT's key names for the transformers module paths,
// y = x W^T + b + s x A^T B^T by hand, B = 0 starts at the base model, adapters off = the base
// model, merge_and_unload equals the adapted forward, the model's own names stay the base's.
#include "catch.h"
#include "test_util.h"
#include "mmpost/core/check.h"
#include "mmpost/model/lora.h"
#include "mmpost/model/vlm.h"

namespace unit_test_lora {

using namespace mmpost;

namespace {


double max_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

}  // namespace

TEST_CASE("LoraLinear: y = x W^T + b + (alpha / r) x A^T B^T", "[unit][lora]") {
  model::LoraLinear l(torch::nn::LinearOptions(3, 2));
  torch::NoGradGuard ng;
  l->weight.copy_(torch::tensor({{1.0, 0.0, 2.0}, {0.0, -1.0, 1.0}}));
  l->bias.copy_(torch::tensor({0.5, -0.5}));
  auto x = torch::tensor({{1.0, 2.0, 3.0}});
  CHECK(torch::equal(l(x), torch::tensor({{7.5, 0.5}})));  // no adapter: nn::Linear
  l->lora_A = torch::tensor({{1.0, 1.0, 0.0}});             // r = 1: x A^T = 3
  l->lora_B = torch::tensor({{2.0}, {-1.0}});               // B (x A^T) = (6, -3)
  l->scaling = 0.5;
  CHECK(torch::allclose(l(x), torch::tensor({{10.5, -1.0}})));
  l->adapter_enabled = false;
  CHECK(torch::equal(l(x), torch::tensor({{7.5, 0.5}})));
}

TEST_CASE("LoraAdapters: PEFT names, B = 0 is the base model, off = base, merge = adapted",
          "[unit][lora]") {
  torch::manual_seed(1);
  auto m = model::build_vlm(testing::tiny_llava_config(3));
  const auto n_params = m->named_parameters().size();
  auto ids = torch::randint(1, 60, {2, 20}, torch::kInt64);
  ids[0].narrow(0, 1, 16).fill_(63);
  auto pixels = torch::randn({1, 3, 32, 32});
  torch::Tensor base;
  {
    torch::NoGradGuard ng;
    base = m->forward(ids, pixels, {});
  }
  model::LoraSettings s;
  s.r = 4;
  s.lora_alpha = 8;
  s.target_modules = {"q_proj", "v_proj"};
  model::LoraAdapters lora(*m, s);
  CHECK(lora.size() == 2 * 2 + 3 * 2);  // vision and text q/v
  auto named = lora.named_parameters();
  REQUIRE(named.size() == 20);
  CHECK(named[0].first ==
        "base_model.model.model.vision_tower.encoder.layers.0.self_attn.q_proj.lora_A.weight");
  bool has_text = false;
  for (const auto& [k, t] : named) {
    if (k == "base_model.model.model.language_model.layers.2.self_attn.v_proj.lora_B.weight") {
      has_text = true;
      CHECK(t.sizes() == torch::IntArrayRef({2 * 8, 4}));  // v_proj out = kv heads x head_dim
    }
    CHECK(t.requires_grad());
  }
  CHECK(has_text);
  CHECK(m->named_parameters().size() == n_params);  // the checkpoint names stay the base's
  torch::NoGradGuard ng;
  CHECK(max_diff(m->forward(ids, pixels, {}), base) == 0.0);  // B = 0
  for (auto& [k, t] : named) {
    if (k.find("lora_B") != std::string::npos) t.normal_(0, 0.5);
  }
  auto adapted = m->forward(ids, pixels, {});
  CHECK(max_diff(adapted, base) > 1e-3);
  {
    model::AdaptersDisabled off(&lora);
    CHECK(max_diff(m->forward(ids, pixels, {}), base) == 0.0);
  }
  CHECK(max_diff(m->forward(ids, pixels, {}), adapted) == 0.0);
  auto cfg = lora.adapter_config("/base", {"multi_modal_projector"});
  CHECK(cfg["peft_type"] == "LORA");
  CHECK(cfg["r"] == 4);
  CHECK(cfg["lora_alpha"] == 8.0);
  CHECK(cfg["target_modules"] == nlohmann::json({"q_proj", "v_proj"}));
  CHECK(cfg["modules_to_save"] == nlohmann::json({"multi_modal_projector"}));
  // A copy of the adapter tensors loads back by PEFT key (and by PEFT's in-memory ".default").
  std::map<std::string, torch::Tensor> saved;
  for (const auto& [k, t] : named) {
    saved[k.substr(0, k.size() - 7) + ".default.weight"] = t.clone();
  }
  lora.merge_and_unload();
  CHECK(lora.named_parameters().empty());
  CHECK(max_diff(m->forward(ids, pixels, {}), adapted) < 1e-5);

  auto m2 = model::build_vlm(testing::tiny_llava_config(3));
  torch::manual_seed(1);
  m2 = model::build_vlm(testing::tiny_llava_config(3));
  model::LoraAdapters lora2(*m2, s);
  lora2.load(saved, "saved");
  CHECK(max_diff(m2->forward(ids, pixels, {}), adapted) < 1e-6);
  saved.erase(saved.begin());
  CHECK_THROWS_AS(lora2.load(saved, "saved"), Error);
}

TEST_CASE("LoraAdapters: regex targets, and targets that match nothing are refused by name",
          "[unit][lora]") {
  auto m = model::build_vlm(testing::tiny_llava_config(3));
  model::LoraSettings s;
  s.r = 2;
  s.target_regex = R"(.*language_model.*\.(q_proj|down_proj))";
  model::LoraAdapters lora(*m, s);
  CHECK(lora.size() == 3 * 2);
  auto m2 = model::build_vlm(testing::tiny_llava_config(3));
  model::LoraSettings bad;
  bad.target_modules = {"q_proj", "qkv"};
  try {
    model::LoraAdapters l(*m2, bad);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("\"qkv\" matches no linear layer") != std::string::npos);
  }
  auto m3 = model::build_vlm(testing::tiny_llava_config(3));
  bad.target_modules = {"nothing"};
  try {
    model::LoraAdapters l(*m3, bad);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("model.vision_tower.encoder.layers.0.self_attn.q_proj") !=
          std::string::npos);
  }
}

}  // namespace unit_test_lora
