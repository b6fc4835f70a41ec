// Qwen2-VL image preprocessing (see qwen2_vl_image.h), following transformers'
// Qwen2VLImageProcessorPil: smart_resize in Python's float64 arithmetic, the Pillow-exact resize
// and rescale/normalize of image.h, then patchify into the flat [patches, C * T * p * p] layout.
#include "mmpost/data/qwen2_vl_image.h"

#include <cmath>
#include <fstream>
#include <set>

#include "mmpost/config/schema.h"
#include "mmpost/core/check.h"
#include "mmpost/io/jsonl.h"
#include "mmpost/data/image.h"

namespace mmpost::data {
namespace {

/// Python's round(x) for a finite double: nearest integer, ties to even (independent of the
/// floating-point environment's rounding mode).
int64_t round_half_even(double x) {
  const double fl = std::floor(x);
  const double diff = x - fl;  // exact: fl and x are within 1 of each other
  if (diff > 0.5) return static_cast<int64_t>(fl) + 1;
  if (diff < 0.5) return static_cast<int64_t>(fl);
  const auto f = static_cast<int64_t>(fl);
  return f % 2 == 0 ? f : f + 1;
}

void check_config(const Qwen2VLImageConfig& cfg) {
  MMPOST_CHECK_USAGE(cfg.patch_size > 0 && cfg.merge_size > 0 && cfg.temporal_patch_size > 0,
                     "Qwen2-VL image processor: patch_size, merge_size and temporal_patch_size "
                     "must be positive (got ", cfg.patch_size, ", ", cfg.merge_size, ", ",
                     cfg.temporal_patch_size, ")");
  MMPOST_CHECK_USAGE(cfg.min_pixels > 0 && cfg.max_pixels > 0,
                     "Qwen2-VL image processor: min_pixels and max_pixels (size.shortest_edge and "
                     "size.longest_edge) must be positive (got ", cfg.min_pixels, ", ",
                     cfg.max_pixels, ")");
  MMPOST_CHECK_USAGE(cfg.image_mean.size() == 3 && cfg.image_std.size() == 3,
                     "Qwen2-VL image processor: image_mean and image_std need 3 values");
}

/// The (height, width) the image has when it is patchified.
std::pair<int64_t, int64_t> target_size(int64_t height, int64_t width,
                                        const Qwen2VLImageConfig& cfg) {
  const int64_t factor = cfg.patch_size * cfg.merge_size;
  if (cfg.do_resize) return smart_resize(height, width, factor, cfg.min_pixels, cfg.max_pixels);
  // transformers' reshape to (C, gh/m, m, p, gw/m, m, p) needs whole merge windows.
  MMPOST_CHECK_DATA(height % factor == 0 && width % factor == 0, "image ", width, "x", height,
                    " (width x height): with do_resize off both sides must be multiples of "
                    "patch_size * merge_size = ", factor);
  return {height, width};
}

}  // namespace

std::pair<int64_t, int64_t> smart_resize(int64_t height, int64_t width, int64_t factor,
                                         int64_t min_pixels, int64_t max_pixels) {
  MMPOST_CHECK_DATA(height > 0 && width > 0, "image ", width, "x", height,
                    " (width x height): both sides must be positive");
  TORCH_CHECK(factor > 0, "smart_resize: factor must be positive");
  const auto h = static_cast<double>(height), w = static_cast<double>(width);
  const double ratio = std::max(h, w) / std::min(h, w);
  MMPOST_CHECK_DATA(ratio <= 200.0, "image ", width, "x", height,
                    " (width x height): absolute aspect ratio must be at most 200, got ", ratio,
                    " (Qwen2-VL's smart_resize refuses it)");
  const auto f = static_cast<double>(factor);
  const auto area = static_cast<double>(height * width);  // exact below 2^53: one rounding, as int / int
  int64_t h_bar = round_half_even(h / f) * factor;
  int64_t w_bar = round_half_even(w / f) * factor;
  if (h_bar * w_bar > max_pixels) {
    const double beta = std::sqrt(area / static_cast<double>(max_pixels));
    h_bar = std::max(factor, static_cast<int64_t>(std::floor(h / beta / f)) * factor);
    w_bar = std::max(factor, static_cast<int64_t>(std::floor(w / beta / f)) * factor);
  } else if (h_bar * w_bar < min_pixels) {
    const double beta = std::sqrt(static_cast<double>(min_pixels) / area);
    h_bar = static_cast<int64_t>(std::ceil(h * beta / f)) * factor;
    w_bar = static_cast<int64_t>(std::ceil(w * beta / f)) * factor;
  }
  return {h_bar, w_bar};
}

int64_t qwen2_vl_image_tokens(int64_t height, int64_t width, const Qwen2VLImageConfig& cfg) {
  check_config(cfg);
  const auto [h, w] = target_size(height, width, cfg);
  return (h / cfg.patch_size) * (w / cfg.patch_size) / (cfg.merge_size * cfg.merge_size);
}

Qwen2VLImage preprocess_qwen2_vl_image(const cv::Mat& rgb, const Qwen2VLImageConfig& cfg) {
  TORCH_CHECK(rgb.type() == CV_8UC3, "preprocess_qwen2_vl_image expects 8-bit RGB");
  check_config(cfg);
  const auto [height, width] = target_size(rgb.rows, rgb.cols, cfg);
  cv::Mat img = cfg.do_resize ? resize_image(rgb, static_cast<int>(width), static_cast<int>(height),
                                             cfg.interpolation)
                              : rgb;
  if (!img.isContinuous()) img = img.clone();

  // Rescale + normalize with image.h's arithmetic (HF's PIL backend); "off" is factor 1 or
  // mean 0 / std 1, both exact in float32.
  ImageProcessorConfig pc;
  pc.rescale_factor = cfg.do_rescale ? cfg.rescale_factor : 1.0;
  pc.image_mean = cfg.do_normalize ? cfg.image_mean : std::vector<double>{0, 0, 0};
  pc.image_std = cfg.do_normalize ? cfg.image_std : std::vector<double>{1, 1, 1};
  auto x = to_pixel_values(img, pc);  // [C, H, W] float32

  // Patchify (Qwen2VLImageProcessorPil.patchify): whole merge windows are contiguous so the
  // vision tower's patch merger sees its m x m neighbours in a row.
  const int64_t p = cfg.patch_size, m = cfg.merge_size, t = cfg.temporal_patch_size;
  const int64_t gh = height / p, gw = width / p, c = x.size(0);
  auto patches = x.view({c, gh / m, m, p, gw / m, m, p})
                     .permute({1, 4, 2, 5, 0, 3, 6})  // [gh/m, gw/m, m, m, C, p, p]
                     .unsqueeze(5)
                     .expand({gh / m, gw / m, m, m, c, t, p, p})  // the still image T times
                     .reshape({gh * gw, c * t * p * p});          // [P, C*T*p*p]
  Qwen2VLImage out;
  out.pixel_values = patches.contiguous();
  out.grid_thw = {1, gh, gw};
  out.n_image_tokens = gh * gw / (m * m);
  return out;
}

std::pair<torch::Tensor, torch::Tensor> preprocess_qwen2_vl_images(
    const std::vector<cv::Mat>& rgbs, const Qwen2VLImageConfig& cfg) {
  check_config(cfg);
  std::vector<torch::Tensor> pixels;
  std::vector<int64_t> grids;
  for (const auto& rgb : rgbs) {
    auto one = preprocess_qwen2_vl_image(rgb, cfg);
    pixels.push_back(one.pixel_values);
    grids.insert(grids.end(), one.grid_thw.begin(), one.grid_thw.end());
  }
  const int64_t dim = 3 * cfg.temporal_patch_size * cfg.patch_size * cfg.patch_size;
  auto pixel_values = pixels.empty() ? torch::zeros({0, dim}, torch::kFloat32)
                                     : torch::cat(pixels, /*dim=*/0);  // [sum P, D]
  auto grid_thw = torch::tensor(grids, torch::kInt64).view({-1, 3});   // [N, 3]
  return {pixel_values, grid_thw};
}

// ---- preprocessor_config.json ------------------------------------------------------------------

namespace {
// Keys Qwen2VLImageProcessor reads, and keys saved alongside them that do not change pixel_values
// (bookkeeping, output format; default_to_square is unused by its smart_resize).
const std::set<std::string> kQwenKeys = {
    "do_resize", "size", "min_pixels", "max_pixels", "patch_size", "temporal_patch_size",
    "merge_size", "resample", "do_rescale", "rescale_factor", "do_normalize", "image_mean",
    "image_std", "do_convert_rgb", "image_processor_type"};
const std::set<std::string> kQwenInertKeys = {
    "processor_class", "feature_extractor_type", "_processor_class", "input_data_format",
    "data_format", "return_tensors", "device", "disable_grouping", "transformers_version",
    "default_to_square"};
const std::set<std::string> kQwenTypes = {"Qwen2VLImageProcessor", "Qwen2VLImageProcessorFast",
                                          "Qwen2VLImageProcessorPil"};
// PIL.Image.Resampling values, in order.
const char* const kPilNames[] = {"pil_nearest", "pil_lanczos", "pil_bilinear",
                                 "pil_bicubic", "pil_box",     "pil_hamming"};
}  // namespace

Qwen2VLImageConfig read_qwen2_vl_preprocessor_config(const std::string& path) {
  const nlohmann::json j = io::read_json_object_file(path);
  auto where = [&](const std::string& key) { return path + ": " + key; };
  for (const auto& [key, value] : j.items()) {
    if (kQwenKeys.count(key) || kQwenInertKeys.count(key)) continue;
    if (value.is_null() || (value.is_boolean() && !value.get<bool>())) continue;  // unset / off
    const std::string near =
        config::closest_key(key, std::vector<std::string>(kQwenKeys.begin(), kQwenKeys.end()));
    throw Error(ErrorKind::kUsage,
                where(key) + ": not a Qwen2VLImageProcessor setting mmpost reproduces",
                near.empty() ? "remove it if the model was trained without it"
                             : "did you mean \"" + near + "\"?");
  }
  // A present, non-null key read as T, or `fallback`; a wrong type names the key.
  auto get = [&](const std::string& key, auto fallback) {
    using T = decltype(fallback);
    if (!j.contains(key) || j[key].is_null()) return fallback;
    try {
      return j[key].get<T>();
    } catch (const nlohmann::json::exception& e) {
      throw Error(ErrorKind::kUsage, where(key) + ": " + e.what());
    }
  };
  const std::string type = get("image_processor_type", std::string());
  MMPOST_CHECK_USAGE(type.empty() || kQwenTypes.count(type), where("image_processor_type"), ": ",
                     type, " is not Qwen2VLImageProcessor (or its Fast / Pil variants)");

  Qwen2VLImageConfig cfg;  // the class defaults
  // size: {shortest_edge, longest_edge}; a file's size replaces the default as a whole, then the
  // legacy top-level min_pixels / max_pixels override it (Qwen2VLImageProcessorPil.__init__).
  int64_t lo = cfg.min_pixels, hi = cfg.max_pixels;
  if (j.contains("size") && !j["size"].is_null()) {
    const auto& size = j["size"];
    MMPOST_CHECK_USAGE(size.is_object(), where("size"),
                       ": expected {\"shortest_edge\": MIN_PIXELS, \"longest_edge\": MAX_PIXELS}");
    lo = hi = 0;
    for (const auto& [k, v] : size.items()) {
      // size.min_pixels / max_pixels (transformers 4.4x) are dropped or unused by transformers 5.
      if (v.is_null() || k == "min_pixels" || k == "max_pixels") continue;
      MMPOST_CHECK_USAGE(k == "shortest_edge" || k == "longest_edge", where("size." + k),
                         ": not read by Qwen2VLImageProcessor (it takes shortest_edge = "
                         "min_pixels and longest_edge = max_pixels)");
      MMPOST_CHECK_USAGE(v.is_number_integer(), where("size." + k), ": expected an integer");
      (k == "shortest_edge" ? lo : hi) = v.get<int64_t>();
    }
  }
  lo = get("min_pixels", lo);
  hi = get("max_pixels", hi);
  check(lo != 0 && hi != 0, ErrorKind::kUsage,
        where("size") + ": needs shortest_edge and longest_edge (transformers refuses the first "
        "image otherwise)",
        "set size {\"shortest_edge\": MIN_PIXELS, \"longest_edge\": MAX_PIXELS}, or top-level "
        "min_pixels and max_pixels");
  MMPOST_CHECK_USAGE(lo > 0 && hi > 0, where("size"), ": min_pixels ", lo, " and max_pixels ",
                     hi, " must be positive");
  cfg.min_pixels = lo;
  cfg.max_pixels = hi;

  cfg.patch_size = get("patch_size", cfg.patch_size);
  cfg.temporal_patch_size = get("temporal_patch_size", cfg.temporal_patch_size);
  cfg.merge_size = get("merge_size", cfg.merge_size);
  for (const char* key : {"patch_size", "temporal_patch_size", "merge_size"}) {
    MMPOST_CHECK_USAGE(get(key, int64_t{1}) > 0, where(key), ": must be positive");
  }
  const int resample = get("resample", 3);
  MMPOST_CHECK_USAGE(resample >= 0 && resample <= 5, where("resample"), ": ", resample,
                     " is not a PIL filter (0-5)");
  cfg.interpolation = kPilNames[resample];
  cfg.do_resize = get("do_resize", true);
  cfg.do_rescale = get("do_rescale", true);
  cfg.rescale_factor = get("rescale_factor", cfg.rescale_factor);
  cfg.do_normalize = get("do_normalize", true);
  cfg.image_mean = get("image_mean", cfg.image_mean);
  cfg.image_std = get("image_std", cfg.image_std);
  get("do_convert_rgb", true);  // type check only: images reach here as RGB (load_image_rgb)
  MMPOST_CHECK_USAGE(cfg.image_mean.size() == 3 && cfg.image_std.size() == 3, path,
                     ": image_mean and image_std need 3 values");
  return cfg;
}

nlohmann::json qwen2_vl_preprocessor_config_json(const Qwen2VLImageConfig& cfg) {
  const std::string& in = cfg.interpolation;
  const int resample = in == "nearest" || in == "pil_nearest"    ? 0
                       : in == "pil_lanczos"                      ? 1
                       : in == "bilinear" || in == "pil_bilinear" ? 2
                       : in == "area" || in == "pil_box"          ? 4
                       : in == "pil_hamming"                      ? 5
                                                                  : 3;
  // The keys and values Qwen2VLImageProcessorPil.save_pretrained writes (transformers 5).
  return {
      {"do_convert_rgb", true},
      {"do_normalize", cfg.do_normalize},
      {"do_rescale", cfg.do_rescale},
      {"do_resize", cfg.do_resize},
      {"image_mean", cfg.image_mean},
      {"image_processor_type", "Qwen2VLImageProcessor"},
      {"image_std", cfg.image_std},
      {"merge_size", cfg.merge_size},
      {"patch_size", cfg.patch_size},
      {"resample", resample},
      {"rescale_factor", cfg.rescale_factor},
      {"size", {{"longest_edge", cfg.max_pixels}, {"shortest_edge", cfg.min_pixels}}},
      {"temporal_patch_size", cfg.temporal_patch_size},
  };
}

}  // namespace mmpost::data
