// OpenCV image preprocessing (see image.h).
#include "mmpost/data/image.h"

#include <filesystem>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "mmpost/core/check.h"

namespace mmpost::data {
namespace {
int cv_interpolation(const std::string& name) {
  if (name == "bicubic") return cv::INTER_CUBIC;
  if (name == "bilinear") return cv::INTER_LINEAR;
  if (name == "area") return cv::INTER_AREA;
  if (name == "nearest") return cv::INTER_NEAREST;
  throw Error(ErrorKind::kUsage, "image interpolation \"" + name + "\" is not valid",
              "valid values: bicubic, bilinear, area, nearest");
}
}  // namespace

cv::Mat load_image_rgb(const std::string& path) {
  MMPOST_CHECK_DATA(std::filesystem::is_regular_file(path), path, ": image file not found");
  cv::Mat bgr;
  try {
    bgr = cv::imread(path, cv::IMREAD_COLOR | cv::IMREAD_IGNORE_ORIENTATION);
  } catch (const cv::Exception& e) {
    throw Error(ErrorKind::kData, path + ": cannot decode image: " + e.what());
  }
  MMPOST_CHECK_DATA(!bgr.empty() && bgr.cols > 0 && bgr.rows > 0, path,
                    ": cannot decode image (corrupt or unsupported format)");
  cv::Mat rgb;
  cv::cvtColor(bgr, rgb, cv::COLOR_BGR2RGB);
  return rgb;
}

cv::Mat resize_for_model(const cv::Mat& rgb, const ImageProcessorConfig& cfg) {
  TORCH_CHECK(rgb.type() == CV_8UC3, "resize_for_model expects 8-bit RGB");
  const int size = static_cast<int>(cfg.image_size);
  const int interp = cv_interpolation(cfg.interpolation);
  cv::Mat out;
  if (cfg.resize_mode == "pad_to_square") {
    int side = std::max(rgb.cols, rgb.rows);
    cv::Scalar fill(cfg.image_mean[0] * 255.0, cfg.image_mean[1] * 255.0, cfg.image_mean[2] * 255.0);
    int top = (side - rgb.rows) / 2, left = (side - rgb.cols) / 2;
    cv::Mat square;
    cv::copyMakeBorder(rgb, square, top, side - rgb.rows - top, left, side - rgb.cols - left,
                       cv::BORDER_CONSTANT, fill);
    if (side == size) return square;
    cv::resize(square, out, cv::Size(size, size), 0, 0, interp);
    return out;
  }
  // Shortest edge -> size, keeping the aspect ratio (transformers get_resize_output_image_size).
  int h = rgb.rows, w = rgb.cols;
  int short_side = std::min(h, w), long_side = std::max(h, w);
  int new_long = static_cast<int>(static_cast<int64_t>(size) * long_side / short_side);
  int new_h = h <= w ? size : new_long;
  int new_w = h <= w ? new_long : size;
  cv::Mat resized = rgb;
  if (new_h != h || new_w != w) cv::resize(rgb, resized, cv::Size(new_w, new_h), 0, 0, interp);
  int top = (new_h - size) / 2, left = (new_w - size) / 2;
  return resized(cv::Rect(left, top, size, size)).clone();
}

torch::Tensor to_pixel_values(const cv::Mat& rgb, const ImageProcessorConfig& cfg) {
  TORCH_CHECK(rgb.type() == CV_8UC3 && rgb.isContinuous(), "to_pixel_values expects 8-bit RGB");
  auto hwc = torch::from_blob(rgb.data, {rgb.rows, rgb.cols, 3}, torch::kUInt8);
  auto x = hwc.permute({2, 0, 1}).to(torch::kFloat32).div(255.0);  // [3, H, W]
  auto mean = torch::tensor(std::vector<float>(cfg.image_mean.begin(), cfg.image_mean.end()))
                  .view({3, 1, 1});
  auto std = torch::tensor(std::vector<float>(cfg.image_std.begin(), cfg.image_std.end()))
                 .view({3, 1, 1});
  return ((x - mean) / std).contiguous();
}

torch::Tensor load_pixel_values(const std::string& path, const ImageProcessorConfig& cfg) {
  return to_pixel_values(resize_for_model(load_image_rgb(path), cfg), cfg);
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
      int r = j["resample"].get<int>();
      cfg.interpolation = r == 2 ? "bilinear" : r == 0 ? "nearest" : "bicubic";
    }
    if (j.contains("mmpost_resize_mode")) cfg.resize_mode = j["mmpost_resize_mode"].get<std::string>();
    if (j.contains("mmpost_interpolation")) cfg.interpolation = j["mmpost_interpolation"].get<std::string>();
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
  int resample = cfg.interpolation == "bilinear" ? 2 : cfg.interpolation == "nearest" ? 0 : 3;
  return {
      {"image_processor_type", "CLIPImageProcessor"},
      {"processor_class", "LlavaProcessor"},
      {"do_resize", true},
      {"size", {{"shortest_edge", cfg.image_size}}},
      {"resample", resample},
      {"do_center_crop", true},
      {"crop_size", {{"height", cfg.image_size}, {"width", cfg.image_size}}},
      {"do_rescale", true},
      {"rescale_factor", 1.0 / 255.0},
      {"do_normalize", true},
      {"image_mean", cfg.image_mean},
      {"image_std", cfg.image_std},
      {"do_convert_rgb", true},
      {"mmpost_resize_mode", cfg.resize_mode},
      {"mmpost_interpolation", cfg.interpolation},
  };
}

}  // namespace mmpost::data
