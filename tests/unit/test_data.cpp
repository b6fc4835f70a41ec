// Tests for the preprocessing stage: tokenizer round trip, turn-by-turn label masks, image
// preprocessing against hand-computed pixel_values, record validation, the streaming loader.
#include <filesystem>
#include <fstream>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <set>

#include <atomic>

#include "catch.h"
#include "mmpost/core/check.h"
#include "mmpost/data/chat_template.h"
#include "mmpost/data/collate.h"
#include "mmpost/data/image.h"
#include "mmpost/data/loader.h"
#include "mmpost/data/sft_dataset.h"
#include "mmpost/data/tokenizer.h"

namespace unit_test_data {

using namespace mmpost;
using namespace mmpost::data;
namespace fs = std::filesystem;

namespace {
const std::string kTok = std::string(MMPOST_SOURCE_DIR) + "/data/tokenizer/tokenizer.model";

fs::path temp_dir(const std::string& name) {
  auto d = fs::temp_directory_path() / ("mmpost_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

/// Contiguous runs of supervised labels.
std::vector<std::vector<int64_t>> label_runs(const std::vector<int64_t>& labels) {
  std::vector<std::vector<int64_t>> runs;
  bool in = false;
  for (int64_t l : labels) {
    if (l == algo::kIgnoreIndex) {
      in = false;
      continue;
    }
    if (!in) runs.emplace_back();
    runs.back().push_back(l);
    in = true;
  }
  return runs;
}
}  // namespace

TEST_CASE("tokenizer round trip and special ids", "[unit][data]") {
  Tokenizer tok(kTok);
  CHECK(tok.bos_id() == 1);
  CHECK(tok.eos_id() == 2);
  CHECK(tok.pad_id() == 3);
  CHECK(tok.piece_to_id("<image>") == 4);
  const std::string text = "USER: <image>\nWhich digit is this? ASSISTANT: 7";
  auto ids = tok.encode(text);
  // Piece sequence recorded in data/tokenizer/README.md.
  CHECK(ids == std::vector<int64_t>{277, 461, 452, 4, 19, 474, 309, 273, 315, 296, 473, 285, 461,
                                    452, 495});
  CHECK(tok.decode(ids) == text);
  // Continuation text gets no dummy prefix: " 7" -> "▁" "7".
  CHECK(tok.encode(" 7", /*add_dummy_prefix=*/false) == std::vector<int64_t>{452, 495});
  CHECK(tok.encode("7", /*add_dummy_prefix=*/false) == std::vector<int64_t>{495});
  // Text that already starts with a space gets no second "▁" (transformers' Metaspace
  // prepend_scheme "first"; raw sentencepiece would give "▁" "▁" "7").
  CHECK(tok.encode(" 7") == std::vector<int64_t>{452, 495});
  // Unicode and bytes survive via byte fallback.
  const std::string odd = "naïve café 🙂 {x:1}";
  CHECK(tok.decode(tok.encode(odd)) == odd);
  // A special token registered by id is split out of the text.
  tok.add_special_token("<image>", 4);
  CHECK_THROWS_AS(tok.add_special_token("<image>", 32000), Error);
}

TEST_CASE("label mask on a hand-written two-turn sample", "[unit][data]") {
  Tokenizer tok(kTok);
  TemplateOptions opts{ChatTemplate::kLlava, /*image_token_id=*/4, /*n_image_tokens=*/3, false};
  std::vector<Message> msgs = {{"user", "<image>\nWhich digit is this?"},
                               {"assistant", "7"},
                               {"user", "Are you sure?"},
                               {"assistant", "Yes"}};
  auto enc = encode_conversation(msgs, tok, opts);
  REQUIRE(enc.input_ids.size() == enc.labels.size());
  CHECK(enc.n_images == 1);
  CHECK(enc.input_ids[0] == 1);  // BOS, unsupervised
  CHECK(enc.labels[0] == algo::kIgnoreIndex);
  // Exactly 3 image tokens, all unsupervised.
  int64_t n_img = 0;
  for (size_t i = 0; i < enc.input_ids.size(); ++i) {
    if (enc.input_ids[i] == 4) {
      ++n_img;
      CHECK(enc.labels[i] == algo::kIgnoreIndex);
    }
  }
  CHECK(n_img == 3);
  // Supervised positions are exactly " 7</s>" and " Yes</s>", built from the turns.
  auto runs = label_runs(enc.labels);
  REQUIRE(runs.size() == 2);
  CHECK(runs[0] == std::vector<int64_t>{452, 495, 2});
  auto yes = tok.encode(" Yes", false);
  yes.push_back(2);
  CHECK(runs[1] == yes);
  CHECK(tok.decode(runs[0]) == "7");
  CHECK(tok.decode(runs[1]) == "Yes");
  // Everything else decodes to the rendered prompt text.
  CHECK(render_conversation(msgs, tok, opts) ==
        "<s>USER: <image>\nWhich digit is this? ASSISTANT: 7</s>USER: Are you sure? ASSISTANT: "
        "Yes</s>");
  // Generation prompt ends with "ASSISTANT:" and has no labels.
  opts.add_generation_prompt = true;
  auto prompt = encode_conversation({msgs[0]}, tok, opts);
  CHECK(label_runs(prompt.labels).empty());
  CHECK(tok.decode(std::vector<int64_t>(prompt.input_ids.end() - 2, prompt.input_ids.end())) ==
        "ASSISTANT:");
}

TEST_CASE("pixel_values of a known 2x2 image equal hand-computed values", "[unit][data]") {
  auto dir = temp_dir("img");
  // OpenCV writes BGR: pixel (0,0) is pure red in RGB.
  cv::Mat bgr(2, 2, CV_8UC3);
  bgr.at<cv::Vec3b>(0, 0) = {0, 0, 255};      // red
  bgr.at<cv::Vec3b>(0, 1) = {0, 255, 0};      // green
  bgr.at<cv::Vec3b>(1, 0) = {255, 0, 0};      // blue
  bgr.at<cv::Vec3b>(1, 1) = {51, 102, 204};   // R=204 G=102 B=51
  auto path = (dir / "a.png").string();
  cv::imwrite(path, bgr);
  ImageProcessorConfig cfg;
  cfg.image_size = 2;
  cfg.image_mean = {0.5, 0.25, 0.0};
  cfg.image_std = {0.5, 0.25, 1.0};
  auto px = load_pixel_values(path, cfg);  // [3, 2, 2]
  REQUIRE(px.sizes() == torch::IntArrayRef({3, 2, 2}));
  // R channel: (v/255 - 0.5) / 0.5 -> red 1, green -1, blue -1, 204 -> 0.6
  CHECK(px[0][0][0].item<float>() == Approx(1.0f));
  CHECK(px[0][0][1].item<float>() == Approx(-1.0f));
  CHECK(px[0][1][0].item<float>() == Approx(-1.0f));
  CHECK(px[0][1][1].item<float>() == Approx(0.6f).margin(1e-6));
  // G channel: (v/255 - 0.25) / 0.25 -> green 3, 102 -> 0.6
  CHECK(px[1][0][1].item<float>() == Approx(3.0f));
  CHECK(px[1][1][1].item<float>() == Approx(0.6f).margin(1e-6));
  // B channel: v/255 -> blue 1, 51 -> 0.2
  CHECK(px[2][1][0].item<float>() == Approx(1.0f));
  CHECK(px[2][1][1].item<float>() == Approx(0.2f).margin(1e-6));

  // Grayscale is replicated to RGB; alpha is dropped.
  cv::Mat gray(2, 2, CV_8UC1, cv::Scalar(255));
  cv::imwrite((dir / "g.png").string(), gray);
  auto pg = load_pixel_values((dir / "g.png").string(), cfg);
  CHECK(pg[0][0][0].item<float>() == Approx(1.0f));
  CHECK(pg[1][0][0].item<float>() == Approx(3.0f));
  cv::Mat rgba(2, 2, CV_8UC4, cv::Scalar(0, 0, 255, 0));  // BGRA red, fully transparent
  cv::imwrite((dir / "r.png").string(), rgba);
  auto pr = load_pixel_values((dir / "r.png").string(), cfg);
  CHECK(pr[0][0][0].item<float>() == Approx(1.0f));

  // Shortest edge + center crop: a 2x4 image keeps its middle two columns.
  cv::Mat wide(2, 4, CV_8UC3, cv::Scalar(0, 0, 0));
  wide.col(1).setTo(cv::Scalar(0, 0, 255));
  wide.col(2).setTo(cv::Scalar(0, 0, 255));
  cv::imwrite((dir / "w.png").string(), wide);
  auto pw = load_pixel_values((dir / "w.png").string(), cfg);
  CHECK(pw.sizes() == torch::IntArrayRef({3, 2, 2}));
  CHECK(pw[0].min().item<float>() == Approx(1.0f));  // only red columns remain

  // Missing and corrupt files name the path.
  CHECK_THROWS_WITH(load_pixel_values((dir / "none.png").string(), cfg),
                    HasSubstr("none.png") && HasSubstr("not found"));
  std::ofstream((dir / "bad.png").string()) << "not a png";
  CHECK_THROWS_WITH(load_pixel_values((dir / "bad.png").string(), cfg),
                    HasSubstr("bad.png") && HasSubstr("decode"));
  fs::remove_all(dir);
}

namespace {
SampleContext make_ctx(const Tokenizer& tok, const fs::path& base) {
  SampleContext ctx;
  ctx.tokenizer = &tok;
  ctx.template_options = {ChatTemplate::kLlava, 4, 2, false};
  ctx.base_dir = base;
  ctx.source = (base / "d.jsonl").string();
  ctx.max_length = 64;
  ctx.load_images = false;
  return ctx;
}
}  // namespace

TEST_CASE("bad records give FILE:LINE errors", "[unit][data]") {
  Tokenizer tok(kTok);
  auto ctx = make_ctx(tok, "/tmp");
  auto rec = nlohmann::json::parse(
      R"({"id": "a", "images": ["x.png", "y.png"], "messages": [{"role": "user", "content": "<image>\nq"}, {"role": "assistant", "content": "7"}]})");
  CHECK_THROWS_WITH(make_sft_sample(rec, 17, ctx),
                    HasSubstr("d.jsonl:17") &&
                        HasSubstr("1 <image> placeholder(s) in messages but 2"));
  // Kinds from public trackers: "images" as a string instead of a list, and a literal <image>
  // typed inside an answer (it would silently become an image slot): located errors.
  auto str_images = nlohmann::json::parse(
      R"({"images": "x.png", "messages": [{"role": "user", "content": "<image>\nq"}, {"role": "assistant", "content": "7"}]})");
  CHECK_THROWS_WITH(make_sft_sample(str_images, 5, ctx),
                    HasSubstr("d.jsonl:5") && HasSubstr("images: expected an array of paths"));
  auto typed = nlohmann::json::parse(
      R"({"images": ["x.png"], "messages": [{"role": "user", "content": "<image>\nq"}, {"role": "assistant", "content": "<image> 7"}]})");
  CHECK_THROWS_WITH(make_sft_sample(typed, 6, ctx),
                    HasSubstr("d.jsonl:6") && HasSubstr("2 <image> placeholder(s) in messages but 1"));
  auto no_asst = nlohmann::json::parse(R"({"messages": [{"role": "user", "content": "hi"}]})");
  CHECK_THROWS_WITH(make_sft_sample(no_asst, 3, ctx), HasSubstr("d.jsonl:3"));
  auto bad_role = nlohmann::json::parse(R"({"messages": [{"role": "bot", "content": "hi"}]})");
  CHECK_THROWS_WITH(make_sft_sample(bad_role, 4, ctx),
                    HasSubstr("messages[0].role"));
  // Too long: truncation keeps the sample while an answer token survives; else an error.
  auto ok = nlohmann::json::parse(
      R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "1 2 3 4 5 6 7 8 9"}]})");
  ctx.max_length = 8;
  auto s = make_sft_sample(ok, 5, ctx);
  CHECK(s.input_ids.size() == 8);
  ctx.max_length = 4;
  CHECK_THROWS_WITH(make_sft_sample(ok, 5, ctx), HasSubstr("max_length"));
  // Image files are resolved relative to the JSONL folder and must exist.
  ctx.load_images = true;
  ctx.max_length = 64;
  auto missing = nlohmann::json::parse(
      R"({"images": ["nope.png"], "messages": [{"role": "user", "content": "<image>q"}, {"role": "assistant", "content": "7"}]})");
  CHECK_THROWS_WITH(make_sft_sample(missing, 9, ctx),
                    HasSubstr("d.jsonl:9") && HasSubstr("nope.png"));
}

TEST_CASE("collate pads right, masks labels, stacks images", "[unit][data]") {
  SftSample a, b;
  a.input_ids = {1, 5, 6};
  a.labels = {-100, 5, 6};
  a.pixel_values = torch::zeros({2, 3, 4, 4});
  b.input_ids = {1, 7};
  b.labels = {-100, 7};
  b.pixel_values = torch::ones({1, 3, 4, 4});
  auto batch = collate({a, b}, /*pad_id=*/3);
  CHECK(batch.input_ids.equal(torch::tensor({1, 5, 6, 1, 7, 3}, torch::kInt64).view({2, 3})));
  CHECK(batch.labels.equal(torch::tensor({-100, 5, 6, -100, 7, -100}, torch::kInt64).view({2, 3})));
  CHECK(batch.attention_mask.equal(torch::tensor({1, 1, 1, 1, 1, 0}, torch::kInt64).view({2, 3})));
  CHECK(batch.pixel_values.size(0) == 3);
  CHECK(batch.pixel_values[2].sum().item<float>() == 48.0f);
  CHECK(batch.n_supervised == 3);
  auto left = collate({a, b}, 3, /*left_pad=*/true);
  CHECK(left.input_ids[1].equal(torch::tensor({3, 1, 7}, torch::kInt64)));
}

namespace {
fs::path write_jsonl(const fs::path& dir, int n, int bad_line) {
  auto p = dir / "d.jsonl";
  std::ofstream out(p);
  for (int i = 1; i <= n; ++i) {
    if (i == bad_line) {
      out << "{\"messages\": [oops\n";
      continue;
    }
    out << R"({"id": ")" << i << R"(", "messages": [{"role": "user", "content": "q"}, )"
        << R"({"role": "assistant", "content": ")" << i % 10 << "\"}]}\n";
  }
  return p;
}

std::vector<std::string> drain(StreamingLoader<SftSample>& loader, int max_batches = 1000) {
  std::vector<std::string> ids;
  for (int i = 0; i < max_batches; ++i) {
    auto b = loader.next_batch();
    if (!b) break;
    for (auto& s : *b) ids.push_back(s.id);
  }
  return ids;
}
}  // namespace

TEST_CASE("streaming loader: order, shuffling, skips, resume", "[unit][data]") {
  Tokenizer tok(kTok);
  auto dir = temp_dir("loader");
  auto path = write_jsonl(dir, 20, /*bad_line=*/5);
  auto ctx = make_ctx(tok, dir);
  ctx.source = path.string();
  auto make = [&ctx](const nlohmann::json& r, int64_t line) { return make_sft_sample(r, line, ctx); };
  std::atomic<int64_t> calls{0};  // make calls of the counting loaders
  auto counting = [&](const nlohmann::json& r, int64_t line) {
    ++calls;
    return make_sft_sample(r, line, ctx);
  };
  LoaderOptions lo;
  lo.path = path.string();
  lo.batch_size = 4;
  lo.skip_bad = true;

  SECTION("file order without shuffling; malformed line counted") {
    StreamingLoader<SftSample> loader(lo, make);
    auto ids = drain(loader);
    REQUIRE(ids.size() == 19);
    CHECK(ids[0] == "1");
    CHECK(ids[4] == "6");
    CHECK(loader.n_skipped() == 1);
  }
  SECTION("the malformed line is an error naming file:line by default") {
    lo.skip_bad = false;
    StreamingLoader<SftSample> loader(lo, make);
    CHECK_THROWS_WITH(drain(loader), HasSubstr("d.jsonl:5"));
  }
  SECTION("seeded shuffle: same seed, same order for any worker count") {
    lo.shuffle_buffer = 8;
    lo.seed = 7;
    lo.num_workers = 1;
    StreamingLoader<SftSample> a(lo, make);
    lo.num_workers = 4;
    StreamingLoader<SftSample> b(lo, make);
    lo.seed = 8;
    StreamingLoader<SftSample> c(lo, make);
    auto ia = drain(a), ib = drain(b), ic = drain(c);
    CHECK(ia == ib);
    CHECK(ia != ic);
    auto sorted = ia;
    std::sort(sorted.begin(), sorted.end());
    CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end());  // no duplicates
    CHECK(ia.size() == 19);
  }
  SECTION("resume from a cursor continues the same stream") {
    lo.shuffle_buffer = 8;
    lo.seed = 3;
    lo.repeat = true;
    StreamingLoader<SftSample> full(lo, make);
    auto all = drain(full, 8);  // crosses an epoch boundary
    StreamingLoader<SftSample> first(lo, make);
    auto head = drain(first, 3);
    auto cursor = first.cursor();
    StreamingLoader<SftSample> second(lo, make);
    second.seek(cursor);
    auto tail = drain(second, 5);
    head.insert(head.end(), tail.begin(), tail.end());
    CHECK(head == all);
  }
  SECTION("sample cache and preload: later epochs reuse the first's samples, same stream") {
    lo.shuffle_buffer = 8;
    lo.seed = 3;
    lo.repeat = true;
    lo.num_workers = 3;
    StreamingLoader<SftSample> plain(lo, make);
    auto expect = drain(plain, 15);  // three epochs of 19 good records in windows of 4
    lo.cache_bytes = int64_t{1} << 30;
    StreamingLoader<SftSample> cached(lo, counting);
    CHECK(drain(cached, 15) == expect);
    // Epoch 1 makes the 19 good samples (the malformed line never reaches make); later epochs
    // hit the cache for all of them, and the bad line is counted as skipped each epoch as before.
    CHECK(calls.load() == 19);
    CHECK(cached.n_made() == 19);
    CHECK(cached.n_cache_hits() > 19);
    CHECK(cached.n_skipped() == plain.n_skipped());
    // A budget of about 5 samples keeps the first 5 made; the rest are made every epoch.
    lo.cache_bytes = 5 * approx_sample_bytes(SftSample{}) + 1;  // text-only samples: all equal
    calls = 0;
    StreamingLoader<SftSample> small(lo, counting);
    CHECK(drain(small, 15) == expect);
    CHECK(small.n_cache_hits() > 0);
    CHECK(calls.load() > 19);

    // Preload: an epoch's samples are made before its first batch; the same stream.
    lo.cache_bytes = int64_t{1} << 30;
    lo.preload = true;
    calls = 0;
    StreamingLoader<SftSample> pre(lo, counting);
    auto first = pre.next_batch();
    REQUIRE(first.has_value());
    CHECK(calls.load() == 19);          // the whole first epoch, before its first batch
    CHECK(pre.n_preloaded() == 20);     // its 20 positions (the malformed one's result too)
    auto ids = drain(pre, 14);
    for (auto it = first->rbegin(); it != first->rend(); ++it) ids.insert(ids.begin(), it->id);
    CHECK(ids == expect);
    CHECK(calls.load() == 19);          // later epochs come from the cache
    CHECK(pre.n_skipped() == plain.n_skipped());
    CHECK(pre.n_preloaded() == 60);     // each epoch waited for its 20 positions

    // Only what the run will still take: 2 windows of 4 in file order (lines 1-8, line 5 bad).
    // The prefetch window (prefetch 1 x batch 4 + 1 worker = 5 positions past the consumer)
    // may make one more after the first batch is taken.
    lo.shuffle_buffer = 0;
    lo.prefetch = 1;
    lo.num_workers = 1;
    calls = 0;
    StreamingLoader<SftSample> bounded(lo, counting);
    bounded.set_remaining_windows(2);
    REQUIRE(bounded.next_batch().has_value());
    CHECK(calls.load() >= 7);
    CHECK(calls.load() <= 8);
    CHECK(bounded.n_preloaded() >= 8);

    // Without preload the same first batch comes back with at most that window made.
    lo.preload = false;
    calls = 0;
    StreamingLoader<SftSample> streamed(lo, counting);
    REQUIRE(streamed.next_batch().has_value());
    CHECK(calls.load() <= 8);
    CHECK(streamed.n_preloaded() == 0);

    // A budget of about 5 samples stops the preload there; the rest streams, same stream.
    lo.preload = true;
    lo.shuffle_buffer = 8;
    lo.prefetch = 8;
    lo.num_workers = 3;
    lo.cache_bytes = 5 * approx_sample_bytes(SftSample{}) + 1;
    StreamingLoader<SftSample> small_preloaded(lo, make);
    auto small_ids = drain(small_preloaded, 1);
    const int64_t first_epoch_preloaded = small_preloaded.n_preloaded();
    CHECK(first_epoch_preloaded > 0);
    auto rest = drain(small_preloaded, 14);
    small_ids.insert(small_ids.end(), rest.begin(), rest.end());
    CHECK(small_ids == expect);
    // The epochs after one that did not fit stream: nothing more is preloaded (memory stays
    // within the budget instead of another budget's worth each epoch).
    CHECK(small_preloaded.n_preloaded() == first_epoch_preloaded);
  }
  SECTION("a malformed record under preload still fails at its own batch") {
    lo.skip_bad = false;
    lo.repeat = true;
    lo.cache_bytes = int64_t{1} << 30;
    lo.preload = true;
    StreamingLoader<SftSample> loader(lo, make);
    REQUIRE(loader.next_batch().has_value());  // lines 1-4
    CHECK_THROWS_WITH(loader.next_batch(), HasSubstr("d.jsonl:5"));
  }
  SECTION("rank sharding splits records disjointly") {
    lo.world_size = 2;
    lo.rank = 0;
    StreamingLoader<SftSample> r0(lo, make);
    lo.rank = 1;
    StreamingLoader<SftSample> r1(lo, make);
    auto a = drain(r0), b = drain(r1);
    CHECK(a.size() + b.size() == 19);
    CHECK(a[0] == "1");
    CHECK(b[0] == "2");
  }
  fs::remove_all(dir);
}

TEST_CASE("random_shift translates by at most N pixels, deterministically per seed", "[unit][data]") {
  ImageProcessorConfig cfg;
  cfg.image_mean = {0, 0, 0};
  cv::Mat img(5, 5, CV_8UC3, cv::Scalar(0, 0, 0));
  img.at<cv::Vec3b>(2, 2) = {255, 255, 255};
  CHECK(cv::countNonZero(random_shift(img, 0, 1, cfg).reshape(1) != img.reshape(1)) == 0);
  std::set<std::pair<int, int>> seen;
  for (uint64_t seed = 0; seed < 40; ++seed) {
    cv::Mat out = random_shift(img, 1, seed, cfg);
    cv::Mat again = random_shift(img, 1, seed, cfg);
    CHECK(cv::countNonZero(out.reshape(1) != again.reshape(1)) == 0);
    cv::Mat gray;
    cv::cvtColor(out, gray, cv::COLOR_RGB2GRAY);
    cv::Point where;
    double maxv;
    cv::minMaxLoc(gray, nullptr, &maxv, nullptr, &where);
    REQUIRE(maxv == 255.0);
    CHECK(cv::countNonZero(gray) == 1);  // content moved, not blurred
    CHECK(std::abs(where.x - 2) <= 1);
    CHECK(std::abs(where.y - 2) <= 1);
    seen.insert({where.x, where.y});
  }
  CHECK(seen.size() >= 5);  // several of the 9 offsets occur
  // Per-sample seeds depend on (seed, epoch, position) only.
  CHECK(sample_seed(1, 0, 5) == sample_seed(1, 0, 5));
  CHECK(sample_seed(1, 0, 5) != sample_seed(1, 1, 5));
  CHECK(sample_seed(1, 0, 5) != sample_seed(1, 0, 6));
}

TEST_CASE("validation pass: every bad record in file order, capped, whatever the threads",
          "[unit][data]") {
  const fs::path dir = fs::temp_directory_path() / ("mmpost_validate_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path file = dir / "d.jsonl";
  {
    std::ofstream out(file);
    for (int i = 1; i <= 10000; ++i) {
      if (i == 5000) out << "\n";  // a blank line: skipped, but it keeps the line numbers
      else if (i % 997 == 0) out << "{broken\n";
      else out << R"({"n": )" << i << "}\n";
    }
  }
  // The check refuses n divisible by 1500 (lines 1500, 3000, ... as written).
  auto check = [&](const nlohmann::json& r, int64_t line) {
    MMPOST_CHECK_DATA(r["n"].get<int>() % 1500 != 0, file.string(), ":", line, ": n is a multiple of 1500");
  };
  for (int64_t workers : {1, 3}) {
    const auto rep = validate_records(file.string(), check, workers, /*max_errors=*/5);
    INFO("workers " << workers);
    CHECK(rep.n_records == 9999);
    // 10 lines of "{broken" (997 ... 9970) and 6 multiples of 1500 (1500 ... 9000).
    CHECK(rep.n_bad == 16);
    REQUIRE(rep.errors.size() == 5);
    CHECK(rep.errors[0].rfind(file.string() + ":997: malformed JSON", 0) == 0);
    CHECK(rep.errors[1] == file.string() + ":1500: n is a multiple of 1500");
    CHECK(rep.errors[2].rfind(file.string() + ":1994: malformed JSON", 0) == 0);
    CHECK(rep.errors[3].rfind(file.string() + ":2991: malformed JSON", 0) == 0);
    CHECK(rep.errors[4] == file.string() + ":3000: n is a multiple of 1500");
  }
  try {
    validate_before_training(file.string(), check, /*skip_bad=*/false, 2, "test", 2);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::kData);
    CHECK(e.message().find("16 of 9999 records are bad") != std::string::npos);
    CHECK(e.message().find("... and 14 more") != std::string::npos);
  }
  CHECK(validate_before_training(file.string(), check, /*skip_bad=*/true, 2, "test").n_bad == 16);
  fs::remove_all(dir);
}

TEST_CASE("no record to train on: an empty or blank file, or every record bad, is refused",
          "[unit][data]") {
  // Before: sft/dpo/rm on an empty file spun forever (each epoch ended at once) and ignored
  // SIGTERM; now the validation pass and the loader both refuse it, naming the file.
  const fs::path dir = fs::temp_directory_path() / ("mmpost_empty_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path empty = dir / "empty.jsonl", blank = dir / "blank.jsonl", bad = dir / "bad.jsonl";
  { std::ofstream out(empty); }
  { std::ofstream out(blank); out << "\n\n  \n"; }
  { std::ofstream out(bad); out << "{broken\n{\"n\": 3}\n"; }
  auto check = [&](const nlohmann::json& r, int64_t line) {
    MMPOST_CHECK_DATA(r.contains("ok"), bad.string(), ":", line, ": no ok");
  };
  for (const auto& f : {empty, blank}) {
    for (bool skip : {false, true}) {
      try {
        validate_before_training(f.string(), check, skip, 1, "test");
        FAIL("no error for " << f);
      } catch (const Error& e) {
        CHECK(e.kind() == ErrorKind::kData);
        CHECK(e.message() == f.string() + ": no records (the file is empty or holds only blank lines)");
      }
    }
  }
  try {
    validate_before_training(bad.string(), check, /*skip_bad=*/true, 1, "test");
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.message().rfind(bad.string() + ": all 2 records are bad", 0) == 0);
  }
  // The loader itself, with repeat: the first batch throws instead of looping over empty epochs.
  LoaderOptions lo;
  lo.path = empty.string();
  lo.batch_size = 2;
  lo.repeat = true;
  StreamingLoader<int> loader(lo, [](const nlohmann::json&, int64_t) { return 0; });
  CHECK_THROWS_WITH(loader.next_batch(), Catch::Matchers::Contains("no records"));
  lo.repeat = false;  // without repeat an empty file is just no batch (eval, generate)
  StreamingLoader<int> once(lo, [](const nlohmann::json&, int64_t) { return 0; });
  CHECK_FALSE(once.next_batch().has_value());
  fs::remove_all(dir);
}

}  // namespace unit_test_data
