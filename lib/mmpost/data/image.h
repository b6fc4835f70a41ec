// Image preprocessing stage: decode (OpenCV) -> RGB -> resize (shortest edge + center crop, or pad
// to square) -> rescale -> normalize, the steps of transformers' CLIPImageProcessor (PIL backend).
// The "pil_*" interpolations reimplement Pillow's ImagingResample bit for bit (antialiased,
// fixed point), so pixel_values match HF's; the OpenCV modes stay for recipes that ask for them.
#pragma once

#include <nlohmann/json.hpp>
#include <opencv2/core.hpp>
#include <torch/torch.h>

#include "mmpost/data/qwen2_vl_image.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mmpost::data {

/// Default pixel budget: Pillow's DecompressionBombError threshold (2 x Image.MAX_IMAGE_PIXELS).
inline constexpr int64_t kDefaultMaxPixels = 2 * 89478485;

/// How images become `pixel_values`, in transformers' order (LlavaImageProcessor /
/// CLIPImageProcessor, PIL backend): [pad to square] -> [resize] -> [center crop] -> rescale ->
/// normalize. The result must be image_size x image_size (the model's vision_config.image_size).
struct ImageProcessorConfig {
  /// Output side = the center crop's height and width (HF crop_size).
  int64_t image_size = 224;
  /// "shortest_edge_center_crop", or "pad_to_square" (LlavaImageProcessor do_pad: pad the short
  /// side with int(mean * 255) per channel before resizing; LLaVA's expand2square).
  std::string resize_mode = "shortest_edge_center_crop";
  bool do_resize = true;
  /// HF size: {"shortest_edge": N} (0: image_size) or, when resize_height > 0, an exact
  /// {"height", "width"} resize that ignores the aspect ratio.
  int64_t resize_shortest_edge = 0;
  int64_t resize_height = 0, resize_width = 0;
  bool do_center_crop = true;
  /// OpenCV: bicubic | bilinear | area | nearest. Pillow-exact: pil_bicubic | pil_bilinear |
  /// pil_lanczos | pil_box | pil_hamming | pil_nearest (what an HF preprocessor_config.json
  /// "resample" selects).
  std::string interpolation = "bicubic";
  std::vector<double> image_mean = {0.48145466, 0.4578275, 0.40821073};
  std::vector<double> image_std = {0.26862954, 0.26130258, 0.27577711};
  double rescale_factor = 1.0 / 255.0;  // HF "rescale_factor"
  /// data.image.max_pixels: the largest width x height decoded (0: no limit); not an HF field.
  int64_t max_pixels = kDefaultMaxPixels;
  /// Qwen2-VL family models: their Qwen2VLImageProcessor settings (dynamic resolution, one
  /// token count per image); when set, the LLaVA fields above except max_pixels are unused.
  std::optional<Qwen2VLImageConfig> qwen;
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

/// Pads, resizes and crops an 8-bit RGB image to image_size x image_size (uint8 RGB, HWC), as
/// transformers' LlavaImageProcessorPil._preprocess up to rescale:
/// pad_to_square: the short side padded with int(mean * 255) per channel, the image at offset
/// (long - short) // 2 (pad_to_square, background_color = tuple(int(x * 255) for x in mean));
/// resize: short side -> shortest_edge (long side int(size * long / short),
/// get_resize_output_image_size with default_to_square=False), or exactly resize_height x
/// resize_width; center crop: top = (h - size) // 2, left = (w - size) // 2, an image smaller than
/// the crop first zero-padded by ceil((size - h) / 2) (image_transforms.center_crop).
/// Throws Error(kData) when the result is not image_size square (do_center_crop off).
cv::Mat resize_for_model(const cv::Mat& rgb, const ImageProcessorConfig& cfg);

/// The pad colour of pad_to_square and random_shift: int(mean[c] * 255) per channel, as
/// transformers' LlavaImageProcessor (truncation, not rounding).
cv::Scalar pad_color(const ImageProcessorConfig& cfg);

/// Checks that `cfg` yields image_size x image_size for every input image and that image_size
/// equals the vision tower's `vision_image_size`; throws Error(kUsage) naming `where` and the
/// HF field (crop_size, size, do_center_crop).
void check_processor_for_model(const ImageProcessorConfig& cfg, int64_t vision_image_size,
                               const std::string& where);

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
/// Reads preprocessor_config.json as transformers' CLIPImageProcessor / LlavaImageProcessor (and
/// their Fast/Pil variants) do: crop_size, size ({shortest_edge} or {height, width}, an int is a
/// shortest edge), do_resize, do_center_crop, do_pad (Llava: pad to square), image_mean,
/// image_std, rescale_factor, do_rescale, do_normalize, resample as PIL's enum (0 pil_nearest,
/// 1 pil_lanczos, 2 pil_bilinear, 3 pil_bicubic, 4 pil_box, 5 pil_hamming), plus mmpost's
/// "mmpost_resize_mode" and "mmpost_interpolation" (which wins over resample). Missing fields take
/// the image processor class's defaults (CLIP's), a file without image_processor_type keeps
/// `defaults`. Also reads a transformers 5 processor_config.json (fields under
/// "image_processor"; its patch_size / num_additional_image_tokens / vision_feature_select_strategy
/// give `info->image_tokens`), or a processor_config.json of transformers 4.4x that holds only
/// those processor fields (`defaults` returned, has_image_settings false). Any other key, an unknown image_processor_type, and
/// settings transformers would apply but mmpost cannot (size.longest_edge, crop_pct, ...) throw
/// Error(kUsage) naming the file and the field.
/// What a processor file said beyond the image settings.
struct ProcessorFileInfo {
  int64_t image_tokens = -1;         // tokens one <image> expands to (-1: not stated)
  bool has_image_settings = false;   // false for a processor-only processor_config.json
};
ImageProcessorConfig read_preprocessor_config(const std::string& path,
                                              const ImageProcessorConfig& defaults,
                                              ProcessorFileInfo* info = nullptr);
/// The preprocessor_config.json object for `cfg` (CLIPImageProcessor layout).
nlohmann::json preprocessor_config_json(const ImageProcessorConfig& cfg);
}  // namespace mmpost::data
