// Parity of mmpost's Qwen2-VL family with transformers' Qwen2VLForConditionalGeneration and
// Qwen2_5_VLForConditionalGeneration: fixtures written by scripts/golden/make_qwen2_vl_fixture.py
// (config.json + model.safetensors + io.safetensors) are loaded through
// qwen2_vl_config_from_json + load_qwen2_vl_weights and compared on M-RoPE positions, logits and
// greedy generation with the KV cache. Plus hand-built M-RoPE positions (issue 14's example).
#include "catch.h"
#include "test_util.h"

#include "mmpost/hub/qwen2_vl_folder.h"
#include "mmpost/io/safetensors.h"
#include "mmpost/model/generation.h"
#include "mmpost/model/qwen2_vl.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

namespace golden_test_qwen2_vl_golden {

using namespace mmpost::model;
namespace fs = std::filesystem;

namespace {

const std::filesystem::path& kFixtures = mmpost::testing::kGoldenFixtures;
using mmpost::testing::read_json_file;

Qwen2VL load_model(const std::filesystem::path& dir) {
  auto model = build_qwen2_vl(qwen2_vl_config_from_json(read_json_file(dir / "config.json")));
  load_qwen2_vl_weights(*model, mmpost::io::load_safetensors(dir),
                        (dir / "model.safetensors").string());
  model->eval();
  return model;
}

// Greedy decoding through model::generate (KV cache: the prompt once with M-RoPE positions and
// its rope deltas kept, then one token per step at its 1-D position + delta, as HF generate).
torch::Tensor greedy(Qwen2VLImpl& model, const std::map<std::string, torch::Tensor>& io,
                     int64_t n_new, bool use_cache = true) {
  GenerationConfig g;
  g.max_new_tokens = n_new;
  g.temperature = 0;
  g.eos_token_ids = {};
  return generate(model, io.at("gen_input_ids"), io.at("gen_attention_mask"), io.at("pixel_values"),
                  io.at("image_grid_thw"), g, use_cache)
      .sequences;
}

void check_fixture(const std::string& name) {
  const auto dir = kFixtures / name;
  auto model = load_model(dir);
  auto io = mmpost::io::load_safetensors(dir / "io.safetensors");
  const auto& input_ids = io.at("input_ids");
  const auto& mask = io.at("attention_mask");
  const auto& cfg = model->config();

  auto [pos, deltas] = mrope_position_ids(input_ids, io.at("image_grid_thw"), mask,
                                          cfg.image_token_id,
                                          cfg.vision_config.spatial_merge_size);
  // HF leaves padded positions at 0, as mmpost does; compare everything.
  CHECK(torch::equal(pos, io.at("position_ids")));
  CHECK(torch::equal(deltas, io.at("rope_deltas").view({-1})));

  torch::NoGradGuard no_grad;
  auto logits = model->forward(input_ids, io.at("pixel_values"), io.at("image_grid_thw"), mask);
  const auto& expected = io.at("logits");
  REQUIRE(logits.sizes() == expected.sizes());
  auto keep = mask.to(torch::kBool).unsqueeze(-1).expand_as(logits);  // padded rows: no target
  const double max_diff = (logits - expected).abs().masked_select(keep).max().item<double>();
  INFO(name << ": max |logits - HF| over real tokens = " << max_diff);
  CHECK(max_diff < 1e-4);

  auto tokens = greedy(*model, io, io.at("gen_tokens").size(1));
  INFO("mmpost " << tokens << "\nHF " << io.at("gen_tokens"));
  CHECK(torch::equal(tokens, io.at("gen_tokens")));
  // Recomputing the whole sequence each step (M-RoPE over prompt + generated text) agrees.
  CHECK(torch::equal(greedy(*model, io, io.at("gen_tokens").size(1), /*use_cache=*/false), tokens));
}

}  // namespace

TEST_CASE("Qwen2-VL logits and M-RoPE positions match transformers and greedy generation is "
          "token-identical",
          "[golden][qwen2vl]") {
  check_fixture("qwen2_vl_tiny");
}

TEST_CASE("Qwen2.5-VL with window attention matches transformers (logits positions greedy)",
          "[golden][qwen2vl]") {
  check_fixture("qwen2_5_vl_tiny");
}

TEST_CASE("Qwen2-VL hub flat config.json loads to the same model as the nested one",
          "[golden][qwen2vl]") {
  auto nested = qwen2_vl_config_from_json(read_json_file(kFixtures / "qwen2_vl_tiny/config.json"));
  auto flat = qwen2_vl_config_from_json(read_json_file(kFixtures / "qwen2_vl_tiny_flat/config.json"));
  CHECK(qwen2_vl_config_to_json(nested) == qwen2_vl_config_to_json(flat));
  CHECK(flat.text_config.mrope_section == std::vector<int64_t>{2, 3, 3});
  CHECK(flat.text_config.qkv_bias);
  CHECK(flat.vision_config.embed_dim == 32);
  CHECK(flat.vision_config.intermediate_size == 64);  // embed_dim * mlp_ratio
}

TEST_CASE("Qwen2-VL state dict saves in the hub layout and reloads identically",
          "[golden][qwen2vl]") {
  const auto dir = kFixtures / "qwen2_vl_tiny";
  auto model = load_model(dir);
  auto saved = qwen2_vl_state_dict(*model);
  auto original = mmpost::io::load_safetensors(dir);
  REQUIRE(saved.size() == original.size());
  for (const auto& [name, t] : original) {
    INFO(name);
    REQUIRE(saved.count(name) == 1);
    CHECK(torch::equal(saved.at(name), t));
  }
  // transformers 5's in-memory names load too.
  std::map<std::string, torch::Tensor> renamed;
  for (const auto& [name, t] : original) {
    std::string n = name;
    if (n.rfind("visual.", 0) == 0) n = "model." + n;
    else if (n.rfind("model.", 0) == 0) n = "model.language_model." + n.substr(6);
    renamed[n] = t;
  }
  auto again = build_qwen2_vl(model->config());
  load_qwen2_vl_weights(*again, renamed, "renamed");
  for (const auto& [name, t] : qwen2_vl_state_dict(*again)) CHECK(torch::equal(t, saved.at(name)));
}

TEST_CASE("Qwen2-VL family folders save in the hub layout and transformers loads them with the "
          "same logits",
          "[golden][qwen2vl][hf]") {
  const fs::path root = MMPOST_SOURCE_DIR;
  const fs::path python = root / ".venv" / "bin" / "python";
  for (const char* name : {"qwen2_vl_tiny", "qwen2_5_vl_tiny", "qwen2_vl_tiny_flat"}) {
    INFO(name);
    const auto src = kFixtures / name;
    REQUIRE(mmpost::hub::is_qwen2_vl_folder(src));
    auto loaded = mmpost::hub::load_qwen2_vl_pretrained(src);
    CHECK_FALSE(loaded.has_processor_config);
    mmpost::testing::TempDir out("qwen2vl_save");
    mmpost::hub::save_qwen2_vl_pretrained(out.path, *loaded.model, loaded.image, src);
    // mmpost reads its own folder back to the same tensors and config.
    auto again = mmpost::hub::load_qwen2_vl_pretrained(out.path);
    CHECK(again.has_processor_config);
    CHECK(qwen2_vl_config_to_json(again.config) == qwen2_vl_config_to_json(loaded.config));
    auto a = qwen2_vl_state_dict(*loaded.model), b = qwen2_vl_state_dict(*again.model);
    REQUIRE(a.size() == b.size());
    for (const auto& [n, t] : a) CHECK(torch::equal(t, b.at(n)));
    if (std::system((python.string() + " -c 'import transformers' > /dev/null 2>&1").c_str()) != 0) {
      MMPOST_SKIP(python.string() + " cannot import transformers (run scripts/setup.sh)");
    }
    const std::string io_dir = std::string(name) == "qwen2_vl_tiny_flat" ? "qwen2_vl_tiny" : name;
    const auto log = out.path / "check.log";
    const std::string cmd = python.string() + " " +
                            (root / "scripts/golden/check_qwen2_vl_folder.py").string() + " " +
                            out.path.string() + " " +
                            (kFixtures / io_dir / "io.safetensors").string() + " > " +
                            log.string() + " 2>&1";
    const int rc = std::system(cmd.c_str());
    std::ifstream in(log);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    INFO(text);
    CHECK(rc == 0);
    CHECK(text.find("\"ok\": true") != std::string::npos);
  }
}

}  // namespace golden_test_qwen2_vl_golden
