// Image files as they arrive (issue 11, "Images"): truncated JPEG and PNG found before decoding,
// the pixel budget checked from the header, EXIF orientation, 16-bit and alpha handled as Pillow's
// convert("RGB") after ImageOps.exif_transpose (what transformers' load_image hands the image
// processor). Expected values were checked against Pillow 13 by hand (see each case).
#include <cstring>
#include <filesystem>
#include <fstream>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "catch.h"
#include "mmpost/core/check.h"
#include "mmpost/data/image.h"
#include "test_util.h"

namespace unit_test_image_input {

using namespace mmpost;
using namespace mmpost::data;
namespace fs = std::filesystem;
using mmpost::testing::TempDir;

namespace {

std::vector<uint8_t> encode(const cv::Mat& bgr, const std::string& ext,
                            const std::vector<int>& params = {}) {
  std::vector<uint8_t> out;
  REQUIRE(cv::imencode(ext, bgr, out, params));
  return out;
}

fs::path write(const fs::path& p, const std::vector<uint8_t>& bytes) {
  std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                           static_cast<std::streamsize>(bytes.size()));
  return p;
}

/// A 64 x 48 noise image (no run of equal bytes that would compress away), BGR.
cv::Mat noise_image() {
  cv::Mat m(48, 64, CV_8UC3);
  cv::randu(m, 0, 256);
  return m;
}

/// The message of the Error(kData) that loading `p` throws (REQUIREs one).
std::string data_error(const fs::path& p, int64_t max_pixels = kDefaultMaxPixels) {
  try {
    load_image_rgb(p.string(), max_pixels);
  } catch (const Error& e) {
    REQUIRE(e.kind() == ErrorKind::kData);
    return e.what();
  }
  FAIL("no error for " << p);
  return {};
}

/// An APP1 EXIF segment holding one IFD0 entry: Orientation (0x0112, SHORT) = `orientation`.
std::vector<uint8_t> exif_orientation_segment(uint8_t orientation) {
  std::vector<uint8_t> tiff = {'M', 'M', 0, 42, 0, 0, 0, 8,   // big-endian TIFF, IFD0 at 8
                               0, 1,                          // one entry
                               0x01, 0x12, 0, 3, 0, 0, 0, 1,  // tag, type SHORT, count 1
                               0, orientation, 0, 0,          // value (left-justified)
                               0, 0, 0, 0};                   // no next IFD
  std::vector<uint8_t> payload = {'E', 'x', 'i', 'f', 0, 0};
  payload.insert(payload.end(), tiff.begin(), tiff.end());
  const size_t len = payload.size() + 2;
  std::vector<uint8_t> seg = {0xFF, 0xE1, static_cast<uint8_t>(len >> 8), static_cast<uint8_t>(len)};
  seg.insert(seg.end(), payload.begin(), payload.end());
  return seg;
}

}  // namespace

TEST_CASE("image files: truncated JPEG and PNG are refused with the path, whole files load",
          "[unit][data][image]") {
  TempDir dir("img_trunc");
  const auto jpg = encode(noise_image(), ".jpg", {cv::IMWRITE_JPEG_QUALITY, 90});
  const auto png = encode(noise_image(), ".png");
  CHECK(load_image_rgb(write(dir.path / "whole.jpg", jpg).string()).size() == cv::Size(64, 48));
  CHECK(load_image_rgb(write(dir.path / "whole.png", png).string()).size() == cv::Size(64, 48));
  // Non-ASCII paths (UTF-8 on Linux) load like any other.
  fs::create_directories(dir.path / "图片");
  CHECK(load_image_rgb(write(dir.path / "图片" / "数字.png", png).string()).size() == cv::Size(64, 48));
  // Cuts anywhere from 10% to 99% of the file (libjpeg would only warn and fill grey rows).
  for (double keep : {0.10, 0.50, 0.90, 0.99}) {
    INFO("kept " << keep);
    const auto n_jpg = static_cast<size_t>(static_cast<double>(jpg.size()) * keep);
    const auto n_png = static_cast<size_t>(static_cast<double>(png.size()) * keep);
    auto cut_jpg = write(dir.path / "cut.jpg", {jpg.begin(), jpg.begin() + static_cast<long>(n_jpg)});
    auto cut_png = write(dir.path / "cut.png", {png.begin(), png.begin() + static_cast<long>(n_png)});
    CHECK_THAT(data_error(cut_jpg), HasSubstr(cut_jpg.string() + ": truncated JPEG"));
    CHECK_THAT(data_error(cut_png), HasSubstr(cut_png.string() + ": truncated PNG"));
  }
  // Only the last two bytes (the EOI marker) missing: still truncated.
  auto no_eoi = write(dir.path / "no_eoi.jpg", {jpg.begin(), jpg.end() - 2});
  CHECK_THAT(data_error(no_eoi), HasSubstr("before the end-of-image marker"));
  // Bytes after EOI (common from some cameras and editors) are fine, as for Pillow.
  auto trailing = jpg;
  trailing.insert(trailing.end(), {0x00, 0x11, 0x22});
  CHECK(load_image_rgb(write(dir.path / "trailing.jpg", trailing).string()).size() == cv::Size(64, 48));
  // An EXIF segment that itself holds an end-of-image marker (a thumbnail) does not hide a cut
  // in the main image: segments are skipped by their length.
  auto with_thumb = std::vector<uint8_t>(jpg.begin(), jpg.begin() + 2);
  const std::vector<uint8_t> app1 = {0xFF, 0xE1, 0x00, 0x08, 0xFF, 0xD8, 0xFF, 0xD9, 0x00, 0x00};
  with_thumb.insert(with_thumb.end(), app1.begin(), app1.end());
  with_thumb.insert(with_thumb.end(), jpg.begin() + 2, jpg.begin() + static_cast<long>(jpg.size() / 2));
  CHECK_THAT(data_error(write(dir.path / "thumb.jpg", with_thumb)), HasSubstr("truncated JPEG"));
  // Not an image at all.
  auto text = write(dir.path / "text.jpg", {'h', 'e', 'l', 'l', 'o'});
  CHECK_THAT(data_error(text), HasSubstr("cannot decode image"));
  CHECK_THAT(data_error(write(dir.path / "empty.png", {})), HasSubstr("empty image file"));
}

TEST_CASE("image files: the pixel budget is checked from the header, with the dimensions",
          "[unit][data][image]") {
  TempDir dir("img_budget");
  // A 64 x 48 JPEG whose SOF0 claims 20000 x 20000: refused before any decoding, as a 76 KB
  // decompression bomb would be.
  auto jpg = encode(noise_image(), ".jpg");
  size_t sof = 2;
  while (!(jpg[sof] == 0xFF && jpg[sof + 1] == 0xC0)) ++sof;
  for (size_t k : {sof + 5, sof + 7}) {  // height, width (big-endian) after length and precision
    jpg[k] = 20000 >> 8;
    jpg[k + 1] = 20000 & 0xFF;
  }
  auto bomb = write(dir.path / "bomb.jpg", jpg);
  const auto info = inspect_image_file(jpg, bomb.string());
  CHECK(info.format == "jpeg");
  CHECK(info.width == 20000);
  CHECK(info.height == 20000);
  CHECK_THAT(data_error(bomb), HasSubstr("image is 20000x20000 = 400000000 pixels, over "
                                                 "data.image.max_pixels = 178956970 (read from the header"));
  // A budget below a real image's size; 0 lifts it.
  auto png = write(dir.path / "small.png", encode(noise_image(), ".png"));
  CHECK_THAT(data_error(png, 3000), HasSubstr("image is 64x48 = 3072 pixels, over data.image.max_pixels = 3000"));
  CHECK(load_image_rgb(png.string(), 3072).cols == 64);
  CHECK(load_image_rgb(png.string(), 0).cols == 64);
  // Formats without a header check are measured after decoding.
  auto bmp = write(dir.path / "small.bmp", encode(noise_image(), ".bmp"));
  CHECK_THAT(data_error(bmp, 100), HasSubstr("after decoding"));
}

TEST_CASE("image files: EXIF orientation is applied as ImageOps.exif_transpose", "[unit][data][image]") {
  // 32 x 16: left half red, right half blue. Orientation 6 ("rotate 90 CW to display"): Pillow's
  // exif_transpose gives a 16 x 32 image with red on top (checked with Pillow 13: pixel (4, 8)
  // [254, 0, 0], pixel (28, 8) [0, 0, 254]).
  TempDir dir("img_exif");
  cv::Mat bgr(16, 32, CV_8UC3, cv::Scalar(255, 0, 0));  // blue
  bgr(cv::Rect(0, 0, 16, 16)).setTo(cv::Scalar(0, 0, 255));  // red left half
  auto jpg = encode(bgr, ".jpg", {cv::IMWRITE_JPEG_QUALITY, 95});
  auto seg = exif_orientation_segment(6);
  jpg.insert(jpg.begin() + 2, seg.begin(), seg.end());
  auto rgb = load_image_rgb(write(dir.path / "o6.jpg", jpg).string());
  REQUIRE(rgb.size() == cv::Size(16, 32));
  const auto top = rgb.at<cv::Vec3b>(4, 8), bottom = rgb.at<cv::Vec3b>(28, 8);
  CHECK(top[0] > 240);  // red
  CHECK(top[2] < 15);
  CHECK(bottom[2] > 240);  // blue
  CHECK(bottom[0] < 15);
  // Orientation 1 (or none): as stored.
  auto plain = encode(bgr, ".jpg", {cv::IMWRITE_JPEG_QUALITY, 95});
  CHECK(load_image_rgb(write(dir.path / "o1.jpg", plain).string()).size() == cv::Size(32, 16));
}

TEST_CASE("image files: 16-bit and alpha follow Pillow's convert(\"RGB\")", "[unit][data][image]") {
  TempDir dir("img_depth");
  // 16-bit grayscale PNG: Pillow mode I;16, convert("RGB") clips: [0, 100, 255, 300, 1000,
  // 65535] -> [0, 100, 255, 255, 255, 255] (Pillow 13; OpenCV's default would give 0 0 0 1 3 255).
  cv::Mat g16 = (cv::Mat_<uint16_t>(1, 6) << 0, 100, 255, 300, 1000, 65535);
  auto g = load_image_rgb(write(dir.path / "g16.png", encode(g16, ".png")).string());
  REQUIRE(g.size() == cv::Size(6, 1));
  const int expect_gray[] = {0, 100, 255, 255, 255, 255};
  for (int x = 0; x < 6; ++x) {
    INFO("x " << x);
    CHECK(g.at<cv::Vec3b>(0, x) == cv::Vec3b(expect_gray[x], expect_gray[x], expect_gray[x]));
  }
  // 16-bit RGB PNG: Pillow keeps the high byte: (0, 100, 255) -> (0, 0, 0) and
  // (256, 1000, 65535) -> (1, 3, 255) (Pillow 13).
  cv::Mat c16(1, 2, CV_16UC3);
  c16.at<cv::Vec<uint16_t, 3>>(0, 0) = {255, 100, 0};  // BGR
  c16.at<cv::Vec<uint16_t, 3>>(0, 1) = {65535, 1000, 256};
  auto c = load_image_rgb(write(dir.path / "c16.png", encode(c16, ".png")).string());
  CHECK(c.at<cv::Vec3b>(0, 0) == cv::Vec3b(0, 0, 0));
  CHECK(c.at<cv::Vec3b>(0, 1) == cv::Vec3b(1, 3, 255));
  // 8-bit grayscale: replicated to RGB.
  cv::Mat g8 = (cv::Mat_<uint8_t>(1, 3) << 0, 128, 255);
  auto g3 = load_image_rgb(write(dir.path / "g8.png", encode(g8, ".png")).string());
  CHECK(g3.at<cv::Vec3b>(0, 1) == cv::Vec3b(128, 128, 128));
  CHECK(g3.at<cv::Vec3b>(0, 2) == cv::Vec3b(255, 255, 255));
  // RGBA: alpha dropped, no compositing on any background: a fully transparent (10, 20, 30)
  // stays (10, 20, 30), as Pillow's RGBA -> RGB.
  cv::Mat rgba(1, 1, CV_8UC4, cv::Scalar(30, 20, 10, 0));  // BGRA
  auto a = load_image_rgb(write(dir.path / "a.png", encode(rgba, ".png")).string());
  CHECK(a.at<cv::Vec3b>(0, 0) == cv::Vec3b(10, 20, 30));
}

}  // namespace unit_test_image_input
