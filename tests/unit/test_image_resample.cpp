// Pillow-exact resampling (data/image.cpp "pil_*" modes) against values computed with Pillow 13.0
// (Image.fromarray(a).resize((w, h), Image.BICUBIC) on the pattern below), and the HF
// preprocessor_config.json / processor_config.json fields that select it.
#include <filesystem>
#include <fstream>

#include "catch.h"
#include "mmpost/core/check.h"
#include "mmpost/data/image.h"

namespace unit_test_image_resample {

using namespace mmpost;
using namespace mmpost::data;
namespace fs = std::filesystem;

namespace {
/// A w x h RGB pattern with sharp steps (so bicubic overshoots and clips):
/// v(x, y, c) = (53x + 97y + 31c + 19((x y) mod 7)) mod 256.
cv::Mat pattern(int w, int h) {
  cv::Mat m(h, w, CV_8UC3);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      for (int c = 0; c < 3; ++c) {
        const int v = x * 53 + y * 97 + c * 31 + (x * y) % 7 * 19;
        m.at<cv::Vec3b>(y, x)[c] = static_cast<uint8_t>(v % 256);
      }
    }
  }
  return m;
}

std::vector<int> pixels(const cv::Mat& m) {
  REQUIRE(m.isContinuous());
  return {m.data, m.data + m.total() * m.channels()};
}
}  // namespace

TEST_CASE("pil_bicubic equals Pillow's resize bit for bit", "[unit][data]") {
  // Spot-check the pattern itself: row 0 of the 7x5 source.
  CHECK(pixels(pattern(7, 5).row(0).clone()) ==
        std::vector<int>{0, 31, 62, 53, 84, 115, 106, 137, 168, 159, 190, 221, 212, 243, 18, 9, 40,
                         71, 62, 93, 124});
  // Downscale 7x5 -> 3x3: antialiased (support widened by 7/3 and 5/3), horizontal pass first.
  CHECK(pixels(resize_image(pattern(7, 5), 3, 3, "pil_bicubic")) ==
        std::vector<int>{89,  97,  134, 147, 152, 137, 88,  122, 72,  130, 134, 108, 167, 137,
                         109, 83,  126, 131, 81,  89,  120, 135, 86,  118, 180, 92,  126});
  // Upscale 3x3 -> 7x5: plain cubic convolution (a = -0.5); overshoot clips to 0 and 255.
  CHECK(pixels(resize_image(pattern(3, 3), 7, 5, "pil_bicubic")) ==
        std::vector<int>{0,   19,  50,  0,   28,  59,  18,  48,  79,  44,  75,  106, 71,  110, 141,
                         91,  139, 170, 101, 153, 184, 26,  54,  97,  36,  68,  109, 65,  103, 139,
                         100, 131, 162, 130, 117, 147, 154, 93,  124, 164, 85,  115, 90,  121, 152,
                         103, 136, 167, 133, 181, 212, 169, 200, 231, 205, 124, 155, 235, 34,  65,
                         248, 0,   29,  172, 203, 58,  156, 188, 68,  114, 151, 109, 83,  114, 145,
                         115, 102, 144, 160, 99,  131, 177, 98,  128, 219, 250, 0,   184, 215, 0,
                         93,  123, 32,  18,  49,  80,  47,  86,  136, 101, 149, 182, 120, 172,
                         203});
  // 5x9 -> 4x2: the height shrinks by more than twice the width, so Pillow 13 runs the vertical
  // pass first (a horizontal-first order gives different rounding here).
  CHECK(pixels(resize_image(pattern(5, 9), 4, 2, "pil_bicubic")) ==
        std::vector<int>{97,  121, 104, 114, 99,  138, 162, 112, 108, 143, 167, 150,
                         130, 106, 122, 117, 107, 103, 101, 120, 125, 91,  119, 143});
  // Bilinear (triangle filter, support 1) on the same downscale.
  CHECK(pixels(resize_image(pattern(7, 5), 3, 3, "pil_bilinear")) ==
        std::vector<int>{94,  101, 132, 139, 144, 134, 92,  123, 76,  123, 130, 110, 158, 139,
                         108, 90,  121, 128, 84,  91,  122, 137, 88,  119, 175, 91,  122});
  // Same size is a copy; OpenCV's bicubic is a different kernel (no antialiasing).
  CHECK(pixels(resize_image(pattern(7, 5), 7, 5, "pil_bicubic")) == pixels(pattern(7, 5)));
  CHECK(pixels(resize_image(pattern(7, 5), 3, 3, "bicubic")) !=
        pixels(resize_image(pattern(7, 5), 3, 3, "pil_bicubic")));
  CHECK_THROWS_WITH(resize_image(pattern(7, 5), 3, 3, "pil_cubic"),
                    HasSubstr("pil_cubic") && HasSubstr("pil_bicubic"));
}

TEST_CASE("HF preprocessor settings select Pillow's kernels", "[unit][data]") {
  auto dir = fs::temp_directory_path() / ("mmpost_test_pp_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir / name) << text;
    return (dir / name).string();
  };
  ImageProcessorConfig defaults;
  // transformers 4.x preprocessor_config.json: resample 3 = PIL BICUBIC -> pil_bicubic.
  auto a = read_preprocessor_config(
      write("pre.json", R"({"crop_size": {"height": 32, "width": 32}, "resample": 3,
                            "size": {"shortest_edge": 32}, "rescale_factor": 0.5})"),
      defaults);
  CHECK(a.interpolation == "pil_bicubic");
  CHECK(a.image_size == 32);
  CHECK(a.rescale_factor == 0.5);
  // transformers 5 processor_config.json nests the same fields under "image_processor".
  auto b = read_preprocessor_config(
      write("proc.json", R"({"image_processor": {"crop_size": {"height": 48, "width": 48},
                             "resample": 2, "do_rescale": false}, "patch_size": 8})"),
      defaults);
  CHECK(b.interpolation == "pil_bilinear");
  CHECK(b.image_size == 48);
  CHECK(b.rescale_factor == 1.0);
  // mmpost's own key (a recipe's explicit OpenCV choice, saved with the checkpoint) wins.
  auto c = read_preprocessor_config(
      write("mm.json", R"({"resample": 3, "mmpost_interpolation": "bicubic"})"), defaults);
  CHECK(c.interpolation == "bicubic");
  CHECK(preprocessor_config_json(a)["resample"] == 3);
  CHECK(preprocessor_config_json(b)["resample"] == 2);
  CHECK_THROWS_WITH(read_preprocessor_config(write("bad.json", R"({"resample": 9})"), defaults),
                    HasSubstr("bad.json") && HasSubstr("resample"));
  fs::remove_all(dir);
}

}  // namespace unit_test_image_resample
