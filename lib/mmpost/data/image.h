// Image preprocessing stage: decode (OpenCV) -> RGB -> resize (shortest edge + center crop, or pad
// to square) -> rescale -> normalize, the steps of transformers' CLIPImageProcessor (PIL backend).
// The "pil_*" interpolations reimplement Pillow's ImagingResample bit for bit (antialiased,
// fixed point), so pixel_values match HF's; the OpenCV modes stay for recipes that ask for them.
#pragma once

#include <nlohmann/json.hpp>
#include <opencv2/core.hpp>
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

namespace mmpost::data {

/// Default pixel budget: Pillow's DecompressionBombError threshold (2 x Image.MAX_IMAGE_PIXELS).
inline constexpr int64_t kDefaultMaxPixels = 2 * 89478485;

/// How images become `pixel_values`. `image_size` comes from the model's vision_config.
struct ImageProcessorConfig {
  int64_t image_size = 224;
  std::string resize_mode = "shortest_edge_center_crop";  // or "pad_to_square"
  /// OpenCV: bicubic | bilinear | area | nearest. Pillow-exact: pil_bicubic | pil_bilinear |
  /// pil_lanczos | pil_box | pil_hamming (what an HF preprocessor_config.json "resample" selects).
  std::string interpolation = "bicubic";
  std::vector<double> image_mean = {0.48145466, 0.4578275, 0.40821073};
  std::vector<double> image_std = {0.26862954, 0.26130258, 0.27577711};
  double rescale_factor = 1.0 / 255.0;  // HF "rescale_factor"
  /// data.image.max_pixels: the largest width x height decoded (0: no limit); not an HF field.
  int64_t max_pixels = kDefaultMaxPixels;
};

/// What the header of a JPEG or PNG file says (format "" and width -1 for other formats).
struct ImageFileInfo {
  std::string format;          // "jpeg" | "png" | ""
  int64_t width = -1, height = -1;
  int bit_depth = 8;           // bits per sample
  int png_color_type = -1;     // PNG IHDR colour type (0 gray, 2 RGB, 3 palette, 4 gray+alpha, 6 RGBA)
};

/// Checks the structure of a JPEG (marker segments from SOI to EOI; entropy-coded data scanned to
/// its next marker) or PNG (chunks from IHDR to IEND) held in `bytes`, and returns its header.
/// Other formats are not checked (ImageFileInfo{}). Throws Error(kData) "PATH: truncated JPEG
/// (... at byte N ...)" / "PATH: truncated PNG (...)" / "PATH: corrupt ...".
ImageFileInfo inspect_image_file(const std::vector<uint8_t>& bytes, const std::string& path);

/// Decodes an image file to 8-bit RGB HWC the way Pillow's Image.convert("RGB") after
/// ImageOps.exif_transpose sees it (transformers.image_utils.load_image): EXIF orientation
/// applied, grayscale replicated, alpha dropped (no compositing), palette expanded, 16-bit colour
/// reduced to its high byte, 16-bit grayscale PNG clipped to 255 (Pillow's I;16 -> L rule; its
/// orientation tag is not read). JPEG and PNG are checked for truncation first (see
/// inspect_image_file) and their width x height against `max_pixels` (0: no limit) from the header,
/// before decoding; other formats after decoding. Throws Error(kData) naming the path:
/// not found, empty, truncated, over the pixel budget (with the dimensions), cannot decode.
cv::Mat load_image_rgb(const std::string& path, int64_t max_pixels = kDefaultMaxPixels);

/// Resizes an 8-bit image (any channel count, HWC) to width x height with `interpolation` (see
/// ImageProcessorConfig). The pil_* modes follow Pillow 13's Image.resize (src/libImaging/
/// Resample.c: separable horizontal and vertical passes, vertical first only when the height
/// shrinks by over twice as many pixels as the width; filter support widened by the scale when
/// shrinking; per-pixel normalized weights in 22-bit fixed point; uint8 rounding and clipping
/// after each pass). Same size returns a copy. Throws Error(kUsage) for an unknown interpolation.
cv::Mat resize_image(const cv::Mat& img, int width, int height, const std::string& interpolation);

/// Resizes/crops/pads an 8-bit RGB image to image_size x image_size (uint8 RGB, HWC).
/// shortest_edge_center_crop: short side -> image_size (long side int(size*long/short), as
/// transformers' get_resize_output_image_size with default_to_square=False), then a center crop
/// with top = (h - size) / 2, left = (w - size) / 2 (floor, as image_transforms.center_crop).
/// pad_to_square: pad the short side symmetrically with the mean color (LLaVA's expand2square),
/// then resize.
cv::Mat resize_for_model(const cv::Mat& rgb, const ImageProcessorConfig& cfg);

/// Rescales and normalizes an 8-bit RGB HWC image: returns [3, H, W] float32 (CPU). Same
/// arithmetic as HF's PIL backend: float32(float64(v) * rescale_factor), then (x - mean) / std
/// in float32.
torch::Tensor to_pixel_values(const cv::Mat& rgb, const ImageProcessorConfig& cfg);

/// Training-time augmentation: translates an RGB image by (dx, dy) drawn uniformly from
/// [-max_shift, max_shift] pixels with the generator seeded by `seed`, filling uncovered pixels
/// with the mean color; the size is unchanged. max_shift = 0 returns the input.
cv::Mat random_shift(const cv::Mat& rgb, int64_t max_shift, uint64_t seed,
                     const ImageProcessorConfig& cfg);

/// load_image_rgb + resize_for_model + to_pixel_values: [3, image_size, image_size] float32.
torch::Tensor load_pixel_values(const std::string& path, const ImageProcessorConfig& cfg);

}  // namespace mmpost::data

namespace mmpost::data {
/// Reads preprocessor_config.json (HF CLIPImageProcessor fields: crop_size / size.shortest_edge,
/// image_mean, image_std, rescale_factor, resample as PIL's enum (0 nearest, 1 pil_lanczos,
/// 2 pil_bilinear, 3 pil_bicubic, 4 pil_box, 5 pil_hamming), do_* switches) plus mmpost's
/// "mmpost_resize_mode" and "mmpost_interpolation" (which wins over resample). Also reads a
/// transformers 5 processor_config.json (fields under "image_processor"). Missing fields keep
/// `defaults`. Throws Error(kUsage) naming the file.
ImageProcessorConfig read_preprocessor_config(const std::string& path,
                                              const ImageProcessorConfig& defaults);
/// The preprocessor_config.json object for `cfg` (CLIPImageProcessor layout).
nlohmann::json preprocessor_config_json(const ImageProcessorConfig& cfg);
}  // namespace mmpost::data
