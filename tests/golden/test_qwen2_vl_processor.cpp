// Parity of mmpost's Qwen2-VL image processor with transformers' Qwen2VLImageProcessorPil: the
// fixture written by scripts/golden/make_qwen2_vl_processor_fixture.py (five real PNGs, the
// preprocessor_config.json save_pretrained wrote, a hub-layout config, expected.safetensors and
// a smart_resize table in case.json) is rebuilt through load_image_rgb +
// read_qwen2_vl_preprocessor_config + preprocess_qwen2_vl_image(s).
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>

#include "catch.h"
#include "mmpost/core/check.h"
#include "mmpost/data/image.h"
#include "mmpost/data/qwen2_vl_image.h"
#include "mmpost/data/sft_dataset.h"
#include "mmpost/hub/hf_folder.h"
#include "mmpost/model/qwen2_vl.h"
#include "mmpost/io/safetensors.h"

namespace golden_test_qwen2_vl_processor {

using namespace mmpost;
using namespace mmpost::data;
namespace fs = std::filesystem;

namespace {

const fs::path kDir = fs::path(MMPOST_SOURCE_DIR) / "tests/golden/fixtures/qwen2_vl_processor";

nlohmann::json read_json(const fs::path& p) {
  std::ifstream f(p);
  REQUIRE(f.good());
  return nlohmann::json::parse(f);
}

std::vector<int64_t> to_vector(const torch::Tensor& t) {
  auto c = t.reshape({-1}).to(torch::kInt64).contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return a.numel() == 0 ? 0.0 : (a - b).abs().max().item<double>();
}

/// A scratch folder removed on scope exit.
struct TempDir {
  fs::path path = fs::temp_directory_path() / ("mmpost_test_qwen2vl_" + std::to_string(::getpid()));
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
  std::string write(const std::string& name, const nlohmann::json& j) const {
    std::ofstream(path / name) << j.dump(2);
    return (path / name).string();
  }
};

/// Error kind and message of what `fn` throws (kRuntime / "" if it does not throw an Error).
template <typename F>
std::pair<ErrorKind, std::string> error_of(F fn) {
  try {
    fn();
  } catch (const Error& e) {
    return {e.kind(), e.what()};
  }
  return {ErrorKind::kRuntime, ""};
}

}  // namespace

TEST_CASE("Qwen2-VL pixel_values and image_grid_thw match transformers' Qwen2VLImageProcessorPil",
          "[golden][qwen2vl]") {
  const auto meta = read_json(kDir / "case.json");
  const auto expected = io::load_safetensors(kDir / "expected.safetensors");
  const auto cfg = read_qwen2_vl_preprocessor_config((kDir / "preprocessor_config.json").string());
  CHECK(cfg.patch_size == 4);
  CHECK(cfg.merge_size == 2);
  CHECK(cfg.min_pixels == 16 * 16);
  CHECK(cfg.max_pixels == 8 * 8 * 20);
  CHECK(cfg.interpolation == "pil_bicubic");

  std::vector<cv::Mat> images;
  std::set<std::string> branches;
  for (const auto& c : meta["cases"]) {
    const std::string file = c["image"].get<std::string>();
    const std::string key = file.substr(0, file.find('.'));
    branches.insert(c["branch"].get<std::string>());
    images.push_back(load_image_rgb((kDir / file).string()));
    const cv::Mat& rgb = images.back();
    SECTION("image " + key) {
      // The uint8 image after smart_resize + the Pillow-exact bicubic.
      const auto [h, w] = smart_resize(rgb.rows, rgb.cols, 8, cfg.min_pixels, cfg.max_pixels);
      CHECK(std::vector<int64_t>{h, w} == c["resized"].get<std::vector<int64_t>>());
      cv::Mat resized =
          resize_image(rgb, static_cast<int>(w), static_cast<int>(h), cfg.interpolation);
      auto ours_u8 = torch::from_blob(resized.data, {resized.rows, resized.cols, 3}, torch::kUInt8)
                         .permute({2, 0, 1});  // [3, H, W]
      const auto& ref_u8 = expected.at(key + ".image_uint8");
      REQUIRE(ours_u8.sizes() == ref_u8.sizes());
      const int64_t n_u8_diff = ours_u8.ne(ref_u8).sum().item<int64_t>();

      const auto out = preprocess_qwen2_vl_image(rgb, cfg);
      const auto& ref = expected.at(key + ".pixel_values");  // [P, 96]
      REQUIRE(out.pixel_values.sizes() == ref.sizes());
      CHECK(out.pixel_values.scalar_type() == torch::kFloat32);
      const double maxdiff = max_abs_diff(out.pixel_values, ref);
      std::cout << "qwen2-vl processor golden " << key << ": " << rgb.cols << "x" << rgb.rows
                << " -> " << w << "x" << h << " (" << c["branch"].get<std::string>()
                << "), resized uint8 pixels differing " << n_u8_diff << ", pixel_values maxdiff "
                << maxdiff << "\n";
      CHECK(n_u8_diff == 0);
      CHECK(maxdiff == 0.0);  // same uint8 input, same float32 arithmetic, a pure permutation
      const std::vector<int64_t> grid(out.grid_thw.begin(), out.grid_thw.end());
      CHECK(grid == to_vector(expected.at(key + ".image_grid_thw")));
      CHECK(out.n_image_tokens == grid[1] * grid[2] / 4);
      CHECK(qwen2_vl_image_tokens(rgb.rows, rgb.cols, cfg) == out.n_image_tokens);
    }
  }
  // The fixture exercises every smart_resize branch.
  CHECK(branches == std::set<std::string>{"round", "max_pixels", "min_pixels"});

  SECTION("all images in one call") {
    const auto [pixel_values, grid_thw] = preprocess_qwen2_vl_images(images, cfg);
    const auto& ref = expected.at("batch.pixel_values");
    REQUIRE(pixel_values.sizes() == ref.sizes());
    const double maxdiff = max_abs_diff(pixel_values, ref);
    std::cout << "qwen2-vl processor golden batch of " << images.size() << ": "
              << pixel_values.size(0) << " patches, pixel_values maxdiff " << maxdiff << "\n";
    CHECK(maxdiff == 0.0);
    CHECK(grid_thw.scalar_type() == torch::kInt64);
    CHECK(grid_thw.sizes() == torch::IntArrayRef{5, 3});
    CHECK(to_vector(grid_thw) == to_vector(expected.at("batch.image_grid_thw")));
    const auto [none, none_grid] = preprocess_qwen2_vl_images({}, cfg);
    CHECK(none.sizes() == torch::IntArrayRef{0, 96});
    CHECK(none_grid.sizes() == torch::IntArrayRef{0, 3});
  }

  SECTION("hub layout at patch size 14") {
    const auto hub =
        read_qwen2_vl_preprocessor_config((kDir / "hub/preprocessor_config.json").string());
    CHECK(hub.min_pixels == 28 * 28);  // top-level min_pixels / max_pixels
    CHECK(hub.max_pixels == 28 * 28 * 2);
    CHECK(hub.patch_size == 14);
    const auto out = preprocess_qwen2_vl_image(images.at(0), hub);
    const auto& ref = expected.at("hub.chelsea.pixel_values");  // [8, 1176]
    REQUIRE(out.pixel_values.sizes() == ref.sizes());
    const double maxdiff = max_abs_diff(out.pixel_values, ref);
    std::cout << "qwen2-vl processor golden hub chelsea: pixel_values maxdiff " << maxdiff << "\n";
    CHECK(maxdiff == 0.0);
    CHECK(std::vector<int64_t>(out.grid_thw.begin(), out.grid_thw.end()) ==
          to_vector(expected.at("hub.chelsea.image_grid_thw")));
    CHECK(out.n_image_tokens == 2);
  }
}

TEST_CASE("Qwen2-VL smart_resize matches transformers on a table of sizes", "[golden][qwen2vl]") {
  const auto meta = read_json(kDir / "case.json");
  int n_checked = 0, n_errors = 0;
  for (const auto& row : meta["smart_resize"]) {
    const auto h = row["height"].get<int64_t>(), w = row["width"].get<int64_t>();
    const auto factor = row["factor"].get<int64_t>();
    const auto lo = row["min_pixels"].get<int64_t>(), hi = row["max_pixels"].get<int64_t>();
    INFO(h << "x" << w << " factor " << factor << " [" << lo << ", " << hi << "] -> "
            << row["expected"].dump());
    if (row["expected"].is_string()) {
      const auto [kind, what] = error_of([&] { smart_resize(h, w, factor, lo, hi); });
      CHECK(kind == ErrorKind::kData);
      const std::string size = std::to_string(w) + "x" + std::to_string(h);
      CHECK_THAT(what, HasSubstr("aspect ratio") && HasSubstr(size));
      ++n_errors;
    } else {
      const auto [rh, rw] = smart_resize(h, w, factor, lo, hi);
      CHECK(std::vector<int64_t>{rh, rw} == row["expected"].get<std::vector<int64_t>>());
    }
    ++n_checked;
  }
  CHECK(n_checked >= 50);
  CHECK(n_errors >= 2);
  // Round half to even, as Python's round: 70 / 28 = 2.5 -> 2.
  CHECK(smart_resize(70, 70, 28, 56 * 56, 28 * 28 * 1280) == std::pair<int64_t, int64_t>{56, 56});
  CHECK(smart_resize(98, 98, 28, 56 * 56, 28 * 28 * 1280) == std::pair<int64_t, int64_t>{112, 112});
}

TEST_CASE("Qwen2-VL preprocessor_config.json round-trips through mmpost and transformers' layout",
          "[golden][qwen2vl]") {
  const fs::path file = kDir / "preprocessor_config.json";
  const auto cfg = read_qwen2_vl_preprocessor_config(file.string());
  // What mmpost writes is what transformers' save_pretrained wrote, key for key.
  CHECK(qwen2_vl_preprocessor_config_json(cfg) == read_json(file));

  Qwen2VLImageConfig custom;
  custom.min_pixels = 100;
  custom.max_pixels = 5000;
  custom.patch_size = 16;
  custom.temporal_patch_size = 1;
  custom.merge_size = 3;
  custom.interpolation = "pil_lanczos";
  custom.do_rescale = false;
  custom.do_normalize = false;
  custom.rescale_factor = 1.0 / 127.5;
  custom.image_mean = {0.5, 0.25, 0.125};
  custom.image_std = {0.2, 0.3, 0.4};
  TempDir tmp;
  const auto back = read_qwen2_vl_preprocessor_config(
      tmp.write("preprocessor_config.json", qwen2_vl_preprocessor_config_json(custom)));
  CHECK(back.min_pixels == 100);
  CHECK(back.max_pixels == 5000);
  CHECK(back.patch_size == 16);
  CHECK(back.temporal_patch_size == 1);
  CHECK(back.merge_size == 3);
  CHECK(back.interpolation == "pil_lanczos");
  CHECK(!back.do_rescale);
  CHECK(!back.do_normalize);
  CHECK(back.do_resize);
  CHECK(back.rescale_factor == custom.rescale_factor);
  CHECK(back.image_mean == custom.image_mean);
  CHECK(back.image_std == custom.image_std);

  // Legacy top-level min_pixels / max_pixels override size (transformers' __init__), and
  // transformers 4.4x's size.min_pixels / max_pixels are ignored.
  const auto legacy = read_qwen2_vl_preprocessor_config(tmp.write(
      "legacy.json", {{"image_processor_type", "Qwen2VLImageProcessorFast"},
                      {"processor_class", "Qwen2VLProcessor"},
                      {"size", {{"shortest_edge", 10}, {"longest_edge", 20}, {"min_pixels", 7}}},
                      {"max_pixels", 12845056}}));
  CHECK(legacy.min_pixels == 10);
  CHECK(legacy.max_pixels == 12845056);
  // An empty file is the class defaults.
  const auto defaults =
      read_qwen2_vl_preprocessor_config(tmp.write("empty.json", nlohmann::json::object()));
  CHECK(defaults.min_pixels == 56 * 56);
  CHECK(defaults.max_pixels == 28 * 28 * 1280);
  CHECK(defaults.patch_size == 14);
  CHECK(defaults.interpolation == "pil_bicubic");
}

TEST_CASE("Qwen2-VL image processor refuses unknown config keys and extreme aspect ratios",
          "[unit][qwen2vl]") {
  TempDir tmp;
  auto base = read_json(kDir / "preprocessor_config.json");
  auto with = [&](const std::string& key, const nlohmann::json& value) {
    auto j = base;
    j[key] = value;
    return tmp.write("bad.json", j);
  };
  auto read_error = [&](const std::string& path) {
    return error_of([&] { read_qwen2_vl_preprocessor_config(path); });
  };
  {
    const auto [kind, what] = read_error(with("merge_sise", 2));
    CHECK(kind == ErrorKind::kUsage);
    CHECK_THAT(what, HasSubstr("bad.json: merge_sise") && HasSubstr("\"merge_size\""));
  }
  {
    const auto [kind, what] = read_error(with("do_center_crop", true));
    CHECK(kind == ErrorKind::kUsage);
    CHECK_THAT(what, HasSubstr("do_center_crop"));
  }
  CHECK(read_error(with("do_center_crop", false)).second.empty());  // off: nothing to reproduce
  {
    const auto [kind, what] = read_error(with("size", {{"shortest_edge", 3136}}));
    CHECK(kind == ErrorKind::kUsage);
    CHECK_THAT(what, HasSubstr("size: needs shortest_edge and longest_edge"));
  }
  {
    const auto [kind, what] = read_error(with("size", {{"height", 56}, {"width", 56}}));
    CHECK(kind == ErrorKind::kUsage);
    CHECK_THAT(what, HasSubstr("size.height"));
  }
  {
    const auto [kind, what] = read_error(with("image_processor_type", "CLIPImageProcessor"));
    CHECK(kind == ErrorKind::kUsage);
    CHECK_THAT(what, HasSubstr("CLIPImageProcessor is not Qwen2VLImageProcessor"));
  }
  {
    const auto [kind, what] = read_error(with("patch_size", "14"));
    CHECK(kind == ErrorKind::kUsage);
    CHECK_THAT(what, HasSubstr("bad.json: patch_size"));
  }
  CHECK_THAT(read_error(with("resample", 9)).second, HasSubstr("not a PIL filter"));

  // Aspect ratio: 200 is allowed, over 200 refused with the size named (exit 3: data).
  Qwen2VLImageConfig cfg;
  CHECK(smart_resize(1, 200, 28, cfg.min_pixels, cfg.max_pixels) ==
        std::pair<int64_t, int64_t>{28, 812});
  cv::Mat strip(1, 201, CV_8UC3, cv::Scalar(10, 20, 30));
  {
    const auto [kind, what] = error_of([&] { preprocess_qwen2_vl_image(strip, cfg); });
    CHECK(kind == ErrorKind::kData);
    CHECK_THAT(what, HasSubstr("201x1") && HasSubstr("aspect ratio"));
  }
  // Without resizing, the sides must hold whole merge windows (transformers' reshape fails).
  cfg.do_resize = false;
  cv::Mat odd(56, 70, CV_8UC3, cv::Scalar(1, 2, 3));
  {
    const auto [kind, what] = error_of([&] { preprocess_qwen2_vl_image(odd, cfg); });
    CHECK(kind == ErrorKind::kData);
    CHECK_THAT(what, HasSubstr("70x56") && HasSubstr("multiples of patch_size * merge_size = 28"));
  }
  cv::Mat whole(56, 84, CV_8UC3, cv::Scalar(1, 2, 3));
  const auto out = preprocess_qwen2_vl_image(whole, cfg);
  CHECK(out.pixel_values.sizes() == torch::IntArrayRef{4 * 6, 3 * 2 * 14 * 14});
  CHECK(out.n_image_tokens == 6);
}

TEST_CASE("a Qwen2-VL training sample equals transformers' Qwen2VLProcessor output: input_ids, "
          "pixel_values, grids and M-RoPE positions", "[golden][qwen2vl]") {
  // scripts/golden/make_qwen2_vl_pipeline_fixture.py: a two-image, two-turn conversation on
  // real photos through the chat template, tokenizer, image processor and get_rope_index.
  const fs::path dir = fs::path(MMPOST_SOURCE_DIR) / "tests/golden/fixtures/qwen2_vl_pipeline";
  const auto expected = io::load_safetensors(dir / "expected.safetensors");
  auto tok = hub::load_tokenizer(dir / "tokenizer.json");
  SampleContext ctx;
  ctx.tokenizer = tok.get();
  ctx.template_options.chat_template = ChatTemplate::kQwen2Vl;
  ctx.template_options.image_token_id = 602;
  ctx.template_options.image_text = "<|image_pad|>";
  ctx.image.qwen = read_qwen2_vl_preprocessor_config((dir / "preprocessor_config.json").string());
  ctx.base_dir = kDir;  // the photos
  ctx.source = (dir / "record.json").string();
  ctx.max_length = 512;
  const auto s = make_sft_sample(read_json(dir / "record.json"), 1, ctx);
  const auto& ids = expected.at("input_ids");  // [1, T]
  CHECK(s.input_ids == to_vector(ids));
  REQUIRE(s.pixel_values.sizes() == expected.at("pixel_values").sizes());
  CHECK(max_abs_diff(s.pixel_values, expected.at("pixel_values")) == 0.0);
  CHECK(to_vector(s.image_grid_thw) == to_vector(expected.at("image_grid_thw")));
  auto [pos, deltas] = model::mrope_position_ids(torch::tensor(s.input_ids).unsqueeze(0),
                                                 s.image_grid_thw, {}, 602, 2);
  CHECK(to_vector(pos) == to_vector(expected.at("position_ids")));
  CHECK(to_vector(deltas) == to_vector(expected.at("rope_deltas")));
  // Labels: the two replies and their <|im_end|>, nothing else.
  int64_t supervised = 0;
  for (int64_t l : s.labels) supervised += l != -100;
  const auto reply1 = tok->encode("a rocket", false), reply2 = tok->encode("an astronaut", false);
  CHECK(supervised == static_cast<int64_t>(reply1.size() + 1 + reply2.size() + 1));
}

}  // namespace golden_test_qwen2_vl_processor
