// SFT record parsing and preprocessing (see sft_dataset.h).
#include "mmpost/data/sft_dataset.h"

#include <fstream>
#include <iterator>
#include <tuple>

#include <algorithm>

#include "mmpost/core/check.h"

namespace mmpost::data {
namespace {
int64_t count_placeholders(const std::string& s) {
  int64_t n = 0;
  for (size_t pos = s.find(kImagePlaceholder); pos != std::string::npos;
       pos = s.find(kImagePlaceholder, pos + 1)) {
    ++n;
  }
  return n;
}
}  // namespace

int64_t count_image_placeholders(const std::string& text) { return count_placeholders(text); }

std::vector<std::string> parse_image_paths(const nlohmann::json& record, const std::string& where) {
  std::vector<std::string> images;
  if (!record.contains("images") || record["images"].is_null()) return images;
  const auto& im = record["images"];
  MMPOST_CHECK_DATA(im.is_array(), where, ": images: expected an array of paths");
  for (size_t i = 0; i < im.size(); ++i) {
    MMPOST_CHECK_DATA(im[i].is_string(), where, ": images[", i, "]: expected a path string");
    images.push_back(im[i].get<std::string>());
  }
  return images;
}

torch::Tensor load_sample_images(const std::vector<std::string>& images, const SampleContext& ctx,
                                const std::string& where, uint64_t sample_seed) {
  if (images.empty()) return {};
  std::vector<torch::Tensor> pix;
  for (const auto& rel : images) {
    std::filesystem::path p = rel;
    if (p.is_relative()) p = ctx.base_dir / p;
    try {
      cv::Mat rgb = resize_for_model(load_image_rgb(p.string(), ctx.image.max_pixels), ctx.image);
      if (ctx.random_shift > 0) {
        rgb = random_shift(rgb, ctx.random_shift, sample_seed + pix.size(), ctx.image);
      }
      pix.push_back(to_pixel_values(rgb, ctx.image));
    } catch (const Error& e) {
      throw Error(ErrorKind::kData, where + ": " + e.message(), e.hint());
    }
  }
  return torch::stack(pix);  // [N, 3, H, W]
}

QwenSampleImages load_qwen2_vl_sample_images(const std::vector<std::string>& images,
                                             const SampleContext& ctx, const std::string& where,
                                             bool decode) {
  QwenSampleImages out;
  if (images.empty()) return out;
  const auto& cfg = *ctx.image.qwen;
  std::vector<cv::Mat> rgbs;
  for (const auto& rel : images) {
    std::filesystem::path p = rel;
    if (p.is_relative()) p = ctx.base_dir / p;
    try {
      if (!decode) {
        std::ifstream in(p, std::ios::binary);
        MMPOST_CHECK_DATA(in.good(), p.string(), ": image file not found");
        std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                                   std::istreambuf_iterator<char>());
        const auto info = inspect_image_file(bytes, p.string());
        if (info.width > 0) {
          out.token_counts.push_back(qwen2_vl_image_tokens(info.height, info.width, cfg));
          continue;
        }
      }
      cv::Mat rgb = load_image_rgb(p.string(), ctx.image.max_pixels);
      if (!decode) {
        out.token_counts.push_back(qwen2_vl_image_tokens(rgb.rows, rgb.cols, cfg));
        continue;
      }
      rgbs.push_back(rgb);
    } catch (const Error& e) {
      throw Error(ErrorKind::kData, where + ": " + e.message(), e.hint());
    }
  }
  if (decode) {
    try {
      std::tie(out.pixel_values, out.image_grid_thw) = preprocess_qwen2_vl_images(rgbs, cfg);
    } catch (const Error& e) {
      throw Error(ErrorKind::kData, where + ": " + e.message(), e.hint());
    }
    const int64_t unit = cfg.merge_size * cfg.merge_size;
    auto g = out.image_grid_thw.accessor<int64_t, 2>();
    for (int64_t i = 0; i < g.size(0); ++i) out.token_counts.push_back(g[i][0] * g[i][1] * g[i][2] / unit);
  }
  return out;
}

void check_image_files(const std::vector<std::string>& images, const SampleContext& ctx,
                       const std::string& where) {
  if (ctx.load_images || !ctx.check_image_files) return;
  for (const auto& rel : images) {
    std::filesystem::path p = rel;
    if (p.is_relative()) p = ctx.base_dir / p;
    std::error_code ec;
    MMPOST_CHECK_DATA(std::filesystem::is_regular_file(p, ec), where, ": ", p.string(),
                      ": image file not found");
  }
}

std::vector<Message> parse_messages(const nlohmann::json& messages, const std::string& where,
                                    const std::string& field) {
  MMPOST_CHECK_DATA(messages.is_array() && !messages.empty(), where, ": ", field,
                    ": expected a non-empty array");
  std::vector<Message> out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& m = messages[i];
    std::string path = where + ": " + field + "[" + std::to_string(i) + "]";
    MMPOST_CHECK_DATA(m.is_object(), path, ": expected an object");
    MMPOST_CHECK_DATA(m.contains("role") && m["role"].is_string(), path,
                      ".role: expected a string");
    Message msg{m["role"].get<std::string>(), ""};
    MMPOST_CHECK_DATA(msg.role == "system" || msg.role == "user" || msg.role == "assistant", path,
                      ".role: \"", msg.role, "\" is not one of system, user, assistant");
    MMPOST_CHECK_DATA(m.contains("content"), path, ".content: missing");
    const auto& c = m["content"];
    if (c.is_string()) {
      msg.content = c.get<std::string>();
    } else if (c.is_array()) {
      // HF content list: images first as "<image>\n", then the text parts joined by spaces.
      std::string text;
      for (size_t k = 0; k < c.size(); ++k) {
        MMPOST_CHECK_DATA(c[k].is_object() && c[k].contains("type"), path, ".content[", k,
                          "]: expected {\"type\": ...}");
        std::string type = c[k]["type"].is_string() ? c[k]["type"].get<std::string>() : "";
        if (type == "image") {
          msg.content += std::string(kImagePlaceholder) + "\n";
        } else if (type == "text") {
          MMPOST_CHECK_DATA(c[k].contains("text") && c[k]["text"].is_string(), path,
                            ".content[", k, "].text: expected a string");
          text += (text.empty() ? "" : " ") + c[k]["text"].get<std::string>();
        } else {
          throw Error(ErrorKind::kData,
                      path + ".content[" + std::to_string(k) + "].type: \"" + type +
                          "\" is not one of text, image");
        }
      }
      msg.content += text;
    } else {
      throw Error(ErrorKind::kData, path + ".content: expected a string or a content list");
    }
    out.push_back(std::move(msg));
  }
  return out;
}

bool truncate_sample(std::vector<int64_t>& input_ids, std::vector<int64_t>& labels,
                     int64_t max_length, int64_t image_token_id) {
  if (static_cast<int64_t>(input_ids.size()) <= max_length) return true;
  for (size_t i = max_length; i < input_ids.size(); ++i) {
    if (input_ids[i] == image_token_id) return false;
  }
  bool any_label = std::any_of(labels.begin(), labels.begin() + max_length,
                               [](int64_t l) { return l != algo::kIgnoreIndex; });
  if (!any_label) return false;
  input_ids.resize(max_length);
  labels.resize(max_length);
  return true;
}

SftSample make_sft_sample(const nlohmann::json& record, int64_t line, const SampleContext& ctx,
                          bool prompt_only, uint64_t sample_seed) {
  const std::string where = ctx.source + ":" + std::to_string(line);
  MMPOST_CHECK_DATA(record.is_object(), where, ": expected a JSON object");
  SftSample s;
  s.line = line;
  if (record.contains("id")) {
    const auto& id = record["id"];
    s.id = id.is_string() ? id.get<std::string>() : id.dump();
  } else {
    s.id = "line-" + std::to_string(line);
  }
  if (record.contains("answer") && (record["answer"].is_string() || record["answer"].is_number())) {
    const auto& a = record["answer"];
    s.answer = a.is_string() ? a.get<std::string>() : a.dump();
  }
  MMPOST_CHECK_DATA(record.contains("messages"), where, ": missing \"messages\"");
  s.messages = parse_messages(record["messages"], where);
  bool has_assistant = std::any_of(s.messages.begin(), s.messages.end(),
                                   [](const Message& m) { return m.role == "assistant"; });
  MMPOST_CHECK_DATA(has_assistant, where, ": no assistant turn to learn from");

  std::vector<std::string> images = parse_image_paths(record, where);
  int64_t placeholders = 0;
  for (const auto& m : s.messages) placeholders += count_placeholders(m.content);
  MMPOST_CHECK_DATA(placeholders == static_cast<int64_t>(images.size()), where, ": ", placeholders,
                    " <image> placeholder(s) in messages but ", images.size(), " image(s)");

  std::vector<Message> to_encode = s.messages;
  TemplateOptions opts = ctx.template_options;
  QwenSampleImages qwen;
  if (ctx.image.qwen) {  // images first: each one's grid decides its <|image_pad|> count
    qwen = load_qwen2_vl_sample_images(images, ctx, where, ctx.load_images);
    opts.image_token_counts = qwen.token_counts;
  }
  if (prompt_only) {
    MMPOST_CHECK_DATA(to_encode.back().role == "assistant", where,
                      ": the last message must be the assistant reply to evaluate against");
    s.reference = to_encode.back().content;
    to_encode.pop_back();
    MMPOST_CHECK_DATA(!to_encode.empty(), where, ": no prompt before the assistant reply");
    opts.add_generation_prompt = true;
    int64_t prompt_placeholders = 0;
    for (const auto& m : to_encode) prompt_placeholders += count_placeholders(m.content);
    MMPOST_CHECK_DATA(prompt_placeholders == placeholders, where,
                      ": <image> placeholders in the reply are not supported for evaluation");
  }
  auto enc = encode_conversation(to_encode, *ctx.tokenizer, opts);
  MMPOST_CHECK_DATA(enc.n_images == placeholders, where, ": tokenizer produced ", enc.n_images,
                    " image token(s) for ", placeholders, " placeholder(s)");
  int64_t full_len = static_cast<int64_t>(enc.input_ids.size());
  if (prompt_only) {
    MMPOST_CHECK_DATA(full_len <= ctx.max_length, where, ": prompt of ", full_len,
                      " tokens exceeds max_length=", ctx.max_length);
  } else {
    MMPOST_CHECK_DATA(truncate_sample(enc.input_ids, enc.labels, ctx.max_length,
                                      ctx.template_options.image_token_id),
                      where, ": ", full_len, " tokens exceed data.max_length=", ctx.max_length,
                      " and truncation would cut image tokens or every answer token");
  }
  s.input_ids = std::move(enc.input_ids);
  s.labels = std::move(enc.labels);
  // A prompt supervises nothing: the replies of earlier turns are context, and collate_prompts
  // reads a prompt up to its first supervised token.
  if (prompt_only) std::fill(s.labels.begin(), s.labels.end(), algo::kIgnoreIndex);

  if (ctx.image.qwen) {
    s.pixel_values = qwen.pixel_values;
    s.image_grid_thw = qwen.image_grid_thw;
  } else if (ctx.load_images) {
    s.pixel_values = load_sample_images(images, ctx, where, sample_seed);
  }
  check_image_files(images, ctx, where);
  return s;
}

}  // namespace mmpost::data
