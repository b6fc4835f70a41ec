// Preference data (TRL preference JSONL -> prompt/chosen/rejected ids), the concatenated batch
// layout, per-pair log-prob sums with LD-DPO tails, mDPO's terms and image corruption, and the
// shared-feature forward used by DPO.
#include <cmath>
#include <filesystem>

#include "catch.h"
#include "mmpost/algo/dpo_loss.h"
#include "mmpost/core/check.h"
#include "mmpost/data/preference_dataset.h"
#include "mmpost/model/vlm.h"
#include "mmpost/train/preference.h"

namespace unit_test_preference {

using namespace mmpost;
using namespace mmpost::data;
namespace fs = std::filesystem;

namespace {
const std::string kTok = std::string(MMPOST_SOURCE_DIR) + "/data/tokenizer/tokenizer.model";
const fs::path kDigits = fs::path(MMPOST_SOURCE_DIR) / "data/digits-vqa";

SampleContext make_ctx(const Tokenizer& tok) {
  SampleContext ctx;
  ctx.tokenizer = &tok;
  ctx.template_options = {ChatTemplate::kLlava, /*image_token_id=*/4, /*n_image_tokens=*/4, false};
  ctx.image.image_size = 8;
  ctx.image.interpolation = "area";
  ctx.image.image_mean = {0.5, 0.5, 0.5};
  ctx.image.image_std = {0.5, 0.5, 0.5};
  ctx.base_dir = kDigits;
  ctx.source = "prefs.jsonl";
  ctx.max_length = 64;
  return ctx;
}

nlohmann::json conversational() {
  return nlohmann::json::parse(R"({"id": "p1", "images": ["images/0000.png"],
    "prompt": [{"role": "user", "content": "<image>\nWhich digit is this?"}],
    "chosen": [{"role": "assistant", "content": "0"}],
    "rejected": [{"role": "assistant", "content": "8 or 6"}]})");
}
}  // namespace

TEST_CASE("preference sample: prompt + completion equals the SFT encoding", "[unit][preference]") {
  Tokenizer tok(kTok);
  tok.add_special_token(kImagePlaceholder, 4);
  auto ctx = make_ctx(tok);
  auto s = make_preference_sample(conversational(), 1, ctx, {});
  // The whole conversation through the SFT template, turn by turn.
  TemplateOptions o = ctx.template_options;
  auto full = encode_conversation({{"user", "<image>\nWhich digit is this?"}, {"assistant", "0"}},
                                  tok, o);
  std::vector<int64_t> joined = s.prompt_ids;
  joined.insert(joined.end(), s.chosen_ids.begin(), s.chosen_ids.end());
  CHECK(joined == full.input_ids);
  // The prompt is everything up to the first supervised label ("ASSISTANT:" included).
  size_t first_label = 0;
  while (full.labels[first_label] == algo::kIgnoreIndex) ++first_label;
  CHECK(s.prompt_ids.size() == first_label);
  CHECK(s.chosen_labels == s.chosen_ids);  // the reply and its EOS, all supervised
  CHECK(s.chosen_ids.back() == tok.eos_id());
  CHECK(s.rejected_ids.back() == tok.eos_id());
  CHECK(s.rejected_ids.size() > s.chosen_ids.size());
  CHECK(std::count(s.prompt_ids.begin(), s.prompt_ids.end(), 4) == 4);  // 1 image x 4 tokens
  REQUIRE(s.pixel_values.defined());
  CHECK(s.pixel_values.sizes() == torch::IntArrayRef({1, 3, 8, 8}));
  CHECK(s.chosen_text == "0");

  // TRL's standard (string) form encodes to the same ids.
  auto str = nlohmann::json::parse(R"({"images": ["images/0000.png"],
    "prompt": "<image>\nWhich digit is this?", "chosen": "0", "rejected": "8 or 6"})");
  auto t = make_preference_sample(str, 2, ctx, {});
  CHECK(t.prompt_ids == s.prompt_ids);
  CHECK(t.chosen_ids == s.chosen_ids);
  CHECK(t.rejected_ids == s.rejected_ids);
  CHECK(t.id == "line-2");
}

TEST_CASE("preference sample: truncation order and limits", "[unit][preference]") {
  Tokenizer tok(kTok);
  tok.add_special_token(kImagePlaceholder, 4);
  auto ctx = make_ctx(tok);
  auto rec = conversational();
  auto s = make_preference_sample(rec, 1, ctx, {});
  const int64_t tp = static_cast<int64_t>(s.prompt_ids.size());
  const int64_t tr = static_cast<int64_t>(s.rejected_ids.size());
  REQUIRE(tr >= 3);
  // max_completion_length keeps the first tokens of each completion.
  auto c = make_preference_sample(rec, 1, ctx, {0, 2, 0});
  CHECK(c.rejected_ids == std::vector<int64_t>(s.rejected_ids.begin(), s.rejected_ids.begin() + 2));
  CHECK(c.chosen_ids.size() == std::min<size_t>(2, s.chosen_ids.size()));
  // max_length shrinks the completions, never the prompt.
  auto m = make_preference_sample(rec, 1, ctx, {0, 0, tp + 1});
  CHECK(static_cast<int64_t>(m.prompt_ids.size()) == tp);
  CHECK(m.rejected_ids.size() == 1);
  CHECK_THROWS_WITH(make_preference_sample(rec, 5, ctx, {0, 0, tp}),
                    HasSubstr("prefs.jsonl:5") && HasSubstr("no room for a completion"));
  // max_prompt_length keeps the end of the prompt unless that would cut an image token.
  auto text_only = nlohmann::json::parse(R"({"prompt": "one two three four five six",
    "chosen": "a", "rejected": "b"})");
  auto full = make_preference_sample(text_only, 1, ctx, {});
  auto p = make_preference_sample(text_only, 1, ctx, {3, 0, 0});
  CHECK(p.prompt_ids ==
        std::vector<int64_t>(full.prompt_ids.end() - 3, full.prompt_ids.end()));
  const int64_t first_image =
      std::find(s.prompt_ids.begin(), s.prompt_ids.end(), 4) - s.prompt_ids.begin();
  CHECK(make_preference_sample(rec, 6, ctx, {tp - first_image, 0, 0}).prompt_ids.front() == 4);
  CHECK_THROWS_WITH(make_preference_sample(rec, 6, ctx, {tp - first_image - 1, 0, 0}),
                    HasSubstr("prefs.jsonl:6") && HasSubstr("cut image tokens"));
}

TEST_CASE("bad preference records name FILE:LINE", "[unit][preference]") {
  Tokenizer tok(kTok);
  tok.add_special_token(kImagePlaceholder, 4);
  auto ctx = make_ctx(tok);
  auto with = [](const std::string& key, const nlohmann::json& v) {
    auto r = conversational();
    if (v.is_null()) {
      r.erase(key);
    } else {
      r[key] = v;
    }
    return r;
  };
  CHECK_THROWS_WITH(make_preference_sample(with("rejected", nullptr), 7, ctx, {}),
                    HasSubstr("prefs.jsonl:7") && HasSubstr("missing \"rejected\""));
  CHECK_THROWS_WITH(make_preference_sample(with("prompt", nullptr), 8, ctx, {}),
                    HasSubstr("prefs.jsonl:8") && HasSubstr("missing \"prompt\""));
  CHECK_THROWS_WITH(make_preference_sample(with("chosen", "  "), 9, ctx, {}),
                    HasSubstr("prefs.jsonl:9") && HasSubstr("chosen[0].content: empty response"));
  CHECK_THROWS_WITH(
      make_preference_sample(with("chosen", nlohmann::json::array({{{"role", "user"},
                                                                    {"content", "x"}}})),
                             10, ctx, {}),
      HasSubstr("prefs.jsonl:10") && HasSubstr("chosen[0].role"));
  CHECK_THROWS_WITH(make_preference_sample(with("images", nlohmann::json::array()), 11, ctx, {}),
                    HasSubstr("prefs.jsonl:11") &&
                        HasSubstr("1 <image> placeholder(s) in the prompt but 0 image(s)"));
  CHECK_THROWS_WITH(make_preference_sample(with("rejected", 5), 12, ctx, {}),
                    HasSubstr("prefs.jsonl:12") && HasSubstr("rejected: expected a string"));
  CHECK_THROWS_WITH(make_preference_sample(with("images", {"images/missing.png"}), 13, ctx, {}),
                    HasSubstr("prefs.jsonl:13") && HasSubstr("missing.png"));
  CHECK_THROWS_WITH(make_preference_sample(nlohmann::json::array(), 14, ctx, {}),
                    HasSubstr("prefs.jsonl:14"));
}

TEST_CASE("collate_preference: chosen rows on rejected rows, prompt unsupervised",
          "[unit][preference]") {
  PreferenceSample a, b;
  a.prompt_ids = {1, 10, 11};
  a.chosen_ids = {20, 2};
  a.chosen_labels = {20, 2};
  a.rejected_ids = {21, 22, 2};
  a.rejected_labels = {21, 22, 2};
  a.pixel_values = torch::zeros({1, 3, 2, 2});
  a.line = 4;
  b.prompt_ids = {1, 12};
  b.chosen_ids = {23, 2};
  b.chosen_labels = {23, 2};
  b.rejected_ids = {2};
  b.rejected_labels = {2};
  b.pixel_values = torch::ones({2, 3, 2, 2});
  b.line = 9;
  auto batch = collate_preference({a, b}, /*pad_id=*/3);
  CHECK(batch.batch_size == 2);
  CHECK(batch.input_ids.equal(torch::tensor({1, 10, 11, 20, 2, 3,   // prompt a + chosen a
                                             1, 12, 23, 2, 3, 3,    // prompt b + chosen b
                                             1, 10, 11, 21, 22, 2,  // prompt a + rejected a
                                             1, 12, 2, 3, 3, 3},    // prompt b + rejected b
                                            torch::kInt64)
                                  .view({4, 6})));
  CHECK(batch.labels[0].equal(torch::tensor({-100, -100, -100, 20, 2, -100}, torch::kInt64)));
  CHECK(batch.labels[3].equal(torch::tensor({-100, -100, 2, -100, -100, -100}, torch::kInt64)));
  CHECK(batch.attention_mask.sum().item<int64_t>() == 5 + 4 + 6 + 3);
  CHECK(batch.n_tokens == 18);
  CHECK(batch.pixel_values.size(0) == 3);  // images stored once: 1 + 2
  CHECK(batch.lines == std::vector<int64_t>{4, 9});
}

TEST_CASE("preference_logps sums completion tokens and splits LD-DPO tails", "[unit][dpo]") {
  // B = 1 pair: chosen has 3 completion tokens, rejected 2 (shifted positions, T - 1 = 4).
  algo::TokenStats s;
  s.logps = torch::tensor({0.0f, -1.0f, -2.0f, -4.0f,    // chosen: tokens at 1..3
                           0.0f, -0.5f, -1.5f, 0.0f},    // rejected: tokens at 1..2
                          torch::kFloat32)
                .view({2, 4});
  s.mask = torch::tensor({0, 1, 1, 1, 0, 1, 1, 0}, torch::kBool).view({2, 4});
  s.log_sum_sq = torch::full({2, 4}, -0.25f).masked_fill(~s.mask, 0.0f);
  auto p = algo::preference_logps(s, 1);
  CHECK(p.chosen.item<float>() == Approx(-7.0));
  CHECK(p.rejected.item<float>() == Approx(-2.0));
  CHECK(p.n_chosen.item<float>() == 3);
  CHECK(p.n_rejected.item<float>() == 2);
  // Shared length min(3, 2) = 2: the chosen tail is its 3rd token (-4), the rejected has none.
  CHECK(p.chosen_tail.item<float>() == Approx(-4.0));
  CHECK(p.rejected_tail.item<float>() == 0.0f);
  CHECK(p.chosen_log_sum_sq.item<float>() == Approx(-0.75));
  CHECK(p.rejected_log_sum_sq.item<float>() == Approx(-0.5));
}

TEST_CASE("token_stats equals a direct log_softmax", "[unit][dpo]") {
  torch::manual_seed(3);
  auto logits = torch::randn({3, 5, 7});
  auto labels = torch::tensor({-100, 2, 3, -100, 6, -100, -100, 1, 1, 0, 4, 4, 4, 4, -100},
                              torch::kInt64)
                    .view({3, 5});
  auto s = algo::token_stats(logits, labels, /*with_log_sum_sq=*/true);
  auto lp = torch::log_softmax(logits.narrow(1, 0, 4), -1);
  auto lb = labels.narrow(1, 1, 4);
  auto mask = lb.ne(-100);
  auto want = lp.gather(-1, lb.clamp_min(0).unsqueeze(-1)).squeeze(-1).masked_fill(~mask, 0);
  CHECK((s.logps - want).abs().max().item<float>() < 1e-6);
  auto want_sq = torch::logsumexp(2 * lp, -1).masked_fill(~mask, 0);
  CHECK((s.log_sum_sq - want_sq).abs().max().item<float>() < 1e-6);
  auto want_sum = (logits.narrow(1, 0, 4) * mask.unsqueeze(-1)).sum({1, 2});
  CHECK((s.logits_sum - want_sum).abs().max().item<float>() < 1e-5);
}

TEST_CASE("mdpo conditional and anchor terms", "[unit][dpo]") {
  // ratio = -1 - (-2) = 1; corrupted ratio = -3 - (-2.5) = -0.5; beta = 0.5.
  // conditional = -log sigmoid(0.5 * (1 + 0.5)) = log(1 + e^-0.75) = 0.386871
  // anchor      = -log sigmoid(0.5 * 1 - 0.2)   = log(1 + e^-0.3)  = 0.554355
  auto t = [](float v) { return torch::tensor({v}); };
  auto m = algo::mdpo_loss(t(-1), t(-2), t(-3), t(-2.5), 0.5, 0.2);
  CHECK(m.conditional.item<float>() == Approx(0.386871).epsilon(1e-5));
  CHECK(m.anchor.item<float>() == Approx(0.554355).epsilon(1e-5));
}

TEST_CASE("mDPO image corruption: deterministic crop, mask and noise", "[unit][preference]") {
  auto img = torch::arange(3 * 10 * 10, torch::kFloat32).view({3, 10, 10}) / 300.0;
  ImageCorruption mask{"mask", 0.25};
  auto a = corrupt_pixel_values(img, mask, 7);
  CHECK(a.equal(corrupt_pixel_values(img, mask, 7)));
  CHECK(!a.equal(corrupt_pixel_values(img, mask, 8)));
  // A 5x5 window (25% of the area) set to 0 in every channel; the rest untouched (img is 0
  // in all channels nowhere else).
  CHECK(a.eq(0).all(0).sum().item<int64_t>() == 25);
  CHECK((a != img).any(0).sum().item<int64_t>() <= 25);
  ImageCorruption crop{"crop", 0.75};  // keeps a 5x5 window, resized back to 10x10
  auto c = corrupt_pixel_values(img, crop, 1);
  CHECK(c.sizes() == img.sizes());
  CHECK(!c.equal(img));
  ImageCorruption noise{"noise", 0.5};
  auto n = corrupt_pixel_values(img, noise, 2) - img;
  CHECK(n.std().item<float>() == Approx(0.5).epsilon(0.15));
  CHECK_THROWS_WITH(corrupt_pixel_values(img, {"blur", 0.5}, 1), HasSubstr("crop, mask, noise"));
}

TEST_CASE("preference_forward shares one vision pass and matches the plain forward",
          "[unit][preference]") {
  torch::manual_seed(0);
  model::VlmConfig cfg;
  cfg.image_token_index = 4;
  cfg.vision_config.hidden_size = 16;
  cfg.vision_config.intermediate_size = 32;
  cfg.vision_config.num_hidden_layers = 1;
  cfg.vision_config.num_attention_heads = 2;
  cfg.vision_config.image_size = 8;
  cfg.vision_config.patch_size = 4;
  cfg.text_config.vocab_size = 64;
  cfg.text_config.hidden_size = 16;
  cfg.text_config.intermediate_size = 32;
  cfg.text_config.num_hidden_layers = 1;
  cfg.text_config.num_attention_heads = 2;
  cfg.text_config.num_key_value_heads = 1;
  auto vlm = model::build_vlm(cfg);
  vlm->eval();
  const int64_t P = cfg.n_image_tokens();
  PreferenceSample a;
  a.prompt_ids = {1, 9};
  a.prompt_ids.insert(a.prompt_ids.end(), P, 4);
  a.prompt_ids.push_back(10);
  a.chosen_ids = a.chosen_labels = {20, 21, 2};
  a.rejected_ids = a.rejected_labels = {22, 2};
  a.pixel_values = torch::randn({1, 3, 8, 8});
  auto b = collate_preference({a}, 3);
  torch::NoGradGuard no_grad;
  auto f = train::preference_forward(vlm, b, false, false);
  // Reference: the plain forward with the image repeated for both rows.
  auto logits = vlm->forward(b.input_ids, torch::cat({a.pixel_values, a.pixel_values}),
                             b.attention_mask);
  auto [sums, n] = algo::sequence_logps(logits, b.labels);
  CHECK(std::abs(f.logps.chosen.item<float>() - sums[0].item<float>()) < 1e-5);
  CHECK(std::abs(f.logps.rejected.item<float>() - sums[1].item<float>()) < 1e-5);
  CHECK(f.logps.n_chosen.item<float>() == 3);
  CHECK(f.logps.n_rejected.item<float>() == 2);
}

}  // namespace unit_test_preference
