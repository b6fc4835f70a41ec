// Image preprocessing (see image.h): OpenCV decode and resize, plus a reimplementation of
// Pillow's antialiased resampling (src/libImaging/Resample.c, ImagingResample) so that images
// resized for an HF checkpoint match transformers' PIL-backend CLIPImageProcessor exactly.
#include "mmpost/data/image.h"

#include <cmath>
#include <filesystem>
#include <random>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "mmpost/core/check.h"

namespace mmpost::data {
namespace {

// ---- Pillow-compatible resampling (Pillow src/libImaging/Resample.c) -------------------------
// Each output pixel is a weighted sum of the input pixels under a filter centered on it; the
// filter is stretched by the scale when shrinking (antialiasing), weights are normalized to sum
// to 1, rounded to 22-bit fixed point, and each of the two separable passes rounds and clips to
// uint8, exactly as Pillow does for 8-bit images (so results are bit-identical, not just close).

/// A resampling kernel and its support (half-width, in input pixels at scale 1).
struct PilFilter {
  double (*weight)(double x);
  double support;
};

double pil_box(double x) { return (x > -0.5 && x <= 0.5) ? 1.0 : 0.0; }

double pil_bilinear(double x) {
  x = std::fabs(x);
  return x < 1.0 ? 1.0 - x : 0.0;
}

double pil_hamming(double x) {
  x = std::fabs(x);
  if (x == 0.0) return 1.0;
  if (x >= 1.0) return 0.0;
  x *= M_PI;
  return std::sin(x) / x * (0.54f + 0.46f * std::cos(x));  // float constants, as Pillow
}

// Keys' cubic convolution with a = -0.5 (Pillow's BICUBIC).
double pil_bicubic(double x) {
  constexpr double a = -0.5;
  x = std::fabs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

double pil_sinc(double x) {
  if (x == 0.0) return 1.0;
  x *= M_PI;
  return std::sin(x) / x;
}

double pil_lanczos(double x) {
  return (-3.0 <= x && x < 3.0) ? pil_sinc(x) * pil_sinc(x / 3) : 0.0;
}

/// The Pillow filter for a "pil_*" interpolation name, or nullptr for the OpenCV modes.
const PilFilter* pil_filter(const std::string& name) {
  static const PilFilter kBox{pil_box, 0.5}, kBilinear{pil_bilinear, 1.0},
      kHamming{pil_hamming, 1.0}, kBicubic{pil_bicubic, 2.0}, kLanczos{pil_lanczos, 3.0};
  if (name == "pil_bicubic") return &kBicubic;
  if (name == "pil_bilinear") return &kBilinear;
  if (name == "pil_lanczos") return &kLanczos;
  if (name == "pil_box") return &kBox;
  if (name == "pil_hamming") return &kHamming;
  return nullptr;
}

constexpr int kPrecisionBits = 32 - 8 - 2;  // Pillow's PRECISION_BITS: 8-bit result, 2 spare bits

/// Fixed-point weights of one resampling axis: output pixel i reads `count[i]` inputs from
/// `first[i]` with weights k[i * ksize + j].
struct PilCoeffs {
  int ksize = 0;
  std::vector<int> first, count;
  std::vector<int32_t> k;
};

// Pillow precompute_coeffs + normalize_coeffs_8bpc for the box [0, in_size).
PilCoeffs pil_coeffs(int in_size, int out_size, const PilFilter& f) {
  const double scale = static_cast<double>(in_size) / out_size;
  const double filterscale = std::max(scale, 1.0);
  const double support = f.support * filterscale;
  PilCoeffs c;
  c.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  c.first.resize(out_size);
  c.count.resize(out_size);
  c.k.assign(static_cast<size_t>(out_size) * c.ksize, 0);
  std::vector<double> w(c.ksize);
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = (xx + 0.5) * scale;
    // (int) truncates toward zero, like Pillow's "round the value" casts.
    const int xmin = std::max(static_cast<int>(center - support + 0.5), 0);
    const int xmax = std::min(static_cast<int>(center + support + 0.5), in_size) - xmin;
    const double ss = 1.0 / filterscale;  // multiply by the reciprocal, as Pillow (not divide)
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) {
      w[x] = f.weight((x + xmin - center + 0.5) * ss);
      ww += w[x];
    }
    for (int x = 0; x < xmax; ++x) {
      const double v = ww != 0.0 ? w[x] / ww : w[x];
      c.k[static_cast<size_t>(xx) * c.ksize + x] =
          static_cast<int32_t>(v < 0 ? -0.5 + v * (1 << kPrecisionBits)
                                     : 0.5 + v * (1 << kPrecisionBits));
    }
    c.first[xx] = xmin;
    c.count[xx] = xmax;
  }
  return c;
}

/// Pillow's clip8: drop the fixed-point fraction (floor), clamp to [0, 255].
inline uint8_t pil_clip8(int32_t ss) {
  const int32_t v = ss >> kPrecisionBits;
  return static_cast<uint8_t>(v < 0 ? 0 : v > 255 ? 255 : v);
}

/// One separable pass over an 8-bit HWC image. `horizontal`: out is [rows, c.first.size()] and
/// row r reads input row r + row_offset; otherwise out row i mixes input rows c.first[i]...
cv::Mat pil_pass(const cv::Mat& in, const PilCoeffs& c, bool horizontal, int row_offset,
                 int out_rows) {
  const int n_ch = in.channels();
  const int out_size = static_cast<int>(c.first.size());
  cv::Mat out(horizontal ? out_rows : out_size, horizontal ? out_size : in.cols, in.type());
  std::vector<int32_t> ss(n_ch);
  for (int yy = 0; yy < out.rows; ++yy) {
    uint8_t* dst = out.ptr<uint8_t>(yy);
    for (int xx = 0; xx < out.cols; ++xx) {
      const int i = horizontal ? xx : yy;
      const int32_t* k = &c.k[static_cast<size_t>(i) * c.ksize];
      std::fill(ss.begin(), ss.end(), int32_t{1} << (kPrecisionBits - 1));  // rounding offset
      for (int j = 0; j < c.count[i]; ++j) {
        const uint8_t* src = horizontal ? in.ptr<uint8_t>(yy + row_offset) + (c.first[i] + j) * n_ch
                                        : in.ptr<uint8_t>(c.first[i] + j) + xx * n_ch;
        for (int ch = 0; ch < n_ch; ++ch) ss[ch] += src[ch] * k[j];
      }
      for (int ch = 0; ch < n_ch; ++ch) dst[xx * n_ch + ch] = pil_clip8(ss[ch]);
    }
  }
  return out;
}

// Pillow ImagingResampleInner (13.0): two separable passes; a pass whose size is unchanged is
// skipped (no rounding step). Horizontal first, over only the rows the vertical pass reads, unless
// the height shrinks by more than twice as many pixels as the width: then vertical first. (Pillow
// < 13 always ran horizontal first; in that one case its uint8 output can differ by 1 here and
// there.)
cv::Mat pil_resize(const cv::Mat& in, int width, int height, const PilFilter& f) {
  if (in.cols == width && in.rows == height) return in.clone();
  const bool need_h = width != in.cols, need_v = height != in.rows;
  const int dy = in.rows - height, dx = in.cols - width;
  const bool horizontal_first = !(dy > 0 && dy > dx * 2);
  cv::Mat cur = in;
  if (horizontal_first) {
    PilCoeffs vert = pil_coeffs(in.rows, height, f);
    if (need_h) {
      const int row_first = vert.first.front();
      const int row_last = vert.first.back() + vert.count.back();
      cur = pil_pass(in, pil_coeffs(in.cols, width, f), /*horizontal=*/true, row_first,
                     row_last - row_first);
      for (int& r : vert.first) r -= row_first;
    }
    if (need_v) cur = pil_pass(cur, vert, /*horizontal=*/false, 0, 0);
  } else {
    cur = pil_pass(in, pil_coeffs(in.rows, height, f), /*horizontal=*/false, 0, 0);
    if (need_h) cur = pil_pass(cur, pil_coeffs(in.cols, width, f), /*horizontal=*/true, 0, height);
  }
  return cur;
}

int cv_interpolation(const std::string& name) {
  if (name == "bicubic") return cv::INTER_CUBIC;
  if (name == "bilinear") return cv::INTER_LINEAR;
  if (name == "area") return cv::INTER_AREA;
  if (name == "nearest") return cv::INTER_NEAREST;
  throw Error(ErrorKind::kUsage, "image interpolation \"" + name + "\" is not valid",
              "valid values: pil_bicubic, pil_bilinear, pil_lanczos, pil_box, pil_hamming "
              "(Pillow-exact, as transformers), bicubic, bilinear, area, nearest (OpenCV)");
}
}  // namespace

cv::Mat resize_image(const cv::Mat& img, int width, int height, const std::string& interpolation) {
  TORCH_CHECK(img.depth() == CV_8U && width > 0 && height > 0,
              "resize_image expects an 8-bit image and a positive size");
  if (const PilFilter* f = pil_filter(interpolation)) return pil_resize(img, width, height, *f);
  const int interp = cv_interpolation(interpolation);
  if (img.cols == width && img.rows == height) return img.clone();
  cv::Mat out;
  cv::resize(img, out, cv::Size(width, height), 0, 0, interp);
  return out;
}

cv::Mat resize_for_model(const cv::Mat& rgb, const ImageProcessorConfig& cfg) {
  TORCH_CHECK(rgb.type() == CV_8UC3, "resize_for_model expects 8-bit RGB");
  const int size = static_cast<int>(cfg.image_size);
  if (cfg.resize_mode == "pad_to_square") {
    int side = std::max(rgb.cols, rgb.rows);
    cv::Scalar fill(cfg.image_mean[0] * 255.0, cfg.image_mean[1] * 255.0, cfg.image_mean[2] * 255.0);
    int top = (side - rgb.rows) / 2, left = (side - rgb.cols) / 2;
    cv::Mat square;
    cv::copyMakeBorder(rgb, square, top, side - rgb.rows - top, left, side - rgb.cols - left,
                       cv::BORDER_CONSTANT, fill);
    return resize_image(square, size, size, cfg.interpolation);
  }
  // Shortest edge -> size, keeping the aspect ratio: transformers get_resize_output_image_size
  // (default_to_square=False) computes int(size * long / short), i.e. floor for these integers.
  int h = rgb.rows, w = rgb.cols;
  int short_side = std::min(h, w), long_side = std::max(h, w);
  int new_long = static_cast<int>(static_cast<int64_t>(size) * long_side / short_side);
  int new_h = h <= w ? size : new_long;
  int new_w = h <= w ? new_long : size;
  cv::Mat resized = resize_image(rgb, new_w, new_h, cfg.interpolation);
  // transformers image_transforms.center_crop: top = (h - crop) // 2, left = (w - crop) // 2.
  int top = (new_h - size) / 2, left = (new_w - size) / 2;
  return resized(cv::Rect(left, top, size, size)).clone();
}

torch::Tensor to_pixel_values(const cv::Mat& rgb, const ImageProcessorConfig& cfg) {
  TORCH_CHECK(rgb.type() == CV_8UC3 && rgb.isContinuous(), "to_pixel_values expects 8-bit RGB");
  auto hwc = torch::from_blob(rgb.data, {rgb.rows, rgb.cols, 3}, torch::kUInt8);
  // HF rescale: float64 multiply by rescale_factor, one rounding to float32 (for 1/255 this equals
  // a float32 divide on all 256 values; kept for other factors). Normalize then runs in float32,
  // as numpy does on HF's float32 image.
  auto x = hwc.permute({2, 0, 1}).to(torch::kFloat64).mul(cfg.rescale_factor).to(torch::kFloat32);
  auto mean = torch::tensor(std::vector<float>(cfg.image_mean.begin(), cfg.image_mean.end()))
                  .view({3, 1, 1});
  auto std = torch::tensor(std::vector<float>(cfg.image_std.begin(), cfg.image_std.end()))
                 .view({3, 1, 1});
  return ((x - mean) / std).contiguous();  // [3, H, W]
}

cv::Mat random_shift(const cv::Mat& rgb, int64_t max_shift, uint64_t seed,
                     const ImageProcessorConfig& cfg) {
  if (max_shift <= 0) return rgb;
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> dist(-max_shift, max_shift);
  const double dx = static_cast<double>(dist(rng)), dy = static_cast<double>(dist(rng));
  cv::Mat m = (cv::Mat_<double>(2, 3) << 1, 0, dx, 0, 1, dy);
  cv::Scalar fill(cfg.image_mean[0] * 255.0, cfg.image_mean[1] * 255.0, cfg.image_mean[2] * 255.0);
  cv::Mat out;
  cv::warpAffine(rgb, out, m, rgb.size(), cv::INTER_NEAREST, cv::BORDER_CONSTANT, fill);
  return out;
}

torch::Tensor load_pixel_values(const std::string& path, const ImageProcessorConfig& cfg) {
  return to_pixel_values(resize_for_model(load_image_rgb(path, cfg.max_pixels), cfg), cfg);
}

}  // namespace mmpost::data

#include <fstream>

namespace mmpost::data {

ImageProcessorConfig read_preprocessor_config(const std::string& path,
                                              const ImageProcessorConfig& defaults) {
  ImageProcessorConfig cfg = defaults;
  std::ifstream in(path);
  MMPOST_CHECK_USAGE(in.good(), path, ": cannot open");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(ErrorKind::kUsage, path + ": invalid JSON: " + e.what());
  }
  // transformers 5 saves processors as processor_config.json with the image settings nested.
  if (j.contains("image_processor") && j["image_processor"].is_object()) {
    nlohmann::json inner = j["image_processor"];
    j = std::move(inner);
  }
  auto get_size = [&](const char* key) -> int64_t {
    const auto& v = j[key];
    if (v.is_number_integer()) return v.get<int64_t>();
    if (v.is_object()) {
      for (const char* k : {"shortest_edge", "height"}) {
        if (v.contains(k) && v[k].is_number_integer()) return v[k].get<int64_t>();
      }
    }
    throw Error(ErrorKind::kUsage, path + ": " + key + ": expected an integer or {height, width}");
  };
  try {
    if (j.contains("crop_size")) cfg.image_size = get_size("crop_size");
    else if (j.contains("size")) cfg.image_size = get_size("size");
    if (j.contains("image_mean")) cfg.image_mean = j["image_mean"].get<std::vector<double>>();
    if (j.contains("image_std")) cfg.image_std = j["image_std"].get<std::vector<double>>();
    if (j.contains("resample")) {
      // PIL.Image.Resampling values; transformers resizes with Pillow, so use its exact kernels.
      static const char* kPilNames[] = {"nearest", "pil_lanczos", "pil_bilinear", "pil_bicubic",
                                        "pil_box", "pil_hamming"};
      int r = j["resample"].get<int>();
      MMPOST_CHECK_USAGE(r >= 0 && r <= 5, path, ": resample: ", r,
                         " is not a supported PIL filter (0-5)");
      cfg.interpolation = kPilNames[r];
    }
    if (j.contains("rescale_factor")) cfg.rescale_factor = j["rescale_factor"].get<double>();
    if (j.contains("mmpost_resize_mode")) cfg.resize_mode = j["mmpost_resize_mode"].get<std::string>();
    if (j.contains("mmpost_interpolation")) cfg.interpolation = j["mmpost_interpolation"].get<std::string>();
    if (j.value("do_rescale", true) == false) cfg.rescale_factor = 1.0;
    if (j.value("do_normalize", true) == false) {
      cfg.image_mean = {0, 0, 0};
      cfg.image_std = {1, 1, 1};
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorKind::kUsage, path + ": " + e.what());
  }
  MMPOST_CHECK_USAGE(cfg.image_mean.size() == 3 && cfg.image_std.size() == 3, path,
                     ": image_mean and image_std need 3 values");
  return cfg;
}

nlohmann::json preprocessor_config_json(const ImageProcessorConfig& cfg) {
  const std::string& in = cfg.interpolation;
  int resample = in == "nearest"                            ? 0
                 : in == "pil_lanczos"                      ? 1
                 : in == "bilinear" || in == "pil_bilinear" ? 2
                 : in == "pil_box"                          ? 4
                 : in == "pil_hamming"                      ? 5
                                                            : 3;
  return {
      {"image_processor_type", "CLIPImageProcessor"},
      {"processor_class", "LlavaProcessor"},
      {"do_resize", true},
      {"size", {{"shortest_edge", cfg.image_size}}},
      {"resample", resample},
      {"do_center_crop", true},
      {"crop_size", {{"height", cfg.image_size}, {"width", cfg.image_size}}},
      {"do_rescale", true},
      {"rescale_factor", cfg.rescale_factor},
      {"do_normalize", true},
      {"image_mean", cfg.image_mean},
      {"image_std", cfg.image_std},
      {"do_convert_rgb", true},
      {"mmpost_resize_mode", cfg.resize_mode},
      {"mmpost_interpolation", cfg.interpolation},
  };
}

}  // namespace mmpost::data
