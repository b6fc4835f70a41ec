// mmpost bench-preprocess (hidden): times the SFT data stage alone (JSONL -> decode -> resize ->
// normalize -> chat template + tokenizer -> SftSample) through the same StreamingLoader and
// make_sft_sample that `mmpost sft` uses, without a model. For scripts/bench/run_all.sh.
// Prints one JSON line on stdout: {"images_per_s", "samples_per_s", "n", "n_images", "n_tokens",
// "seconds", ...}.
#include <opencv2/core.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "mmpost/cli_common.h"
#include "mmpost/core/check.h"
#include "mmpost/data/chat_template.h"
#include "mmpost/data/loader.h"
#include "mmpost/data/sft_dataset.h"
#include "mmpost/hub/hf_folder.h"

namespace mmpost::cli {
namespace {
struct BenchArgs {
  std::string data;
  std::string tokenizer = "data/tokenizer/tokenizer.model";
  int64_t image_size = 224;
  int64_t patch_size = 14;          // n_image_tokens = (image_size / patch_size)^2
  int64_t image_token_index = 4;
  std::string interpolation = "bicubic";
  std::vector<double> image_mean = {0.48145466, 0.4578275, 0.40821073};
  std::vector<double> image_std = {0.26862954, 0.26130258, 0.27577711};
  int64_t num_workers = 1;
  int64_t num_threads = 1;          // torch and OpenCV threads (per process)
  int64_t epochs = 3;               // timed passes over the file, after one untimed warm-up pass
  int64_t batch_size = 8;
  int64_t max_length = 4096;
};

struct PassCounts {
  int64_t n = 0, n_images = 0, n_tokens = 0;
};

// One pass over the file.
PassCounts one_pass(const BenchArgs& a, const data::SampleContext& ctx) {
  data::LoaderOptions lo;
  lo.path = a.data;
  lo.batch_size = a.batch_size;
  lo.num_workers = a.num_workers;
  data::StreamingLoader<data::SftSample> loader(
      lo, [&ctx](const nlohmann::json& rec, int64_t line) {
        return data::make_sft_sample(rec, line, ctx);
      });
  PassCounts c;
  while (auto batch = loader.next_batch()) {
    for (const auto& s : *batch) {
      ++c.n;
      c.n_tokens += static_cast<int64_t>(s.input_ids.size());
      if (s.pixel_values.defined()) c.n_images += s.pixel_values.size(0);
    }
  }
  return c;
}

int run_bench(const BenchArgs& a) {
  MMPOST_CHECK_USAGE(a.num_workers > 0 && a.num_threads > 0 && a.epochs > 0,
                     "--num-workers, --num-threads and --epochs must be > 0");
  MMPOST_CHECK_USAGE(a.patch_size > 0 && a.image_size % a.patch_size == 0,
                     "--image-size must be a multiple of --patch-size");
  torch::set_num_threads(static_cast<int>(a.num_threads));
  cv::setNumThreads(static_cast<int>(a.num_threads));
  data::Tokenizer tokenizer(a.tokenizer);
  tokenizer.add_special_token(data::kImagePlaceholder, a.image_token_index);
  const int64_t side = a.image_size / a.patch_size;
  data::SampleContext ctx;
  ctx.tokenizer = &tokenizer;
  ctx.template_options = {data::ChatTemplate::kLlava, a.image_token_index, side * side, false};
  ctx.image.image_size = a.image_size;
  ctx.image.interpolation = a.interpolation;
  ctx.image.image_mean = a.image_mean;
  ctx.image.image_std = a.image_std;
  ctx.base_dir = std::filesystem::path(a.data).parent_path();
  ctx.source = a.data;
  ctx.max_length = a.max_length;

  one_pass(a, ctx);  // warm-up: page cache, allocator, sentencepiece
  const auto t0 = std::chrono::steady_clock::now();
  PassCounts total;
  for (int64_t e = 0; e < a.epochs; ++e) {
    auto c = one_pass(a, ctx);
    total.n += c.n;
    total.n_images += c.n_images;
    total.n_tokens += c.n_tokens;
  }
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  nlohmann::json r = {{"images_per_s", total.n_images / dt},
                      {"samples_per_s", total.n / dt},
                      {"n", total.n},
                      {"n_images", total.n_images},
                      {"n_tokens", total.n_tokens},
                      {"seconds", dt},
                      {"num_workers", a.num_workers},
                      {"num_threads", a.num_threads}};
  std::cout << r.dump() << std::endl;
  return 0;
}
}  // namespace

// mmpost bench-tokenize (hidden): encode throughput of a tokenizer file (tokenizer.model or
// tokenizer.json, with the files beside it) on a text file cut into chunks of --chunk bytes at
// UTF-8 boundaries, one thread, after one untimed pass. One JSON line: {"tokens_per_s",
// "mb_per_s", "n_tokens", "bytes", "chunks", "seconds"}. For scripts/bench/smollm2.sh.
Stage setup_bench_tokenize(CLI::App& app) {
  auto* sub = app.add_subcommand("bench-tokenize", "time a tokenizer's encode on a text file");
  sub->group("");
  static std::string tokenizer, text;
  static int64_t chunk = 4096, epochs = 3;
  sub->add_option("--tokenizer", tokenizer, "tokenizer.model or tokenizer.json")->required();
  sub->add_option("--text", text, "UTF-8 text file")->required();
  sub->add_option("--chunk", chunk, "bytes per encode call")->capture_default_str();
  sub->add_option("--epochs", epochs, "timed passes")->capture_default_str();
  return {sub, [] {
            std::ifstream in(text, std::ios::binary);
            MMPOST_CHECK_USAGE(in.good(), text, ": cannot read");
            const std::string all(std::istreambuf_iterator<char>(in), {});
            std::vector<std::string> chunks;
            for (size_t i = 0; i < all.size();) {
              size_t n = std::min<size_t>(static_cast<size_t>(chunk), all.size() - i);
              while (i + n < all.size() && (static_cast<unsigned char>(all[i + n]) & 0xC0) == 0x80) ++n;
              chunks.push_back(all.substr(i, n));
              i += n;
            }
            const auto tok = hub::load_tokenizer(tokenizer);
            int64_t n_tokens = 0;
            for (const auto& c : chunks) n_tokens += static_cast<int64_t>(tok->encode(c).size());
            const auto t0 = std::chrono::steady_clock::now();
            for (int64_t e = 0; e < epochs; ++e) {
              for (const auto& c : chunks) tok->encode(c);
            }
            const double s =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            std::cout << nlohmann::json({{"tokens_per_s", n_tokens * epochs / s},
                                         {"mb_per_s", all.size() * epochs / s / 1e6},
                                         {"n_tokens", n_tokens}, {"bytes", all.size()},
                                         {"chunks", chunks.size()}, {"seconds", s}})
                             .dump()
                      << std::endl;
            return 0;
          }};
}

Stage setup_bench(CLI::App& app) {
  auto* sub = app.add_subcommand("bench-preprocess", "time the SFT preprocessing stage alone");
  sub->group("");  // hidden from --help: a benchmark hook, not a user-facing stage
  static BenchArgs a;
  sub->add_option("--data,-d", a.data, "JSONL in the sft format")->required();
  sub->add_option("--tokenizer", a.tokenizer, "sentencepiece model")->capture_default_str();
  sub->add_option("--image-size", a.image_size, "square model input")->capture_default_str();
  sub->add_option("--patch-size", a.patch_size, "vision patch size")->capture_default_str();
  sub->add_option("--image-token-index", a.image_token_index, "id of <image>")
      ->capture_default_str();
  sub->add_option("--interpolation", a.interpolation, "bicubic | bilinear | area | nearest")
      ->capture_default_str();
  sub->add_option("--image-mean", a.image_mean, "3 values")->expected(3);
  sub->add_option("--image-std", a.image_std, "3 values")->expected(3);
  sub->add_option("--num-workers", a.num_workers, "loader threads")->capture_default_str();
  sub->add_option("--num-threads", a.num_threads, "torch and OpenCV threads")
      ->capture_default_str();
  sub->add_option("--epochs", a.epochs, "timed passes (after one warm-up pass)")
      ->capture_default_str();
  sub->add_option("--batch-size", a.batch_size, "loader batch size")->capture_default_str();
  sub->add_option("--max-length", a.max_length, "max tokens per sample")->capture_default_str();
  return {sub, [] { return run_bench(a); }};
}

}  // namespace mmpost::cli
