// Qwen2-VL / Qwen2.5-VL image preprocessing: smart_resize to a multiple of patch_size *
// merge_size within a pixel budget, Pillow-exact resize, rescale + normalize, then the flat patch
// layout the Qwen2-VL vision tower takes (dynamic resolution: each image yields its own number of
// patches). Bit-exact with transformers' Qwen2VLImageProcessorPil (Qwen2.5-VL uses that class).
#pragma once

#include <nlohmann/json.hpp>
#include <opencv2/core.hpp>
#include <torch/torch.h>

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace mmpost::data {

/// Qwen2VLImageProcessor's settings; the defaults are the class defaults (transformers 5).
struct Qwen2VLImageConfig {
  /// Pixel budget of the resized image (HF size.shortest_edge / size.longest_edge, formerly
  /// min_pixels / max_pixels). Not load_image_rgb's decode limit.
  int64_t min_pixels = 56 * 56;
  int64_t max_pixels = 28 * 28 * 1280;
  int64_t patch_size = 14;           // vision tower patch side, pixels
  int64_t temporal_patch_size = 2;   // frames per patch; a still image is repeated this often
  int64_t merge_size = 2;            // merge_size x merge_size patches -> one LLM token
  /// Pillow-exact pil_* (HF "resample") or an OpenCV mode, as ImageProcessorConfig.
  std::string interpolation = "pil_bicubic";
  bool do_resize = true;
  bool do_rescale = true;
  bool do_normalize = true;
  double rescale_factor = 1.0 / 255.0;
  std::vector<double> image_mean = {0.48145466, 0.4578275, 0.40821073};  // OPENAI_CLIP_MEAN
  std::vector<double> image_std = {0.26862954, 0.26130258, 0.27577711};  // OPENAI_CLIP_STD
};

/// One preprocessed image.
struct Qwen2VLImage {
  torch::Tensor pixel_values;          // [grid_h * grid_w, 3 * T * p * p] float32 (CPU)
  std::array<int64_t, 3> grid_thw{};   // {1, grid_h, grid_w}, in patches
  int64_t n_image_tokens = 0;          // grid_h * grid_w / merge_size^2 LLM tokens
};

/// The (height, width) transformers' smart_resize picks for a height x width image: both
/// multiples of `factor`, height * width within [min_pixels, max_pixels], aspect ratio kept as
/// closely as possible. Python float64 arithmetic reproduced: round half to even (70 / 28 = 2.5
/// -> 2), the max_pixels branch floors height / beta / factor (at least `factor`), the min_pixels
/// branch ceils height * beta / factor. Throws Error(kData) naming the size when the aspect ratio
/// max / min is over 200 or a side is not positive.
/// Source: transformers.models.qwen2_vl.image_processing_pil_qwen2_vl.smart_resize.
std::pair<int64_t, int64_t> smart_resize(int64_t height, int64_t width, int64_t factor,
                                         int64_t min_pixels, int64_t max_pixels);

/// LLM tokens one height x width image expands to: grid_h * grid_w / merge_size^2 after
/// smart_resize (Qwen2VLImageProcessorPil.get_number_of_image_patches / merge_size^2). Throws as
/// smart_resize, or Error(kData) if do_resize is off and a side is not a multiple of
/// patch_size * merge_size.
int64_t qwen2_vl_image_tokens(int64_t height, int64_t width, const Qwen2VLImageConfig& cfg);

/// Preprocesses one 8-bit RGB HWC image as Qwen2VLImageProcessorPil._preprocess: smart_resize with
/// factor patch_size * merge_size + resize_image, rescale (float32(float64(v) * rescale_factor)),
/// normalize ((x - mean) / std in float32), then patchify: [C, H, W] viewed as
/// (C, gh/m, m, p, gw/m, m, p), permuted (1, 4, 2, 5, 0, 3, 6), each patch repeated T times on a
/// temporal axis after C, flattened to [gh * gw, C * T * p * p] (p patch_size, m merge_size,
/// T temporal_patch_size). Throws Error(kData) for an aspect ratio over 200, or with do_resize off
/// for a side that is not a multiple of p * m; Error(kUsage) for an invalid config.
Qwen2VLImage preprocess_qwen2_vl_image(const cv::Mat& rgb, const Qwen2VLImageConfig& cfg);

/// Several images as one processor call: (pixel_values [sum of patches, 3 * T * p * p] float32,
/// concatenated in order; image_grid_thw [N, 3] int64). N = 0 gives [0, D] and [0, 3].
std::pair<torch::Tensor, torch::Tensor> preprocess_qwen2_vl_images(
    const std::vector<cv::Mat>& rgbs, const Qwen2VLImageConfig& cfg);

/// Reads a preprocessor_config.json of Qwen2VLImageProcessor (also its Fast / Pil names) as
/// transformers 5's __init__ does: size {shortest_edge, longest_edge} = {min_pixels,
/// max_pixels} (the class default when absent), overridden by legacy top-level min_pixels /
/// max_pixels (the Qwen2-VL / Qwen2.5-VL hub layout); patch_size, temporal_patch_size,
/// merge_size, resample (PIL enum: 0 pil_nearest, 1 pil_lanczos, 2 pil_bilinear, 3 pil_bicubic,
/// 4 pil_box, 5 pil_hamming), do_resize, do_rescale, rescale_factor, do_normalize, image_mean,
/// image_std, do_convert_rgb; absent fields take the class defaults. Throws Error(kUsage) naming
/// the file and the key for any other key (bookkeeping keys such as processor_class aside), a
/// different image_processor_type, a size without both shortest_edge and longest_edge (which
/// transformers refuses at the first call), a wrong type or a non-positive size.
Qwen2VLImageConfig read_qwen2_vl_preprocessor_config(const std::string& path);

/// The preprocessor_config.json object transformers' Qwen2VLImageProcessorPil.save_pretrained
/// writes for `cfg` (image_processor_type "Qwen2VLImageProcessor", size {shortest_edge,
/// longest_edge}); an OpenCV interpolation is saved as its nearest PIL filter.
nlohmann::json qwen2_vl_preprocessor_config_json(const Qwen2VLImageConfig& cfg);

}  // namespace mmpost::data
