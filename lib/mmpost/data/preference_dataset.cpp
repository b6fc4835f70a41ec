// Preference record parsing, truncation, collation and mDPO image corruption
// (see preference_dataset.h).
#include "mmpost/data/preference_dataset.h"

#include <algorithm>
#include <random>
#include <stdexcept>

#include "mmpost/core/check.h"

namespace mmpost::data {
namespace {

bool is_blank(const std::string& s) {
  return std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isspace(c) != 0; });
}

/// "chosen"/"rejected": a non-empty string, or assistant message(s).
std::vector<Message> parse_completion(const nlohmann::json& record, const std::string& key,
                                      const std::string& where) {
  MMPOST_CHECK_DATA(record.contains(key) && !record[key].is_null(), where, ": missing \"", key,
                    "\" (preference records need prompt, chosen and rejected)");
  const auto& v = record[key];
  std::vector<Message> msgs;
  if (v.is_string()) {
    msgs.push_back({"assistant", v.get<std::string>()});
  } else {
    MMPOST_CHECK_DATA(v.is_array(), where, ": ", key,
                      ": expected a string or a list of assistant messages");
    msgs = parse_messages(v, where, key);
  }
  for (size_t i = 0; i < msgs.size(); ++i) {
    MMPOST_CHECK_DATA(msgs[i].role == "assistant", where, ": ", key, "[", i, "].role: \"",
                      msgs[i].role, "\" (completions hold assistant messages only)");
    MMPOST_CHECK_DATA(!is_blank(msgs[i].content), where, ": ", key, "[", i,
                      "].content: empty response");
    MMPOST_CHECK_DATA(count_image_placeholders(msgs[i].content) == 0, where, ": ", key,
                      ": <image> placeholders in a completion are not supported");
  }
  return msgs;
}

std::vector<Message> parse_prompt(const nlohmann::json& record, const std::string& where) {
  MMPOST_CHECK_DATA(record.contains("prompt") && !record["prompt"].is_null(), where,
                    ": missing \"prompt\"");
  const auto& v = record["prompt"];
  std::vector<Message> msgs;
  if (v.is_string()) {
    msgs.push_back({"user", v.get<std::string>()});
  } else {
    msgs = parse_messages(v, where, "prompt");
  }
  MMPOST_CHECK_DATA(msgs.back().role != "assistant", where,
                    ": prompt: the last prompt message must not be an assistant turn");
  return msgs;
}

/// Completion ids/labels: encode(prompt + completion) minus the prompt prefix.
void encode_completion(const std::vector<Message>& prompt, const std::vector<Message>& completion,
                       const std::vector<int64_t>& prompt_ids, const TemplateOptions& popts,
                       const SampleContext& ctx, const std::string& where,
                       std::vector<int64_t>& ids, std::vector<int64_t>& labels) {
  std::vector<Message> conv = prompt;
  conv.insert(conv.end(), completion.begin(), completion.end());
  TemplateOptions opts = popts;
  opts.add_generation_prompt = false;
  auto enc = encode_conversation(conv, *ctx.tokenizer, opts);
  const size_t n = prompt_ids.size();
  MMPOST_CHECK_DATA(enc.input_ids.size() > n &&
                        std::equal(prompt_ids.begin(), prompt_ids.end(), enc.input_ids.begin()),
                    where, ": the chat template does not render the prompt as a prefix of "
                           "prompt + completion");
  ids.assign(enc.input_ids.begin() + n, enc.input_ids.end());
  labels.assign(enc.labels.begin() + n, enc.labels.end());
}

/// Keeps the first `keep` completion tokens.
void cut_completion(std::vector<int64_t>& ids, std::vector<int64_t>& labels, int64_t keep) {
  if (static_cast<int64_t>(ids.size()) <= keep) return;
  ids.resize(keep);
  labels.resize(keep);
}

bool has_label(const std::vector<int64_t>& labels) {
  return std::any_of(labels.begin(), labels.end(),
                     [](int64_t l) { return l != algo::kIgnoreIndex; });
}

}  // namespace

PreferenceSample make_preference_sample(const nlohmann::json& record, int64_t line,
                                        const SampleContext& ctx, const PreferenceLimits& limits,
                                        const ImageCorruption* corruption, uint64_t sample_seed) {
  const std::string where = ctx.source + ":" + std::to_string(line);
  MMPOST_CHECK_DATA(record.is_object(), where, ": expected a JSON object");
  PreferenceSample s;
  s.line = line;
  if (record.contains("id")) {
    const auto& id = record["id"];
    s.id = id.is_string() ? id.get<std::string>() : id.dump();
  } else {
    s.id = "line-" + std::to_string(line);
  }
  s.prompt = parse_prompt(record, where);
  auto chosen = parse_completion(record, "chosen", where);
  auto rejected = parse_completion(record, "rejected", where);
  s.chosen_text = chosen.back().content;
  s.rejected_text = rejected.back().content;

  auto images = parse_image_paths(record, where);
  int64_t placeholders = 0;
  for (const auto& m : s.prompt) placeholders += count_image_placeholders(m.content);
  MMPOST_CHECK_DATA(placeholders == static_cast<int64_t>(images.size()), where, ": ", placeholders,
                    " <image> placeholder(s) in the prompt but ", images.size(), " image(s)");

  TemplateOptions popts = ctx.template_options;
  QwenSampleImages qwen;
  if (ctx.image.qwen) {  // images first: each one's grid decides its <|image_pad|> count
    MMPOST_CHECK_USAGE(corruption == nullptr,
                       "mdpo: the corrupted-image term does not run Qwen2-VL family models yet "
                       "(their images are flattened patches)");
    qwen = load_qwen2_vl_sample_images(images, ctx, where, ctx.load_images);
    popts.image_token_counts = qwen.token_counts;
  }
  popts.add_generation_prompt = true;
  auto penc = encode_conversation(s.prompt, *ctx.tokenizer, popts);
  s.prompt_ids = std::move(penc.input_ids);
  encode_completion(s.prompt, chosen, s.prompt_ids, popts, ctx, where, s.chosen_ids,
                    s.chosen_labels);
  encode_completion(s.prompt, rejected, s.prompt_ids, popts, ctx, where, s.rejected_ids,
                    s.rejected_labels);

  // ---- truncation: prompt (keep_end, never an image token), then completions ----------------
  const int64_t tp = static_cast<int64_t>(s.prompt_ids.size());
  if (limits.max_prompt_length > 0 && tp > limits.max_prompt_length) {
    const int64_t cut = tp - limits.max_prompt_length;
    bool cuts_image = std::any_of(s.prompt_ids.begin(), s.prompt_ids.begin() + cut, [&](int64_t t) {
      return t == ctx.template_options.image_token_id;
    });
    // Qwen2-VL family: an image's tokens sit between <|vision_start|> and <|vision_end|>; a cut
    // just before the first <|image_pad|> would drop the start marker and leave the run orphaned.
    cuts_image = cuts_image || (ctx.image.qwen.has_value() &&
                                s.prompt_ids[cut] == ctx.template_options.image_token_id);
    MMPOST_CHECK_DATA(!cuts_image, where, ": prompt of ", tp,
                      " tokens exceeds max_prompt_length=", limits.max_prompt_length,
                      " and truncating it would cut image tokens");
    s.prompt_ids.erase(s.prompt_ids.begin(), s.prompt_ids.begin() + cut);
  }
  if (limits.max_completion_length > 0) {
    cut_completion(s.chosen_ids, s.chosen_labels, limits.max_completion_length);
    cut_completion(s.rejected_ids, s.rejected_labels, limits.max_completion_length);
  }
  if (limits.max_length > 0) {
    const int64_t room = limits.max_length - static_cast<int64_t>(s.prompt_ids.size());
    MMPOST_CHECK_DATA(room > 0, where, ": prompt of ", s.prompt_ids.size(),
                      " tokens leaves no room for a completion within max_length=",
                      limits.max_length, "\n  hint: raise data.max_length or set "
                      "dpo.max_prompt_length");
    cut_completion(s.chosen_ids, s.chosen_labels, room);
    cut_completion(s.rejected_ids, s.rejected_labels, room);
  }
  MMPOST_CHECK_DATA(has_label(s.chosen_labels) && has_label(s.rejected_labels), where,
                    ": a completion has no supervised token left after truncation");

  check_image_files(images, ctx, where);
  s.n_images = static_cast<int64_t>(images.size());
  if (ctx.image.qwen) {
    s.pixel_values = qwen.pixel_values;
    s.image_grid_thw = qwen.image_grid_thw;
  } else if (ctx.load_images) {
    s.pixel_values = load_sample_images(images, ctx, where, sample_seed);
    if (corruption != nullptr && s.pixel_values.defined()) {
      std::vector<torch::Tensor> bad;
      for (int64_t i = 0; i < s.pixel_values.size(0); ++i) {
        bad.push_back(corrupt_pixel_values(s.pixel_values[i], *corruption,
                                           sample_seed * 7919 + static_cast<uint64_t>(i) + 1));
      }
      s.corrupted_pixel_values = torch::stack(bad);
    }
  }
  return s;
}

PreferenceBatch PreferenceBatch::to(const torch::Device& device, torch::Dtype pixel_dtype) const {
  PreferenceBatch b = *this;
  b.input_ids = input_ids.to(device);
  b.attention_mask = attention_mask.to(device);
  b.labels = labels.to(device);
  if (pixel_values.defined()) b.pixel_values = pixel_values.to(device, pixel_dtype);
  if (image_grid_thw.defined()) b.image_grid_thw = image_grid_thw.to(device);
  if (corrupted_pixel_values.defined()) {
    b.corrupted_pixel_values = corrupted_pixel_values.to(device, pixel_dtype);
  }
  return b;
}

PreferenceBatch collate_preference(const std::vector<PreferenceSample>& samples, int64_t pad_id) {
  if (samples.empty()) throw std::invalid_argument("collate_preference: no samples");
  const int64_t B = static_cast<int64_t>(samples.size());
  int64_t T = 0;
  for (const auto& s : samples) {
    const int64_t tp = static_cast<int64_t>(s.prompt_ids.size());
    T = std::max({T, tp + static_cast<int64_t>(s.chosen_ids.size()),
                  tp + static_cast<int64_t>(s.rejected_ids.size())});
  }
  auto ids = torch::full({2 * B, T}, pad_id, torch::kInt64);
  auto mask = torch::zeros({2 * B, T}, torch::kInt64);
  auto labels = torch::full({2 * B, T}, algo::kIgnoreIndex, torch::kInt64);
  auto ids_a = ids.accessor<int64_t, 2>();
  auto mask_a = mask.accessor<int64_t, 2>();
  auto lab_a = labels.accessor<int64_t, 2>();
  auto fill = [&](int64_t row, const PreferenceSample& s, const std::vector<int64_t>& c_ids,
                  const std::vector<int64_t>& c_labels) {
    int64_t t = 0;
    for (int64_t id : s.prompt_ids) ids_a[row][t] = id, mask_a[row][t++] = 1;
    for (size_t k = 0; k < c_ids.size(); ++k, ++t) {
      ids_a[row][t] = c_ids[k];
      mask_a[row][t] = 1;
      lab_a[row][t] = c_labels[k];
    }
  };
  PreferenceBatch b;
  std::vector<torch::Tensor> pix, grids, bad;
  for (int64_t i = 0; i < B; ++i) {
    const auto& s = samples[i];
    fill(i, s, s.chosen_ids, s.chosen_labels);
    fill(B + i, s, s.rejected_ids, s.rejected_labels);
    b.ids.push_back(s.id);
    b.lines.push_back(s.line);
    // The decoded images when there are any (samples built by hand may leave n_images at 0).
    b.n_images.push_back(s.image_grid_thw.defined() ? s.image_grid_thw.size(0)
                         : s.pixel_values.defined() ? s.pixel_values.size(0)
                                                    : s.n_images);
    if (s.pixel_values.defined()) pix.push_back(s.pixel_values);
    if (s.image_grid_thw.defined()) grids.push_back(s.image_grid_thw);
    if (s.corrupted_pixel_values.defined()) bad.push_back(s.corrupted_pixel_values);
  }
  b.input_ids = ids;
  b.attention_mask = mask;
  b.labels = labels;
  if (!pix.empty()) b.pixel_values = torch::cat(pix);
  if (!grids.empty()) b.image_grid_thw = torch::cat(grids);
  if (!bad.empty()) b.corrupted_pixel_values = torch::cat(bad);
  b.batch_size = B;
  b.n_tokens = mask.sum().item<int64_t>();
  return b;
}

torch::Tensor corrupt_pixel_values(const torch::Tensor& pixel_values, const ImageCorruption& c,
                                   uint64_t seed) {
  TORCH_CHECK(pixel_values.dim() == 3, "corrupt_pixel_values expects [3, H, W]");
  MMPOST_CHECK_USAGE(c.strength >= 0, "mdpo.corruption_strength: must be >= 0");
  std::mt19937_64 rng(seed);
  const int64_t H = pixel_values.size(1), W = pixel_values.size(2);
  auto uniform = [&](int64_t lo, int64_t hi) {  // integer in [lo, hi]
    return std::uniform_int_distribution<int64_t>(lo, std::max(lo, hi))(rng);
  };
  if (c.mode == "crop" || c.mode == "mask") {
    MMPOST_CHECK_USAGE(c.strength < 1, "mdpo.corruption_strength: must be < 1 for ", c.mode);
    // A window with aspect ratio 1 covering `frac` of the area.
    const double frac = c.mode == "crop" ? 1.0 - c.strength : c.strength;
    const double side = std::sqrt(std::clamp(frac, 0.0, 1.0));
    const int64_t h = std::max<int64_t>(1, static_cast<int64_t>(std::lround(side * H)));
    const int64_t w = std::max<int64_t>(1, static_cast<int64_t>(std::lround(side * W)));
    const int64_t y = uniform(0, H - h), x = uniform(0, W - w);
    if (c.mode == "crop") {
      auto win = pixel_values.narrow(1, y, h).narrow(2, x, w).unsqueeze(0);
      namespace F = torch::nn::functional;
      return F::interpolate(win, F::InterpolateFuncOptions()
                                     .size(std::vector<int64_t>{H, W})
                                     .mode(torch::kBilinear)
                                     .align_corners(false))
          .squeeze(0);
    }
    auto out = pixel_values.clone();
    out.narrow(1, y, h).narrow(2, x, w).zero_();
    return out;
  }
  if (c.mode == "noise") {
    auto gen = torch::make_generator<torch::CPUGeneratorImpl>(seed);
    auto noise = torch::randn(pixel_values.sizes(), gen, torch::kFloat32);
    return pixel_values + c.strength * noise.to(pixel_values.dtype());
  }
  throw Error(ErrorKind::kUsage, "mdpo.corruption: \"" + c.mode + "\" is not valid",
              "valid values: crop, mask, noise");
}

}  // namespace mmpost::data
