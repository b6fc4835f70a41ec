// Image preprocessing (see image.h): OpenCV decode and resize, plus a reimplementation of
// Pillow's antialiased resampling (src/libImaging/Resample.c, ImagingResample) so that images
// resized for an HF checkpoint match transformers' PIL-backend CLIPImageProcessor exactly.
#include "mmpost/data/image.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "mmpost/core/check.h"
#include "mmpost/io/jsonl.h"

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

// Pillow's NEAREST resize (_imaging.c _resize -> ImagingScaleAffine, Geometry.c): the source of
// output pixel i is (int)(scale * 0.5 + i * scale) with the offset accumulated by repeated
// addition on both axes, as Pillow's loops do (a direct (i + 0.5) * scale differs at some
// pixels).
cv::Mat pil_nearest(const cv::Mat& in, int width, int height) {
  if (in.cols == width && in.rows == height) return in.clone();
  auto sources = [](int in_size, int out_size) {
    std::vector<int> src(out_size);
    const double scale = static_cast<double>(in_size) / out_size;
    double pos = scale * 0.5;
    for (int i = 0; i < out_size; ++i, pos += scale) {
      src[i] = std::min(static_cast<int>(pos), in_size - 1);
    }
    return src;
  };
  const std::vector<int> xs = sources(in.cols, width), ys = sources(in.rows, height);
  const size_t px = in.elemSize();
  cv::Mat out(height, width, in.type());
  for (int y = 0; y < height; ++y) {
    const uint8_t* src = in.ptr<uint8_t>(ys[y]);
    uint8_t* dst = out.ptr<uint8_t>(y);
    for (int x = 0; x < width; ++x) std::memcpy(dst + x * px, src + xs[x] * px, px);
  }
  return out;
}

int cv_interpolation(const std::string& name) {
  if (name == "bicubic") return cv::INTER_CUBIC;
  if (name == "bilinear") return cv::INTER_LINEAR;
  if (name == "area") return cv::INTER_AREA;
  if (name == "nearest") return cv::INTER_NEAREST;
  throw Error(ErrorKind::kUsage, "image interpolation \"" + name + "\" is not valid",
              "valid values: pil_bicubic, pil_bilinear, pil_lanczos, pil_box, pil_hamming, pil_nearest "
              "(Pillow-exact, as transformers), bicubic, bilinear, area, nearest (OpenCV)");
}
}  // namespace

cv::Mat resize_image(const cv::Mat& img, int width, int height, const std::string& interpolation) {
  TORCH_CHECK(img.depth() == CV_8U && width > 0 && height > 0,
              "resize_image expects an 8-bit image and a positive size");
  if (const PilFilter* f = pil_filter(interpolation)) return pil_resize(img, width, height, *f);
  if (interpolation == "pil_nearest") return pil_nearest(img, width, height);
  const int interp = cv_interpolation(interpolation);
  if (img.cols == width && img.rows == height) return img.clone();
  cv::Mat out;
  cv::resize(img, out, cv::Size(width, height), 0, 0, interp);
  return out;
}

cv::Scalar pad_color(const ImageProcessorConfig& cfg) {
  // tuple(int(x * 255) for x in image_mean): Python's float multiply, then truncation.
  auto level = [&](int c) { return static_cast<double>(static_cast<int>(cfg.image_mean[c] * 255.0)); };
  return cv::Scalar(level(0), level(1), level(2));
}

namespace {
/// The (width, height) transformers' resize produces for a w x h image under `cfg`.
cv::Size resized_size(int w, int h, const ImageProcessorConfig& cfg) {
  if (cfg.resize_height > 0) return {static_cast<int>(cfg.resize_width), static_cast<int>(cfg.resize_height)};
  const int64_t size = cfg.resize_shortest_edge > 0 ? cfg.resize_shortest_edge : cfg.image_size;
  // get_resize_output_image_size (default_to_square=False): int(size * long / short); for these
  // integers the float quotient never rounds across an integer, so integer division agrees.
  const int64_t short_side = std::min(h, w), long_side = std::max(h, w);
  const int new_long = static_cast<int>(size * long_side / short_side);
  return h <= w ? cv::Size(new_long, static_cast<int>(size)) : cv::Size(static_cast<int>(size), new_long);
}
}  // namespace

cv::Mat resize_for_model(const cv::Mat& rgb, const ImageProcessorConfig& cfg) {
  TORCH_CHECK(rgb.type() == CV_8UC3, "resize_for_model expects 8-bit RGB");
  const int size = static_cast<int>(cfg.image_size);
  cv::Mat img = rgb;
  if (cfg.resize_mode == "pad_to_square" && img.rows != img.cols) {
    const int side = std::max(img.cols, img.rows);
    const int top = (side - img.rows) / 2, left = (side - img.cols) / 2;
    cv::Mat square;
    cv::copyMakeBorder(img, square, top, side - img.rows - top, left, side - img.cols - left,
                       cv::BORDER_CONSTANT, pad_color(cfg));
    img = square;
  }
  if (cfg.do_resize) {
    const cv::Size to = resized_size(img.cols, img.rows, cfg);
    img = resize_image(img, to.width, to.height, cfg.interpolation);
  }
  if (cfg.do_center_crop && (img.rows != size || img.cols != size)) {
    if (img.rows < size || img.cols < size) {
      // center_crop pads a too-small image with zeros first: ceil((new - old) / 2) before it.
      const int nh = std::max(size, img.rows), nw = std::max(size, img.cols);
      const int top = (nh - img.rows + 1) / 2, left = (nw - img.cols + 1) / 2;
      cv::Mat padded;
      cv::copyMakeBorder(img, padded, top, nh - img.rows - top, left, nw - img.cols - left,
                         cv::BORDER_CONSTANT, cv::Scalar(0, 0, 0));
      // The crop window: Python's (old - crop) // 2 (floor) shifted by the padding.
      auto floor_half = [](int a) { return a >= 0 ? a / 2 : -((1 - a) / 2); };
      img = padded(cv::Rect(floor_half(img.cols - size) + left, floor_half(img.rows - size) + top,
                            size, size));
    } else {
      img = img(cv::Rect((img.cols - size) / 2, (img.rows - size) / 2, size, size));
    }
  }
  if (img.rows != size || img.cols != size) {
    throw Error(ErrorKind::kData, "image is " + std::to_string(img.cols) + "x" +
                                      std::to_string(img.rows) + " after preprocessing, not the " +
                                      std::to_string(size) + "x" + std::to_string(size) +
                                      " the vision tower takes (do_center_crop is off)");
  }
  return img.clone();
}

void check_processor_for_model(const ImageProcessorConfig& cfg, int64_t vision_image_size,
                               const std::string& where) {
  MMPOST_CHECK_USAGE(cfg.image_size == vision_image_size, where, ": crop_size ", cfg.image_size,
                     " differs from vision_config.image_size ", vision_image_size,
                     " (transformers' CLIP vision tower refuses such pixel_values)");
  if (cfg.do_center_crop) return;
  const bool square_out =
      (cfg.do_resize && cfg.resize_height > 0 && cfg.resize_height == cfg.image_size &&
       cfg.resize_width == cfg.image_size);
  MMPOST_CHECK_USAGE(square_out, where, ": do_center_crop is false, so size must be {\"height\": ",
                     cfg.image_size, ", \"width\": ", cfg.image_size,
                     "} for every image to reach the vision tower at ", cfg.image_size, "x",
                     cfg.image_size);
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
  cv::Mat out;
  cv::warpAffine(rgb, out, m, rgb.size(), cv::INTER_NEAREST, cv::BORDER_CONSTANT, pad_color(cfg));
  return out;
}

torch::Tensor load_pixel_values(const std::string& path, const ImageProcessorConfig& cfg) {
  return to_pixel_values(resize_for_model(load_image_rgb(path, cfg.max_pixels), cfg), cfg);
}

}  // namespace mmpost::data

#include <fstream>
#include <set>

#include "mmpost/config/schema.h"

namespace mmpost::data {

namespace {
// Keys of an HF image processor file, by what mmpost does with them.
const std::set<std::string> kReproducedKeys = {
    "do_resize", "size", "resample", "do_center_crop", "crop_size", "do_rescale",
    "rescale_factor", "do_normalize", "image_mean", "image_std", "do_convert_rgb", "do_pad",
    "pad_size", "default_to_square", "image_processor_type", "mmpost_resize_mode",
    "mmpost_interpolation"};
// Saved by transformers but without effect on pixel_values of one RGB image.
const std::set<std::string> kInertKeys = {
    "processor_class", "feature_extractor_type", "_processor_class", "input_data_format",
    "data_format", "return_tensors", "device", "disable_grouping", "image_seq_length",
    "transformers_version"};
const std::set<std::string> kProcessorTypes = {
    "CLIPImageProcessor", "CLIPImageProcessorFast", "CLIPImageProcessorPil",
    "LlavaImageProcessor", "LlavaImageProcessorFast", "LlavaImageProcessorPil"};
}  // namespace

ImageProcessorConfig read_preprocessor_config(const std::string& path,
                                              const ImageProcessorConfig& defaults,
                                              ProcessorFileInfo* info) {
  nlohmann::json j = io::read_json_object_file(path);
  std::string prefix;
  // Processor-level fields (LlavaProcessor): how many tokens one <image> expands to. transformers
  // 5 nests the image settings under "image_processor"; 4.4x wrote only these fields here.
  static const std::set<std::string> kProcessorKeys = {
      "patch_size", "num_additional_image_tokens", "vision_feature_select_strategy",
      "processor_class", "image_token", "chat_template", "image_processor", "tokenizer"};
  const bool nested = j.contains("image_processor") && j["image_processor"].is_object();
  bool processor_only = !nested && j.contains("patch_size");
  if (nested || processor_only) {
    for (const auto& [key, value] : j.items()) {
      if (nested && !kProcessorKeys.count(key) && !value.is_null()) {
        throw Error(ErrorKind::kUsage, path + ": " + key + ": not a LlavaProcessor field mmpost "
                    "reproduces");
      }
      if (processor_only && !kProcessorKeys.count(key)) processor_only = false;
    }
  }
  if (nested || processor_only) {
    try {
      if (info != nullptr && j.contains("patch_size") && !j["patch_size"].is_null()) {
        const int64_t patch = j["patch_size"].get<int64_t>();
        int64_t side = defaults.image_size;
        if (nested) {
          const auto& ip = j["image_processor"];
          const auto& crop = ip.contains("crop_size") ? ip["crop_size"] : nlohmann::json(224);
          side = crop.is_object() ? crop.value("height", int64_t{0})
                                  : crop.is_number() ? crop.get<int64_t>() : 0;
        }
        if (patch > 0 && side > 0) {
          info->image_tokens =
              (side / patch) * (side / patch) + j.value("num_additional_image_tokens", int64_t{0}) -
              (j.value("vision_feature_select_strategy", std::string("default")) == "default" ? 1 : 0);
        }
      }
    } catch (const nlohmann::json::exception& e) {
      throw Error(ErrorKind::kUsage, path + ": " + e.what());
    }
    if (processor_only) return defaults;
    nlohmann::json inner = j["image_processor"];
    j = std::move(inner);
    prefix = "image_processor.";
  }
  if (info != nullptr) info->has_image_settings = true;
  auto where = [&](const std::string& key) { return path + ": " + prefix + key; };
  for (const auto& [key, value] : j.items()) {
    if (kReproducedKeys.count(key) || kInertKeys.count(key)) continue;
    if (value.is_null() || (value.is_boolean() && !value.get<bool>())) continue;  // unset / off
    std::vector<std::string> known(kReproducedKeys.begin(), kReproducedKeys.end());
    const std::string near = config::closest_key(key, known);
    throw Error(ErrorKind::kUsage,
                where(key) + ": not reproduced by mmpost (transformers would apply it to "
                "pixel_values, or it is not an image processor field)",
                near.empty() ? "remove it if the model was trained without it"
                             : "did you mean \"" + prefix + near + "\"?");
  }
  ImageProcessorConfig cfg = defaults;
  const std::string type = j.value("image_processor_type", std::string());
  if (!type.empty()) {
    MMPOST_CHECK_USAGE(kProcessorTypes.count(type), where("image_processor_type"), ": ", type,
                       " is not reproduced (mmpost follows CLIPImageProcessor and "
                       "LlavaImageProcessor)");
    // A typed file is read as transformers reads it: absent fields take the class defaults.
    ImageProcessorConfig clip;
    clip.image_size = 224;
    clip.interpolation = "pil_bicubic";
    clip.max_pixels = defaults.max_pixels;
    cfg = clip;
  }
  auto size_of = [&](const char* key, bool crop) {
    const auto& v = j[key];
    if (v.is_number_integer()) {
      const int64_t n = v.get<int64_t>();
      if (crop || j.value("default_to_square", false)) {
        if (!crop) cfg.resize_height = cfg.resize_width = n;
        return n;
      }
      cfg.resize_shortest_edge = n;
      return n;
    }
    MMPOST_CHECK_USAGE(v.is_object(), where(key), ": expected an integer or an object");
    for (const auto& [k, x] : v.items()) {
      if (x.is_null()) continue;
      const bool ok = k == "height" || k == "width" || (!crop && k == "shortest_edge");
      MMPOST_CHECK_USAGE(ok, where(key), ".", k, ": not reproduced by mmpost (it reads ",
                         crop ? "height and width" : "shortest_edge, or height and width", ")");
    }
    if (!crop && v.contains("shortest_edge") && v["shortest_edge"].is_number_integer()) {
      cfg.resize_shortest_edge = v["shortest_edge"].get<int64_t>();
      cfg.resize_height = cfg.resize_width = 0;
      return cfg.resize_shortest_edge;
    }
    MMPOST_CHECK_USAGE(v.contains("height") && v.contains("width") &&
                           v["height"].is_number_integer() && v["width"].is_number_integer(),
                       where(key), ": expected {\"height\", \"width\"}",
                       crop ? "" : " or {\"shortest_edge\"}");
    const int64_t h = v["height"].get<int64_t>(), w = v["width"].get<int64_t>();
    MMPOST_CHECK_USAGE(h > 0 && w > 0, where(key), ": sizes must be positive");
    if (crop) {
      MMPOST_CHECK_USAGE(h == w, where(key), ": ", h, "x", w,
                         " is not square (the vision tower takes square images)");
      return h;
    }
    cfg.resize_height = h;
    cfg.resize_width = w;
    return h;
  };
  try {
    if (j.contains("size") && !j["size"].is_null()) {
      const int64_t s = size_of("size", false);
      // Without crop_size a typed file crops to the class default (224), as transformers does.
      if (type.empty() && !j.contains("crop_size")) cfg.image_size = s;
    }
    if (j.contains("crop_size") && !j["crop_size"].is_null()) cfg.image_size = size_of("crop_size", true);
    if (j.contains("image_mean")) cfg.image_mean = j["image_mean"].get<std::vector<double>>();
    if (j.contains("image_std")) cfg.image_std = j["image_std"].get<std::vector<double>>();
    if (j.contains("resample") && !j["resample"].is_null()) {
      // PIL.Image.Resampling values; transformers resizes with Pillow, so use its exact kernels.
      static const char* kPilNames[] = {"pil_nearest", "pil_lanczos", "pil_bilinear",
                                        "pil_bicubic", "pil_box",     "pil_hamming"};
      const int r = j["resample"].get<int>();
      MMPOST_CHECK_USAGE(r >= 0 && r <= 5, where("resample"), ": ", r,
                         " is not a PIL filter (0-5)");
      cfg.interpolation = kPilNames[r];
    }
    if (j.contains("rescale_factor")) cfg.rescale_factor = j["rescale_factor"].get<double>();
    cfg.do_resize = j.value("do_resize", true);
    cfg.do_center_crop = j.value("do_center_crop", type.empty() ? defaults.do_center_crop : true);
    if (j.value("do_pad", false)) {
      // LlavaImageProcessor pads to a square before resizing; CLIP's do_pad pads a batch to
      // pad_size afterwards, a no-op once every image is cropped to the same square.
      const bool llava = type.rfind("LlavaImageProcessor", 0) == 0;
      MMPOST_CHECK_USAGE(llava || cfg.do_center_crop, where("do_pad"),
                         ": batch padding without a center crop is not reproduced");
      if (llava) cfg.resize_mode = "pad_to_square";
    }
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
  MMPOST_CHECK_USAGE(cfg.resize_mode == "pad_to_square" || cfg.resize_mode == "shortest_edge_center_crop",
                     where("mmpost_resize_mode"), ": \"", cfg.resize_mode, "\" is not valid");
  return cfg;
}

nlohmann::json preprocessor_config_json(const ImageProcessorConfig& cfg) {
  const std::string& in = cfg.interpolation;
  int resample = in == "nearest" || in == "pil_nearest"    ? 0
                 : in == "pil_lanczos"                      ? 1
                 : in == "bilinear" || in == "pil_bilinear" ? 2
                 : in == "pil_box"                          ? 4
                 : in == "pil_hamming"                      ? 5
                                                            : 3;
  const bool pad = cfg.resize_mode == "pad_to_square";
  nlohmann::json size =
      cfg.resize_height > 0
          ? nlohmann::json{{"height", cfg.resize_height}, {"width", cfg.resize_width}}
          : nlohmann::json{{"shortest_edge", cfg.resize_shortest_edge > 0 ? cfg.resize_shortest_edge
                                                                          : cfg.image_size}};
  const bool normalize = !(cfg.image_mean == std::vector<double>{0, 0, 0} &&
                           cfg.image_std == std::vector<double>{1, 1, 1});
  // LlavaImageProcessor is CLIP's processor plus do_pad (pad to square before resizing), so a
  // pad_to_square model loads into transformers with the same preprocessing.
  return {
      {"image_processor_type", pad ? "LlavaImageProcessor" : "CLIPImageProcessor"},
      {"processor_class", "LlavaProcessor"},
      {"do_pad", pad},
      {"do_resize", cfg.do_resize},
      {"size", size},
      {"resample", resample},
      {"do_center_crop", cfg.do_center_crop},
      {"crop_size", {{"height", cfg.image_size}, {"width", cfg.image_size}}},
      {"do_rescale", cfg.rescale_factor != 1.0},
      {"rescale_factor", cfg.rescale_factor},
      {"do_normalize", normalize},
      {"image_mean", cfg.image_mean},
      {"image_std", cfg.image_std},
      {"do_convert_rgb", true},
      {"mmpost_resize_mode", cfg.resize_mode},
      {"mmpost_interpolation", cfg.interpolation},
  };
}

}  // namespace mmpost::data
