// The processor settings matrix against transformers (fixture written by
// scripts/golden/make_processor_matrix.py): each setting's preprocessor_config.json (or
// processor_config.json), read by read_preprocessor_config, must give the pixel_values the
// transformers image processor (PIL backend) gave for four real images, within 1e-6; each
// sentencepiece normalizer must give transformers' LlamaTokenizer ids exactly.
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>

#include "catch.h"
#include "mmpost/core/check.h"
#include "mmpost/data/chat_template.h"
#include "mmpost/data/image.h"
#include "mmpost/data/tokenizer.h"
#include "mmpost/hub/hf_folder.h"
#include "mmpost/io/safetensors.h"
#include "test_util.h"

namespace golden_test_processor_matrix {

using namespace mmpost;
using namespace mmpost::data;
namespace fs = std::filesystem;

namespace {
const fs::path kDir = fs::path(MMPOST_SOURCE_DIR) / "tests/golden/fixtures/processor_matrix";

nlohmann::json read_json(const fs::path& p) {
  std::ifstream f(p);
  REQUIRE(f.good());
  return nlohmann::json::parse(f);
}
}  // namespace

TEST_CASE("processor settings matrix: pixel_values match transformers within 1e-6",
          "[golden][data]") {
  const auto meta = read_json(kDir / "case.json");
  const auto expected = io::load_safetensors(kDir / "expected.safetensors");
  const int64_t size = meta["image_size"].get<int64_t>();
  ImageProcessorConfig defaults;
  defaults.image_size = size;
  for (const auto& [setting, info] : meta["settings"].items()) {
    SECTION(setting) {
      fs::path file = kDir / setting / "preprocessor_config.json";
      if (!fs::exists(file)) file = kDir / setting / "processor_config.json";
      ProcessorFileInfo pinfo;
      const auto cfg = read_preprocessor_config(file.string(), defaults, &pinfo);
      CHECK(pinfo.has_image_settings);
      check_processor_for_model(cfg, size, file.string());
      if (setting == "llava_pad_v5") CHECK(pinfo.image_tokens == (size / 8) * (size / 8));
      double worst = 0;
      for (const auto& image : meta["images"]) {
        const std::string name = image.get<std::string>();
        auto rgb = load_image_rgb((kDir / "images" / name).string());
        auto px = to_pixel_values(resize_for_model(rgb, cfg), cfg);
        const auto& ref = expected.at(setting + "/" + name);
        REQUIRE(px.sizes() == ref.sizes());
        const double d = (px - ref).abs().max().item<double>();
        INFO(setting << " / " << name << ": max |diff| " << d);
        CHECK(d <= 1e-6);
        worst = std::max(worst, d);
      }
      // One line per setting for the README's parity table.
      std::cout << "processor matrix " << std::left << std::setw(22) << setting
                << " max |pixel_values diff| " << worst << "\n";
    }
  }
}

TEST_CASE("processor matrix: the pad colour is int(mean * 255), not rounded", "[unit][data]") {
  ImageProcessorConfig cfg;
  cfg.image_mean = {0.5, 0.48145466, 0.999};
  const cv::Scalar c = pad_color(cfg);
  CHECK(c[0] == 127);  // 127.5 truncated
  CHECK(c[1] == 122);  // 122.77
  CHECK(c[2] == 254);  // 254.745
}

TEST_CASE("processor settings transformers would apply but mmpost cannot are refused by name",
          "[unit][data]") {
  testing::TempDir tmp("mmpost_test_procrefuse");
  auto refused = [&](const std::string& body) {
    const fs::path p = tmp.path / "preprocessor_config.json";
    std::ofstream(p) << body;
    try {
      read_preprocessor_config(p.string(), {});
    } catch (const Error& e) {
      return std::string(e.what()) + " " + e.hint();
    }
    return std::string();
  };
  CHECK_THAT(refused(R"({"image_processor_type": "CLIPImageProcessor", "crop_pct": 0.875})"),
             Catch::Matchers::Contains("crop_pct: not reproduced"));
  CHECK_THAT(refused(R"({"image_processor_type": "CLIPImageProcessor", "do_centre_crop": true})"),
             Catch::Matchers::Contains("did you mean \"do_center_crop\""));
  CHECK_THAT(refused(R"({"image_processor_type": "SiglipImageProcessor"})"),
             Catch::Matchers::Contains("image_processor_type: SiglipImageProcessor"));
  CHECK_THAT(refused(R"({"image_processor_type": "CLIPImageProcessor",
                         "size": {"shortest_edge": 32, "longest_edge": 64}})"),
             Catch::Matchers::Contains("size.longest_edge: not reproduced"));
  CHECK_THAT(refused(R"({"image_processor_type": "CLIPImageProcessor",
                         "crop_size": {"height": 32, "width": 24}})"),
             Catch::Matchers::Contains("crop_size: 32x24 is not square"));
  // Values that leave the pixels alone pass: null, false, inert bookkeeping keys.
  CHECK(refused(R"({"image_processor_type": "CLIPImageProcessorFast", "crop_pct": null,
                    "do_flip_channel_order": false, "processor_class": "LlavaProcessor"})") == "");

  // Settings that cannot feed a 32-px vision tower: named at load time, not at step 1.
  auto cfg_of = [&](const std::string& body) {
    const fs::path p = tmp.path / "preprocessor_config.json";
    std::ofstream(p) << body;
    return read_preprocessor_config(p.string(), {});
  };
  auto model_refusal = [&](const ImageProcessorConfig& c) {
    try {
      check_processor_for_model(c, 32, "preprocessor_config.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  // No crop_size: transformers crops to CLIPImageProcessor's default 224.
  const auto no_crop = cfg_of(R"({"image_processor_type": "CLIPImageProcessor",
                                  "size": {"shortest_edge": 32}})");
  CHECK(no_crop.image_size == 224);
  CHECK_THAT(model_refusal(no_crop),
             Catch::Matchers::Contains("crop_size 224 differs from vision_config.image_size 32"));
  const auto crop_off = cfg_of(R"({"image_processor_type": "CLIPImageProcessor",
      "size": {"shortest_edge": 32}, "crop_size": 32, "do_center_crop": false})");
  CHECK_THAT(model_refusal(crop_off),
             Catch::Matchers::Contains("do_center_crop is false, so size must be"));
  const auto exact = cfg_of(R"({"image_processor_type": "CLIPImageProcessor",
      "size": {"height": 32, "width": 32}, "crop_size": 32, "do_center_crop": false})");
  CHECK(model_refusal(exact) == "");
}

TEST_CASE("tokenizer normalizers: ids equal transformers' LlamaTokenizer whatever the "
          "sentencepiece model's normalizer", "[golden][data]") {
  const auto e = read_json(kDir / "normalizers/expected.json");
  const auto& texts = e["texts"];
  int n_differ_from_sentencepiece = 0;
  for (const auto& [name, m] : e["models"].items()) {
    SECTION(name) {
      Tokenizer tok((kDir / "normalizers" / name / "tokenizer.model").string());
      const bool identity = m["rule"] == "identity" && !m["remove_extra_whitespaces"].get<bool>();
      CHECK(tok.normalizer_note().empty() == identity);
      for (size_t i = 0; i < texts.size(); ++i) {
        const auto hf = m["hf_ids"][i].get<std::vector<int64_t>>();
        const auto sp = m["sentencepiece_ids"][i].get<std::vector<int64_t>>();
        INFO(name << " text " << i << ": " << texts[i].get<std::string>());
        CHECK(tok.encode(texts[i].get<std::string>()) == hf);
        n_differ_from_sentencepiece += hf != sp;
      }
      // The matrix means something: sentencepiece's own normalization differs from the
      // reference on some of these texts for every non-identity model.
      if (!identity) CHECK(n_differ_from_sentencepiece > 0);
    }
  }
}

TEST_CASE("tokenizer_config.json legacy: true prefixes every chunk after a special token, as "
          "transformers", "[golden][data]") {
  const auto e = read_json(kDir / "normalizers/expected.json")["legacy"];
  const fs::path dir = kDir / "normalizers/legacy";
  Tokenizer tok((dir / "tokenizer.model").string());
  hub::add_hf_added_tokens(tok, dir);
  CHECK(tok.legacy());
  int n_differ_from_first = 0;
  for (size_t i = 0; i < e["texts"].size(); ++i) {
    const auto text = e["texts"][i].get<std::string>();
    const auto hf = e["hf_ids"][i].get<std::vector<int64_t>>();
    INFO(text);
    CHECK(tok.encode(text) == hf);
    tok.set_legacy(false);
    n_differ_from_first += tok.encode(text) != hf;
    tok.set_legacy(true);
  }
  CHECK(n_differ_from_first >= 2);  // the flag changes ids: "\nWhat" and "c" after <image>
}

TEST_CASE("tokenizer.json's post_processor decides the BOS, as transformers", "[unit][data]") {
  // The legacy fixture's tokenizer.json has TemplateProcessing single [$A] (no BOS): transformers
  // then starts a conversation without <s>, and so does mmpost; [<s>, $A] puts it back; another
  // template is refused by name.
  const fs::path src = kDir / "normalizers/legacy";
  Tokenizer tok((src / "tokenizer.model").string());
  hub::add_hf_added_tokens(tok, src);
  CHECK_FALSE(tok.add_bos());
  TemplateOptions opts{ChatTemplate::kLlava, tok.piece_to_id("<image>"), 4, true};
  auto enc = encode_conversation({{"user", "Hi"}}, tok, opts);
  CHECK(enc.input_ids.front() != tok.bos_id());

  testing::TempDir tmp("mmpost_test_postproc");
  auto j = read_json(src / "tokenizer.json");
  auto with = [&](const nlohmann::json& single) {
    j["post_processor"]["single"] = single;
    std::ofstream(tmp.path / "tokenizer.json") << j.dump();
    Tokenizer t((src / "tokenizer.model").string());
    hub::add_hf_added_tokens(t, tmp.path);
    return t.add_bos();
  };
  CHECK(with(nlohmann::json::parse(
      R"([{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}])")));
  CHECK_THROWS_WITH(with(nlohmann::json::parse(
                        R"([{"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "</s>", "type_id": 0}}])")),
                    Catch::Matchers::Contains("post_processor.single adds tokens mmpost does not reproduce"));
}

}  // namespace golden_test_processor_matrix
