// Image file decoding with the checks a training run needs before pixels exist (see image.h,
// load_image_rgb): a structural walk of JPEG and PNG files that finds truncation (libjpeg and
// libpng only warn, then fill the missing rows), the dimensions from the header (so a pixel budget
// is enforced before anything is decoded), and the conversions of Pillow's Image.convert("RGB"),
// which is what transformers' image processors see: EXIF orientation applied (ImageOps.
// exif_transpose, as transformers.image_utils.load_image), alpha dropped without compositing,
// 16-bit grayscale clipped to 255, 16-bit colour reduced to its high byte.
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "mmpost/core/check.h"
#include "mmpost/data/image.h"

namespace mmpost::data {
namespace {

uint32_t be16(const uint8_t* p) { return (uint32_t{p[0]} << 8) | p[1]; }
uint32_t be32(const uint8_t* p) { return (be16(p) << 16) | be16(p + 2); }

/// Walks a JPEG's marker segments from SOI to EOI: segments are skipped by their length (so an
/// EXIF thumbnail's own markers inside APP1 are never mistaken for the main image's), entropy-coded
/// data after each SOS is scanned to the next marker (0xFF00 stuffing and RSTn stay data). Fills
/// width/height from the first SOFn. Throws Error(kData) naming the path and offset when the file
/// ends before EOI.
void walk_jpeg(const std::vector<uint8_t>& b, const std::string& path, ImageFileInfo& info) {
  const size_t n = b.size();
  auto truncated = [&](size_t at, const char* where) {
    return Error(ErrorKind::kData, path + ": truncated JPEG (" + std::to_string(n) +
                                       " bytes, ends " + where + " at byte " + std::to_string(at) +
                                       " before the end-of-image marker)");
  };
  size_t pos = 2;  // after SOI
  while (true) {
    if (pos >= n) throw truncated(pos, "between segments");
    if (b[pos] != 0xFF) {
      throw Error(ErrorKind::kData, path + ": corrupt JPEG (no marker at byte " +
                                        std::to_string(pos) + ")");
    }
    while (pos < n && b[pos] == 0xFF) ++pos;  // fill bytes
    if (pos >= n) throw truncated(pos, "inside a marker");
    const uint8_t m = b[pos++];
    if (m == 0xD9) return;                                      // EOI
    if (m == 0x01 || (m >= 0xD0 && m <= 0xD7)) continue;        // standalone markers
    if (pos + 2 > n) throw truncated(pos, "inside a segment length");
    const size_t len = be16(&b[pos]);
    if (len < 2 || pos + len > n) throw truncated(pos, "inside a segment");
    const bool sof = m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC;
    if (sof && info.width < 0 && len >= 7) {
      info.height = be16(&b[pos + 3]);
      info.width = be16(&b[pos + 5]);
      info.bit_depth = b[pos + 2];
    }
    pos += len;
    if (m == 0xDA) {  // SOS: entropy-coded data up to the next real marker
      while (true) {
        const void* ff = pos < n ? std::memchr(&b[pos], 0xFF, n - pos) : nullptr;
        if (ff == nullptr) throw truncated(n, "inside the image data");
        pos = static_cast<const uint8_t*>(ff) - b.data();
        if (pos + 1 >= n) throw truncated(n, "inside the image data");
        const uint8_t next = b[pos + 1];
        if (next == 0x00 || (next >= 0xD0 && next <= 0xD7)) {
          pos += 2;
        } else if (next == 0xFF) {
          pos += 1;
        } else {
          break;  // a marker: EOI, or the next table / scan of a progressive JPEG
        }
      }
    }
  }
}

/// Walks a PNG's chunks from IHDR to IEND by their lengths; fills width, height, bit depth and
/// colour type from IHDR. Throws Error(kData) when a chunk runs past the end of the file.
void walk_png(const std::vector<uint8_t>& b, const std::string& path, ImageFileInfo& info) {
  const size_t n = b.size();
  size_t pos = 8;
  bool first = true;
  while (true) {
    if (pos + 8 > n) {
      throw Error(ErrorKind::kData, path + ": truncated PNG (" + std::to_string(n) +
                                        " bytes, no IEND chunk)");
    }
    const size_t len = be32(&b[pos]);
    const std::string type(reinterpret_cast<const char*>(&b[pos + 4]), 4);
    if (pos + 12 + len > n) {
      throw Error(ErrorKind::kData, path + ": truncated PNG (" + std::to_string(n) + " bytes, the " +
                                        type + " chunk at byte " + std::to_string(pos) + " needs " +
                                        std::to_string(12 + len) + ")");
    }
    if (first) {
      MMPOST_CHECK_DATA(type == "IHDR" && len >= 13, path, ": corrupt PNG (first chunk is not IHDR)");
      info.width = be32(&b[pos + 8]);
      info.height = be32(&b[pos + 12]);
      info.bit_depth = b[pos + 16];
      info.png_color_type = b[pos + 17];
      first = false;
    }
    if (type == "IEND") return;
    pos += 12 + len;
  }
}

std::vector<uint8_t> read_file(const std::string& path) {
  MMPOST_CHECK_DATA(std::filesystem::is_regular_file(path), path, ": image file not found");
  std::ifstream in(path, std::ios::binary);
  std::vector<uint8_t> b((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  MMPOST_CHECK_DATA(in.good() || in.eof(), path, ": cannot read the file");
  MMPOST_CHECK_DATA(!b.empty(), path, ": empty image file");
  return b;
}

}  // namespace

ImageFileInfo inspect_image_file(const std::vector<uint8_t>& bytes, const std::string& path) {
  ImageFileInfo info;
  const auto& b = bytes;
  if (b.size() >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF) {
    info.format = "jpeg";
    walk_jpeg(b, path, info);
  } else if (b.size() >= 8 && std::memcmp(b.data(), "\x89PNG\r\n\x1a\n", 8) == 0) {
    info.format = "png";
    walk_png(b, path, info);
  }
  return info;
}

cv::Mat load_image_rgb(const std::string& path, int64_t max_pixels) {
  const auto bytes = read_file(path);
  const ImageFileInfo info = inspect_image_file(bytes, path);
  auto check_budget = [&](int64_t w, int64_t h, const char* when) {
    if (max_pixels > 0 && w * h > max_pixels) {
      throw Error(ErrorKind::kData,
                  path + ": image is " + std::to_string(w) + "x" + std::to_string(h) + " = " +
                      std::to_string(w * h) + " pixels, over data.image.max_pixels = " +
                      std::to_string(max_pixels) + " (" + when + ")",
                  "raise data.image.max_pixels (0 = no limit) if this image is meant to be used");
    }
  };
  if (info.width >= 0) check_budget(info.width, info.height, "read from the header, not decoded");
  cv::Mat img;
  const cv::Mat buf(1, static_cast<int>(bytes.size()), CV_8U, const_cast<uint8_t*>(bytes.data()));
  // 16-bit grayscale PNG: Pillow opens it as mode I;16 and convert("RGB") clips to 255 (OpenCV's
  // IMREAD_COLOR would keep the high byte, turning values below 256 black). Everything else:
  // IMREAD_COLOR = EXIF orientation applied, alpha dropped, 16-bit colour to its high byte, as
  // Pillow.
  const bool gray16 = info.format == "png" && info.bit_depth == 16 && info.png_color_type == 0;
  try {
    img = cv::imdecode(buf, gray16 ? cv::IMREAD_UNCHANGED : cv::IMREAD_COLOR);
  } catch (const cv::Exception& e) {
    throw Error(ErrorKind::kData, path + ": cannot decode image: " + e.what());
  }
  MMPOST_CHECK_DATA(!img.empty() && img.cols > 0 && img.rows > 0, path,
                    ": cannot decode image (corrupt or unsupported format)");
  if (info.width < 0) check_budget(img.cols, img.rows, "after decoding: no header check for this format");
  cv::Mat rgb;
  if (gray16) {
    cv::Mat g8;
    img.convertTo(g8, CV_8U);  // saturating: min(v, 255)
    cv::cvtColor(g8, rgb, cv::COLOR_GRAY2RGB);
  } else {
    cv::cvtColor(img, rgb, cv::COLOR_BGR2RGB);
  }
  return rgb;
}

}  // namespace mmpost::data
