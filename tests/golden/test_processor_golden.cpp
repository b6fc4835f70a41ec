// Parity of mmpost's preprocessing with transformers' LlavaProcessor: the fixture written by
// scripts/golden/make_processor_fixture.py (HF tokenizer files, preprocessor/processor configs,
// two real PNGs, expected.safetensors) is rebuilt from case.json's messages through Tokenizer +
// hub::add_hf_added_tokens + encode_conversation, and load_image_rgb + resize_for_model +
// to_pixel_values with the Pillow-exact bicubic. Token ids and labels must be identical.
#include <filesystem>
#include <fstream>
#include <iostream>

#include "catch.h"
#include "mmpost/data/chat_template.h"
#include "mmpost/data/image.h"
#include "mmpost/data/tokenizer.h"
#include "mmpost/hub/hf_folder.h"
#include "mmpost/io/safetensors.h"

namespace golden_test_processor_golden {

using namespace mmpost;
using namespace mmpost::data;
namespace fs = std::filesystem;

namespace {

const fs::path kDir = fs::path(MMPOST_SOURCE_DIR) / "tests/golden/fixtures/processor";

std::vector<int64_t> to_vector(const torch::Tensor& t) {
  auto c = t.reshape({-1}).to(torch::kInt64).contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

/// Both id rows as pieces, for a readable failure message.
std::string side_by_side(const Tokenizer& tok, const std::vector<int64_t>& ours,
                         const std::vector<int64_t>& ref) {
  std::string s;
  for (size_t i = 0; i < std::max(ours.size(), ref.size()); ++i) {
    auto piece = [&](const std::vector<int64_t>& v) {
      return i < v.size() ? std::to_string(v[i]) + " " + tok.id_to_piece(v[i]) : std::string("-");
    };
    s += std::to_string(i) + ": " + piece(ours) + " | " + piece(ref) +
         (i < ours.size() && i < ref.size() && ours[i] == ref[i] ? "" : "   <--") + "\n";
  }
  return s;
}

}  // namespace

TEST_CASE("token ids, labels and pixel_values match transformers' LlavaProcessor",
          "[golden][data]") {
  std::ifstream f(kDir / "case.json");
  REQUIRE(f.good());
  const auto meta = nlohmann::json::parse(f);
  const auto expected = io::load_safetensors(kDir / "expected.safetensors");

  // Tokenizer: sentencepiece model + the HF added tokens (<image> = 400, <pad> = 401).
  Tokenizer tok((kDir / "tokenizer.model").string());
  hub::add_hf_added_tokens(tok, kDir);
  const int64_t image_token_id = tok.piece_to_id(kImagePlaceholder);
  CHECK(image_token_id == meta["tokenizer"]["image_token_id"].get<int64_t>());
  CHECK(tok.pad_id() == meta["tokenizer"]["pad_token_id"].get<int64_t>());

  // Image settings: the v4-style preprocessor_config.json and the v5 processor_config.json agree.
  auto image_cfg = read_preprocessor_config((kDir / "preprocessor_config.json").string(), {});
  auto proc_cfg = read_preprocessor_config((kDir / "processor_config.json").string(), {});
  CHECK(image_cfg.interpolation == "pil_bicubic");  // resample 3
  CHECK(image_cfg.image_size == 32);
  CHECK(proc_cfg.interpolation == image_cfg.interpolation);
  CHECK(proc_cfg.image_size == image_cfg.image_size);
  CHECK(proc_cfg.image_mean == image_cfg.image_mean);

  for (const auto& c : meta["cases"]) {
    const std::string name = c["name"].get<std::string>();
    SECTION("case " + name) {
      std::vector<Message> messages;
      for (const auto& m : c["messages"]) {
        messages.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
      }
      TemplateOptions opts{ChatTemplate::kLlava, image_token_id,
                           meta["n_image_tokens"].get<int64_t>(),
                           c["add_generation_prompt"].get<bool>()};
      auto enc = encode_conversation(messages, tok, opts);
      const auto ref_ids = to_vector(expected.at(name + ".input_ids"));
      const auto ref_labels = to_vector(expected.at(name + ".labels"));
      INFO("ours | HF\n" << side_by_side(tok, enc.input_ids, ref_ids));
      CHECK(enc.n_images == 1);
      CHECK(enc.input_ids == ref_ids);
      CHECK(enc.labels == ref_labels);
      // One unpadded row: the attention mask is all ones over the same length.
      const auto ref_mask = to_vector(expected.at(name + ".attention_mask"));
      CHECK(ref_mask == std::vector<int64_t>(enc.input_ids.size(), 1));

      // Image: PIL-exact resize + center crop (uint8), then rescale/normalize (float32).
      auto rgb = load_image_rgb((kDir / c["image"].get<std::string>()).string());
      auto resized = resize_for_model(rgb, image_cfg);  // [32, 32, 3] uint8
      auto ours_u8 = torch::from_blob(resized.data, {resized.rows, resized.cols, 3}, torch::kUInt8)
                         .permute({2, 0, 1});  // [3, 32, 32]
      const auto& ref_u8 = expected.at(name + ".image_uint8");
      REQUIRE(ours_u8.sizes() == ref_u8.sizes());
      const int64_t n_u8_diff = ours_u8.ne(ref_u8).sum().item<int64_t>();
      auto px = to_pixel_values(resized, image_cfg);  // [3, 32, 32] float32
      const auto& ref_px = expected.at(name + ".pixel_values")[0];
      REQUIRE(px.sizes() == ref_px.sizes());
      const double maxdiff = (px - ref_px).abs().max().item<double>();
      std::cout << "processor golden " << name << ": " << enc.input_ids.size()
                << " ids, resized uint8 pixels differing " << n_u8_diff
                << ", pixel_values maxdiff " << maxdiff << "\n";
      CHECK(n_u8_diff == 0);
      CHECK(maxdiff <= 1e-2);
      CHECK(maxdiff <= 1e-6);  // same uint8 input, same float32 arithmetic as HF's PIL backend
    }
  }
}

TEST_CASE("added tokens from a transformers 4.x tokenizer_config.json", "[unit][io]") {
  // The hub's llava-hf folders list added tokens in tokenizer_config.json (no tokenizer.json
  // needed) and give pad_token as an AddedToken object.
  auto dir = fs::temp_directory_path() / ("mmpost_test_added_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto write_cfg = [&](const std::string& text) {
    std::ofstream(dir / "tokenizer_config.json") << text;
  };
  write_cfg(R"({"added_tokens_decoder": {
      "0": {"content": "<unk>", "special": true}, "2": {"content": "</s>", "special": true},
      "400": {"content": "<image>", "special": true}, "401": {"content": "<pad>", "special": true}},
    "pad_token": {"content": "<pad>", "lstrip": false}})");
  Tokenizer tok((kDir / "tokenizer.model").string());
  hub::add_hf_added_tokens(tok, dir);
  CHECK(tok.piece_to_id("<image>") == 400);
  CHECK(tok.pad_id() == 401);
  CHECK(tok.vocab_size() == 402);
  CHECK(tok.encode("a<image>b").at(1) == 400);
  CHECK(tok.decode({1, 400, 2}) == "<image>");  // </s> stays the model's control token
  // An id that contradicts the sentencepiece model names the file.
  write_cfg(R"({"added_tokens_decoder": {"7": {"content": "▁the"}}})");
  CHECK_THROWS_WITH(hub::add_hf_added_tokens(tok, dir),
                    HasSubstr("tokenizer_config.json") && HasSubstr("▁the"));
  fs::remove_all(dir);
}

}  // namespace golden_test_processor_golden
