// Image preprocessing stage (OpenCV): decode -> RGB -> resize (shortest edge + center crop, or
// pad to square) -> rescale 1/255 -> normalize. Matches the CLIPImageProcessor steps
// (transformers) up to the resampling kernel: OpenCV's bicubic is not PIL's antialiased bicubic.
#pragma once

#include <nlohmann/json.hpp>
#include <opencv2/core.hpp>
#include <torch/torch.h>

#include <string>
#include <vector>

namespace mmpost::data {

/// How images become `pixel_values`. `image_size` comes from the model's vision_config.
struct ImageProcessorConfig {
  int64_t image_size = 224;
  std::string resize_mode = "shortest_edge_center_crop";  // or "pad_to_square"
  std::string interpolation = "bicubic";                  // bicubic | bilinear | area | nearest
  std::vector<double> image_mean = {0.48145466, 0.4578275, 0.40821073};
  std::vector<double> image_std = {0.26862954, 0.26130258, 0.27577711};
};

/// Decodes an image file to 8-bit RGB (grayscale replicated, alpha dropped, EXIF orientation
/// ignored as PIL does). Throws Error(kData) "PATH: file not found" / "PATH: cannot decode image".
cv::Mat load_image_rgb(const std::string& path);

/// Resizes/crops/pads an 8-bit RGB image to image_size x image_size (uint8 RGB, HWC).
/// shortest_edge_center_crop: short side -> image_size (long side int(size*long/short)), then a
/// center crop (top = (h - size) / 2). pad_to_square: pad the short side symmetrically with the
/// mean color (LLaVA's expand2square), then resize.
cv::Mat resize_for_model(const cv::Mat& rgb, const ImageProcessorConfig& cfg);

/// Rescale 1/255 and normalize an 8-bit RGB HWC image: returns [3, H, W] float32 (CPU).
torch::Tensor to_pixel_values(const cv::Mat& rgb, const ImageProcessorConfig& cfg);

/// load_image_rgb + resize_for_model + to_pixel_values: [3, image_size, image_size] float32.
torch::Tensor load_pixel_values(const std::string& path, const ImageProcessorConfig& cfg);

}  // namespace mmpost::data

namespace mmpost::data {
/// Reads preprocessor_config.json (HF CLIPImageProcessor fields: crop_size / size.shortest_edge,
/// image_mean, image_std, resample (2 bilinear, 3 bicubic), do_* switches) plus mmpost's
/// "mmpost_resize_mode". Missing fields keep `defaults`. Throws Error(kUsage) naming the file.
ImageProcessorConfig read_preprocessor_config(const std::string& path,
                                              const ImageProcessorConfig& defaults);
/// The preprocessor_config.json object for `cfg` (CLIPImageProcessor layout).
nlohmann::json preprocessor_config_json(const ImageProcessorConfig& cfg);
}  // namespace mmpost::data
