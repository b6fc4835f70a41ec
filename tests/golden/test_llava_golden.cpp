// Parity of mmpost's LLaVA with transformers' LlavaForConditionalGeneration: fixtures written by
// scripts/golden/make_llava_fixture.py (config.json + model.safetensors + io.safetensors) are
// loaded through vlm_config_from_json + load_safetensors + load_hf_weights and run forward.
#include "catch.h"

#include "mmpost/io/safetensors.h"
#include "mmpost/model/config.h"
#include "mmpost/model/hf.h"
#include "mmpost/model/vlm.h"

#include <filesystem>
#include <fstream>
#include <iostream>

namespace golden_test_llava_golden {

using namespace mmpost::model;

namespace {

const std::filesystem::path kFixtures =
    std::filesystem::path(MMPOST_SOURCE_DIR) / "tests/golden/fixtures";

Vlm load_fixture_model(const std::filesystem::path& dir) {
  std::ifstream f(dir / "config.json");
  REQUIRE(f.good());
  auto model = build_vlm(vlm_config_from_json(nlohmann::json::parse(f)));
  load_hf_weights(model, mmpost::io::load_safetensors(dir), (dir / "model.safetensors").string());
  model->eval();
  return model;
}

// HF ForCausalLMLoss: logits[:, t] predicts labels[:, t + 1]; mean over labels != -100.
torch::Tensor causal_lm_loss(const torch::Tensor& logits, const torch::Tensor& labels) {
  const int64_t T = logits.size(1);
  auto l = logits.narrow(1, 0, T - 1).reshape({-1, logits.size(2)});
  auto y = labels.narrow(1, 1, T - 1).reshape({-1});
  return torch::nn::functional::cross_entropy(
      l, y, torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100));
}

void check_fixture(const std::string& model_dir, const std::string& io_dir) {
  auto model = load_fixture_model(kFixtures / model_dir);
  auto io = mmpost::io::load_safetensors(kFixtures / io_dir / "io.safetensors");
  torch::NoGradGuard no_grad;
  auto logits = model->forward(io.at("input_ids"), io.at("pixel_values"), io.at("attention_mask"));
  const auto& ref = io.at("logits");
  REQUIRE(logits.sizes() == ref.sizes());
  // Positions after a right-padded row's end get other rotary positions than HF's arange (they
  // are never scored); compare the real tokens.
  auto keep = io.at("attention_mask").to(torch::kBool).unsqueeze(-1).expand_as(ref);
  const double maxdiff = (logits - ref).abs().masked_select(keep).max().item<double>();
  const double loss = causal_lm_loss(logits, io.at("labels")).item<double>();
  const double ref_loss = io.at("loss").item<double>();
  std::cout << "llava golden " << model_dir << ": logits maxdiff " << maxdiff << ", loss " << loss
            << " vs HF " << ref_loss << " (diff " << std::abs(loss - ref_loss) << ")\n";
  CHECK(maxdiff <= 1e-4);
  CHECK(std::abs(loss - ref_loss) <= 1e-5);
}

}  // namespace

TEST_CASE("llava logits and loss match transformers (save_pretrained layout)", "[golden][model]") {
  check_fixture("llava_tiny", "llava_tiny");
}

TEST_CASE("llava with tied embeddings matches transformers", "[golden][model]") {
  check_fixture("llava_tiny_tied", "llava_tiny_tied");
}

TEST_CASE("llava in the hub layout (vision_tower.vision_model.*) matches transformers",
          "[golden][model]") {
  check_fixture("llava_tiny_hub", "llava_tiny");
}

TEST_CASE("a saved checkpoint (config.json + model.safetensors) reloads identically",
          "[golden][model]") {
  auto a = load_fixture_model(kFixtures / "llava_tiny_tied");
  auto sd = hf_state_dict(a);
  CHECK(sd.count("vision_tower.vision_model.embeddings.class_embedding") == 1);
  CHECK(sd.count("language_model.lm_head.weight") == 0);  // tied, as save_pretrained writes
  // MMPOST_KEEP_LLAVA_SAVE=1 keeps the folder, e.g. to load it with transformers' from_pretrained.
  const auto dir = std::filesystem::temp_directory_path() / "mmpost_llava_roundtrip";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << vlm_config_to_json(a->config()).dump(2);
  mmpost::io::save_safetensors(dir / "model.safetensors", sd);
  auto b = load_fixture_model(dir);
  for (const auto& item : a->named_parameters()) {
    INFO(item.key());
    CHECK(torch::equal(item.value(), b->named_parameters()[item.key()]));
  }
  CHECK(b->language_model->tied());
  if (std::getenv("MMPOST_KEEP_LLAVA_SAVE") == nullptr) std::filesystem::remove_all(dir);
}

}  // namespace golden_test_llava_golden
