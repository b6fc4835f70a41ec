// Qwen2-VL samples: each image expands to its own number of <|image_pad|> tokens (t * h * w /
// merge^2 of its grid) inside <|vision_start|> ... <|vision_end|>, never supervised; the
// validation pass (no decoding) counts the same tokens from the file header; collate
// concatenates pixel_values and image_grid_thw in sample order.
#include "catch.h"
#include "test_util.h"

#include "mmpost/algo/ignore_index.h"
#include "mmpost/data/collate.h"
#include "mmpost/data/preference_dataset.h"
#include "mmpost/data/sft_dataset.h"
#include "mmpost/io/checkpoint.h"

#include <algorithm>
#include <filesystem>

namespace unit_test_qwen2_vl_data {

using namespace mmpost::data;
namespace fs = std::filesystem;

namespace {
// The Qwen2 BPE fixture with Qwen2-VL's vision tokens added (ids 600-602).
fs::path qwen_tokenizer(const fs::path& dir) {
  auto j = mmpost::testing::read_json_file(mmpost::testing::kGoldenFixtures /
                                           "bpe/qwen2/tokenizer.json");
  int64_t id = 600;
  for (const char* t : {"<|vision_start|>", "<|vision_end|>", "<|image_pad|>"}) {
    j["added_tokens"].push_back({{"id", id++}, {"content", t}, {"single_word", false},
                                 {"lstrip", false}, {"rstrip", false}, {"normalized", false},
                                 {"special", true}});
  }
  mmpost::io::write_text_atomic(dir / "tokenizer.json", j.dump());
  return dir / "tokenizer.json";
}
/// Qwen2-VL template and image settings (28*28 .. 28*28*16 pixels) over the fixture photos.
SampleContext qwen_context(const Tokenizer& tok, int64_t image_pad) {
  SampleContext ctx;
  ctx.tokenizer = &tok;
  ctx.template_options.chat_template = ChatTemplate::kQwen2Vl;
  ctx.template_options.image_token_id = image_pad;
  ctx.template_options.image_text = "<|image_pad|>";
  Qwen2VLImageConfig q;
  q.min_pixels = 28 * 28;
  q.max_pixels = 28 * 28 * 16;
  ctx.image.qwen = q;
  ctx.base_dir = mmpost::testing::kGoldenFixtures / "qwen2_vl_processor";
  return ctx;
}
}  // namespace

TEST_CASE("Qwen2-VL samples expand each image to its grid's token count", "[unit][qwen2vl]") {
  mmpost::testing::TempDir dir("qwen_data");
  Tokenizer tok(qwen_tokenizer(dir.path).string());
  const int64_t vs = 600, ve = 601, pad = 602;
  REQUIRE(tok.encode("<|image_pad|>", false) == std::vector<int64_t>{pad});
  SampleContext ctx = qwen_context(tok, pad);
  ctx.source = "mem.jsonl";
  ctx.max_length = 4096;
  const nlohmann::json rec = {
      {"images", {"chelsea.png", "rocket.png"}},
      {"messages",
       {{{"role", "user"}, {"content", "<image>\nwhat is this?"}},
        {{"role", "assistant"}, {"content", "a cat"}},
        {{"role", "user"}, {"content", "<image>and this?"}},
        {{"role", "assistant"}, {"content", "a rocket"}}}}};
  auto s = make_sft_sample(rec, 1, ctx);
  REQUIRE(s.image_grid_thw.defined());
  REQUIRE(s.image_grid_thw.size(0) == 2);
  auto g = s.image_grid_thw.accessor<int64_t, 2>();
  std::vector<int64_t> expected_counts;
  int64_t patches = 0;
  for (int i = 0; i < 2; ++i) {
    CHECK(g[i][0] == 1);
    expected_counts.push_back(g[i][1] * g[i][2] / 4);
    patches += g[i][1] * g[i][2];
  }
  CHECK(s.pixel_values.size(0) == patches);
  CHECK(s.pixel_values.size(1) == 3 * 2 * 14 * 14);
  // The runs of <|image_pad|> between <|vision_start|> and <|vision_end|>, in order.
  std::vector<int64_t> runs;
  for (size_t i = 0; i < s.input_ids.size(); ++i) {
    if (s.input_ids[i] != vs) continue;
    size_t j = i + 1;
    while (j < s.input_ids.size() && s.input_ids[j] == pad) {
      CHECK(s.labels[j] == mmpost::algo::kIgnoreIndex);
      ++j;
    }
    REQUIRE(j < s.input_ids.size());
    CHECK(s.input_ids[j] == ve);
    runs.push_back(static_cast<int64_t>(j - i - 1));
  }
  CHECK(runs == expected_counts);
  CHECK(std::count(s.input_ids.begin(), s.input_ids.end(), pad) ==
        expected_counts[0] + expected_counts[1]);
  // Both replies are supervised (with their <|im_end|>), nothing else is.
  const auto cat = tok.encode("a cat<|im_end|>", false);
  int64_t n_supervised = 0;
  for (auto l : s.labels) n_supervised += l != mmpost::algo::kIgnoreIndex;
  CHECK(n_supervised == static_cast<int64_t>(cat.size() + tok.encode("a rocket<|im_end|>", false).size()));

  // The validation pass counts the same tokens from the PNG headers without decoding.
  SampleContext check = ctx;
  check.load_images = false;
  auto v = make_sft_sample(rec, 1, check);
  CHECK(v.input_ids == s.input_ids);
  CHECK_FALSE(v.pixel_values.defined());

  // The evaluation prompt (all but the last reply) keeps both images and the first reply.
  auto prompt = make_sft_sample(rec, 1, ctx, /*prompt_only=*/true);
  CHECK(prompt.reference == "a rocket");
  CHECK(std::count(prompt.input_ids.begin(), prompt.input_ids.end(), pad) ==
        expected_counts[0] + expected_counts[1]);
  CHECK(torch::equal(prompt.image_grid_thw, s.image_grid_thw));
  // ... and collating it as a generation prompt keeps the whole conversation so far.
  auto pb = collate_prompts({prompt}, 0);
  CHECK(pb.input_ids.size(1) == static_cast<int64_t>(prompt.input_ids.size()));
  CHECK(pb.input_ids.eq(pad).sum().item<int64_t>() == expected_counts[0] + expected_counts[1]);

  // Collate keeps the images and grids of all samples in order.
  auto b = collate({s, s}, 0);
  CHECK(b.pixel_values.size(0) == 2 * patches);
  CHECK(torch::equal(b.image_grid_thw, torch::cat({s.image_grid_thw, s.image_grid_thw})));

  // More placeholders than images is the usual FILE:LINE error.
  auto bad = rec;
  bad["images"] = {"chelsea.png"};
  CHECK_THROWS_WITH(make_sft_sample(bad, 7, ctx), Catch::Contains("mem.jsonl:7"));
}

TEST_CASE("Qwen2-VL preference prompts keep whole images when truncated", "[unit][qwen2vl]") {
  mmpost::testing::TempDir dir("qwen_prefs");
  Tokenizer tok(qwen_tokenizer(dir.path).string());
  const int64_t vs = 600, pad = 602;
  SampleContext ctx = qwen_context(tok, pad);
  ctx.source = "prefs.jsonl";
  const nlohmann::json rec = {
      {"images", {"rocket.png"}},
      {"prompt", {{{"role", "user"}, {"content", "<image>what is this?"}}}},
      {"chosen", "a rocket"},
      {"rejected", "a cat"}};
  auto whole = make_preference_sample(rec, 3, ctx, {});
  CHECK(whole.n_images == 1);
  CHECK(whole.image_grid_thw.size(0) == 1);
  // Keep the prompt from its first <|image_pad|> on: the cut would drop <|vision_start|> only.
  const auto& ids = whole.prompt_ids;
  const auto first_pad = std::find(ids.begin(), ids.end(), pad) - ids.begin();
  REQUIRE(first_pad > 0);
  REQUIRE(ids[first_pad - 1] == vs);
  PreferenceLimits at_pad{static_cast<int64_t>(ids.size()) - first_pad, 0, 0};
  CHECK_THROWS_WITH(make_preference_sample(rec, 3, ctx, at_pad),
                    Catch::Contains("prefs.jsonl:3") && Catch::Contains("cut image tokens"));
  // Keeping one more token (the start marker) is a valid truncation.
  PreferenceLimits at_start{static_cast<int64_t>(ids.size()) - first_pad + 1, 0, 0};
  auto cut = make_preference_sample(rec, 3, ctx, at_start);
  CHECK(cut.prompt_ids.front() == vs);
  CHECK(std::count(cut.prompt_ids.begin(), cut.prompt_ids.end(), pad) ==
        std::count(ids.begin(), ids.end(), pad));
}

}  // namespace unit_test_qwen2_vl_data
