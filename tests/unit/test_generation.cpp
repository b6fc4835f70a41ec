// Unit tests for the rollout side of lib/mmpost/model/generation: the KV cache against full
// recomputation on left-padded rows with 0, 1 and 2 images, seeded sampling, stop sequences and
// stop callbacks (the stop tokens stay in the output, as with HF StopStringCriteria), finish
// reasons and the truncated flag, and the grouped num_generations layout of repeat_interleave_batch.
#include "catch.h"

#include "mmpost/core/check.h"
#include "mmpost/model/generation.h"
#include "mmpost/model/vlm.h"
#include "mmpost/train/rollout.h"

#include <algorithm>
#include <vector>

namespace unit_test_generation {

using namespace mmpost::model;

namespace {

constexpr int64_t kImage = 63;  // image_token_index of the tiny config
constexpr int64_t kPad = 0;

// Tiny LLaVA: image 32 / patch 8 -> 16 image tokens per image; text 4 query heads : 2 kv heads.
VlmConfig tiny_config() {
  VlmConfig c;
  c.vision_config = {.hidden_size = 16, .intermediate_size = 32, .num_hidden_layers = 2,
                     .num_attention_heads = 2, .image_size = 32, .patch_size = 8};
  c.text_config.vocab_size = 64;
  c.text_config.hidden_size = 32;
  c.text_config.intermediate_size = 48;
  c.text_config.num_hidden_layers = 2;
  c.text_config.num_attention_heads = 4;
  c.text_config.num_key_value_heads = 2;
  c.text_config.head_dim = 8;
  c.text_config.max_position_embeddings = 128;
  c.image_token_index = kImage;
  return c;
}

// Three left-padded prompts with 1, 0 and 2 images (16 image tokens each), T = 40.
struct Prompts {
  torch::Tensor ids, mask, pixels;
  std::vector<int64_t> image_counts = {1, 0, 2};
};

Prompts mixed_prompts() {
  const std::vector<std::vector<int64_t>> rows = {
      [] {
        std::vector<int64_t> r = {1, 5};
        r.insert(r.end(), 16, kImage);
        r.insert(r.end(), {9, 12, 30});
        return r;
      }(),
      {1, 8, 17, 21, 40, 2, 33},
      [] {
        std::vector<int64_t> r = {1};
        r.insert(r.end(), 16, kImage);
        r.push_back(6);
        r.insert(r.end(), 16, kImage);
        r.insert(r.end(), {11, 7, 50, 3});
        return r;
      }()};
  Prompts p;
  const int64_t T = 40;
  p.ids = torch::full({3, T}, kPad, torch::kInt64);
  p.mask = torch::zeros({3, T}, torch::kInt64);
  for (int64_t i = 0; i < 3; ++i) {
    const auto n = static_cast<int64_t>(rows[i].size());
    p.ids[i].narrow(0, T - n, n).copy_(torch::tensor(rows[i], torch::kInt64));
    p.mask[i].narrow(0, T - n, n).fill_(1);
  }
  p.pixels = torch::randn({3, 3, 32, 32});
  return p;
}

// Length a row gets when it stops right after the first occurrence of `tail` in `row`, else
// row.size() (the reference the stop logic must reproduce).
int64_t first_end_of(const std::vector<int64_t>& row, const std::vector<int64_t>& tail) {
  for (size_t e = tail.size(); e <= row.size(); ++e) {
    if (std::equal(tail.begin(), tail.end(), row.begin() + (e - tail.size()))) {
      return static_cast<int64_t>(e);
    }
  }
  return static_cast<int64_t>(row.size());
}

std::vector<int64_t> row_of(const torch::Tensor& sequences, int64_t i) {
  auto r = sequences[i].contiguous();
  return {r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + r.numel()};
}

}  // namespace

TEST_CASE("repeat_interleave_batch groups G copies per prompt and keeps images aligned",
          "[unit][model]") {
  auto ids = torch::arange(12, torch::kInt64).reshape({3, 4});
  auto mask = torch::ones({3, 4}, torch::kInt64);
  mask[1][0] = 0;
  // Image k is filled with the value k: samples own images {0}, {}, {1, 2}.
  auto pixels = torch::arange(3, torch::kFloat32).reshape({3, 1, 1, 1}).expand({3, 3, 2, 2});
  auto r = repeat_interleave_batch(ids, mask, pixels.contiguous(), {1, 0, 2}, 2);
  REQUIRE(r.input_ids.sizes() == torch::IntArrayRef({6, 4}));
  for (int64_t row = 0; row < 6; ++row) {
    CHECK(torch::equal(r.input_ids[row], ids[row / 2]));
    CHECK(torch::equal(r.attention_mask[row], mask[row / 2]));
  }
  // Rows 0,1 -> image 0 each; rows 2,3 -> none; rows 4,5 -> images 1,2 each.
  REQUIRE(r.pixel_values.size(0) == 6);
  auto firsts = r.pixel_values.select(1, 0).select(1, 0).select(1, 0);
  CHECK(torch::equal(firsts, torch::tensor({0.f, 0.f, 1.f, 2.f, 1.f, 2.f})));

  auto no_images = repeat_interleave_batch(ids, mask, /*pixel_values=*/{}, {0, 0, 0}, 3);
  CHECK(no_images.input_ids.size(0) == 9);
  CHECK_FALSE(no_images.pixel_values.defined());
  CHECK_THROWS_AS(repeat_interleave_batch(ids, mask, pixels, {1, 0, 2}, 0), mmpost::Error);
  CHECK_THROWS(repeat_interleave_batch(ids, mask, pixels, {1, 1, 2}, 2));  // 4 counted, 3 held
}

TEST_CASE("generation over 0/1/2-image left-padded rows: cache equals recomputation, and each "
          "repeated row equals its prompt's",
          "[unit][model]") {
  torch::manual_seed(0);
  Vlm model(tiny_config());
  auto p = mixed_prompts();
  GenerationConfig g;
  g.max_new_tokens = 6;
  g.pad_token_id = kPad;
  auto cached = generate(model, p.ids, p.mask, p.pixels, g, /*use_cache=*/true);
  auto recomputed = generate(model, p.ids, p.mask, p.pixels, g, /*use_cache=*/false);
  REQUIRE(cached.sequences.sizes() == torch::IntArrayRef({3, 6}));
  CHECK(torch::equal(cached.sequences, recomputed.sequences));
  CHECK((cached.logps - recomputed.logps).abs().max().item<double>() < 1e-5);

  auto rep = repeat_interleave_batch(p.ids, p.mask, p.pixels, p.image_counts, 2);
  auto grouped = generate(model, rep.input_ids, rep.attention_mask, rep.pixel_values, g);
  REQUIRE(grouped.sequences.size(0) == 6);
  for (int64_t row = 0; row < 6; ++row) {
    INFO("row " << row);
    CHECK(torch::equal(grouped.sequences[row], cached.sequences[row / 2]));
    CHECK((grouped.logps[row] - cached.logps[row / 2]).abs().max().item<double>() < 1e-4);
  }
}

TEST_CASE("seeded sampling repeats, another seed and the G copies of a prompt differ",
          "[unit][model]") {
  torch::manual_seed(1);
  Vlm model(tiny_config());
  auto p = mixed_prompts();
  auto rep = repeat_interleave_batch(p.ids, p.mask, p.pixels, p.image_counts, 2);
  GenerationConfig g;
  g.max_new_tokens = 12;
  g.temperature = 1.0;
  g.seed = 7;
  auto a = generate(model, rep.input_ids, rep.attention_mask, rep.pixel_values, g);
  auto b = generate(model, rep.input_ids, rep.attention_mask, rep.pixel_values, g);
  CHECK(torch::equal(a.sequences, b.sequences));
  CHECK(torch::equal(a.logps, b.logps));
  g.seed = 8;
  auto c = generate(model, rep.input_ids, rep.attention_mask, rep.pixel_values, g);
  CHECK_FALSE(torch::equal(a.sequences, c.sequences));
  // 12 draws from a near-uniform 63-way distribution: two copies agreeing is ~63^-12.
  for (int64_t i = 0; i < 3; ++i) {
    CHECK_FALSE(torch::equal(a.sequences[2 * i], a.sequences[2 * i + 1]));
  }
  // Sampled log-probs are under the untempered model: all finite and negative.
  CHECK((a.logps < 0).all().item<bool>());
}

TEST_CASE("per-row seeds: a row's tokens do not depend on the other rows of its batch",
          "[unit][model]") {
  // What data-parallel rollouts rely on: rows 0 and 2 sampled alone with their own seeds equal
  // the same rows sampled inside the full batch.
  torch::manual_seed(1);
  Vlm model(tiny_config());
  auto p = mixed_prompts();
  auto rep = repeat_interleave_batch(p.ids, p.mask, p.pixels, p.image_counts, 2);  // 6 rows
  GenerationConfig g;
  g.max_new_tokens = 10;
  g.temperature = 1.0;
  g.row_seeds = {11, 12, 13, 14, 15, 16};
  auto all = generate(model, rep.input_ids, rep.attention_mask, rep.pixel_values, g);
  // Rows 4 and 5 (prompt 2, whose images are the last ones) alone.
  int64_t first_image = p.image_counts[0] + p.image_counts[1];
  auto sub_px = p.image_counts[2] > 0
                    ? rep.pixel_values.narrow(0, 2 * first_image, 2 * p.image_counts[2])
                    : torch::Tensor();
  g.row_seeds = {15, 16};
  auto two = generate(model, rep.input_ids.narrow(0, 4, 2), rep.attention_mask.narrow(0, 4, 2),
                      sub_px, g);
  const int64_t T = std::min(two.sequences.size(1), all.sequences.size(1));
  CHECK(torch::equal(two.sequences.narrow(1, 0, T), all.sequences.narrow(0, 4, 2).narrow(1, 0, T)));
  CHECK(torch::equal(two.lengths, all.lengths.narrow(0, 4, 2)));
  // Another seed for a row changes it; a wrong count is refused.
  g.row_seeds = {15, 99};
  auto other = generate(model, rep.input_ids.narrow(0, 4, 2), rep.attention_mask.narrow(0, 4, 2),
                        sub_px, g);
  CHECK_FALSE(torch::equal(other.sequences[1], two.sequences[1]));
  g.row_seeds = {1};
  CHECK_THROWS_WITH(generate(model, rep.input_ids, rep.attention_mask, rep.pixel_values, g),
                    Catch::Matchers::Contains("1 row seeds for 6 rows"));
}

TEST_CASE("stop sequences end a row after the sequence, which stays in the output",
          "[unit][model]") {
  torch::manual_seed(2);
  Vlm model(tiny_config());
  auto p = mixed_prompts();
  GenerationConfig g;
  g.max_new_tokens = 8;
  g.pad_token_id = kPad;
  auto ref = generate(model, p.ids, p.mask, p.pixels, g);  // greedy, never stops early
  CHECK(torch::equal(ref.truncated, torch::ones({3}, torch::kBool)));
  CHECK(torch::equal(ref.finish_reason,
                     torch::full({3}, static_cast<int64_t>(FinishReason::kLength), torch::kInt64)));

  // Stop on row 0's tokens 2..3: each row must end right after its first occurrence.
  const auto row0 = row_of(ref.sequences, 0);
  const std::vector<int64_t> stop = {row0[2], row0[3]};
  g.stop_token_sequences = {stop, {999}};  // an id never generated is harmless
  auto out = generate(model, p.ids, p.mask, p.pixels, g);
  for (int64_t i = 0; i < 3; ++i) {
    INFO("row " << i);
    const auto full = row_of(ref.sequences, i);
    const int64_t len = first_end_of(full, stop);
    const bool stopped = len < static_cast<int64_t>(full.size()) ||
                         std::equal(stop.begin(), stop.end(), full.end() - 2);
    CHECK(out.lengths[i].item<int64_t>() == len);
    CHECK(torch::equal(out.sequences[i].narrow(0, 0, len), ref.sequences[i].narrow(0, 0, len)));
    CHECK(out.truncated[i].item<bool>() == !stopped);
    CHECK(out.finish_reason[i].item<int64_t>() ==
          static_cast<int64_t>(stopped ? FinishReason::kStop : FinishReason::kLength));
    const int64_t rest = out.sequences.size(1) - len;
    if (rest > 0) {
      CHECK((out.sequences[i].narrow(0, len, rest) == kPad).all().item<bool>());
      CHECK((out.logps[i].narrow(0, len, rest) == 0).all().item<bool>());
    }
  }
  CHECK(out.lengths[0].item<int64_t>() <= 4);  // row 0 holds the sequence by construction

  // A text-level check (a callback over each running row's ids) behaves the same way.
  const int64_t target = row_of(ref.sequences, 1)[1];
  int64_t calls = 0;
  g.stop_token_sequences.clear();
  g.stop_check = [&](const std::vector<int64_t>& ids) {
    ++calls;
    return ids.back() == target;
  };
  auto cb = generate(model, p.ids, p.mask, p.pixels, g);
  const int64_t len1 = first_end_of(row_of(ref.sequences, 1), {target});
  CHECK(cb.lengths[1].item<int64_t>() == len1);
  CHECK(cb.sequences[1][len1 - 1].item<int64_t>() == target);  // the stop token is kept
  CHECK(cb.finish_reason[1].item<int64_t>() == static_cast<int64_t>(FinishReason::kStop));
  CHECK(calls == cb.lengths.sum().item<int64_t>());  // once per running row and step

  // EOS wins when the same token is both EOS and a stop sequence.
  g.stop_check = nullptr;
  g.eos_token_ids = {row0[3]};
  g.stop_token_sequences = {{row0[3]}};
  auto both = generate(model, p.ids, p.mask, p.pixels, g);
  CHECK(both.finish_reason[0].item<int64_t>() == static_cast<int64_t>(FinishReason::kEos));
  CHECK_FALSE(both.truncated[0].item<bool>());

  g.stop_token_sequences = {{}};
  CHECK_THROWS_AS(generate(model, p.ids, p.mask, p.pixels, g), mmpost::Error);
  CHECK(std::string(finish_reason_name(FinishReason::kStop)) == "stop");
  CHECK(std::string(finish_reason_name(FinishReason::kLength)) == "length");
}

TEST_CASE("truncated marks rows that used the whole budget without EOS", "[unit][model]") {
  torch::manual_seed(3);
  Vlm model(tiny_config());
  auto p = mixed_prompts();
  GenerationConfig g;
  g.max_new_tokens = 5;
  auto ref = generate(model, p.ids, p.mask, p.pixels, g);
  // EOS = row 2's first token: row 2 ends at step 1; rows 0/1 only if they emit it too.
  const int64_t eos = ref.sequences[2][0].item<int64_t>();
  g.eos_token_ids = {eos};
  auto out = generate(model, p.ids, p.mask, p.pixels, g);
  CHECK(out.lengths[2].item<int64_t>() == 1);
  CHECK_FALSE(out.truncated[2].item<bool>());
  CHECK(out.finish_reason[2].item<int64_t>() == static_cast<int64_t>(FinishReason::kEos));
  for (int64_t i = 0; i < 2; ++i) {
    const auto full = row_of(ref.sequences, i);
    const bool has_eos = std::find(full.begin(), full.end(), eos) != full.end();
    CHECK(out.truncated[i].item<bool>() == !has_eos);
    CHECK(out.lengths[i].item<int64_t>() == first_end_of(full, {eos}));
  }
}

TEST_CASE("behaviour log-probs recorded at sampling time equal the training forward's at any "
          "temperature", "[unit][model]") {
  // Tracker kind: behaviour log-probs computed without the sampling temperature while the update
  // uses it (or the reverse) give importance ratios != 1 on policy. mmpost's convention: both
  // score the sampled token under the untempered model (temperature 1, no top-k/top-p), however
  // it was sampled; TRL's GRPOTrainer scores both under logits / temperature. Either agrees with
  // itself; this pins mmpost's, and that a temperature never enters one side only.
  torch::manual_seed(3);
  Vlm model(tiny_config());
  auto p = mixed_prompts();
  std::vector<mmpost::data::SftSample> samples(3);
  int64_t img = 0;
  for (int64_t i = 0; i < 3; ++i) {
    const auto row = row_of(p.ids, i);
    for (size_t t = 0; t < row.size(); ++t) {
      if (p.mask[i][t].item<int64_t>() == 1) samples[i].input_ids.push_back(row[t]);
    }
    samples[i].labels.assign(samples[i].input_ids.size(), -100);
    if (p.image_counts[i] > 0) samples[i].pixel_values = p.pixels.narrow(0, img, p.image_counts[i]);
    img += p.image_counts[i];
  }
  for (double temperature : {0.3, 1.0, 1.7}) {
    GenerationConfig g;
    g.max_new_tokens = 8;
    g.temperature = temperature;
    g.seed = 5;
    auto r = mmpost::train::sample_rollout(model, samples, {0, 1, 2}, /*G=*/2, g, kPad,
                                           torch::kCPU, torch::kFloat32);
    torch::NoGradGuard no_grad;
    auto fwd = mmpost::train::completion_forward(model, r, 0, r.P, /*keep_logits=*/true);
    INFO("temperature " << temperature);
    const double diff = ((fwd.logps - r.old_logps) * r.mask).abs().max().item<double>();
    CHECK(diff < 1e-5);  // KV-cache steps vs one teacher-forced pass: same values up to rounding
    // ... and they are the untempered log-probs, not log_softmax(logits / temperature).
    auto labels = r.completion.masked_fill(r.mask.eq(0), 0).unsqueeze(-1);
    auto tempered = (fwd.logits / temperature).log_softmax(-1).gather(-1, labels).squeeze(-1);
    const double to_tempered = ((tempered - r.old_logps) * r.mask).abs().max().item<double>();
    if (temperature != 1.0) CHECK(to_tempered > 1e-3);
  }
}

TEST_CASE("the image placeholder is never sampled, even from a near-uniform distribution",
          "[unit][model]") {
  // Tracker kind: a rollout policy emitting the image token, which the next forward would try to
  // splice an image into. At temperature 100 the 64 tokens are drawn almost uniformly: 6 rows x
  // 60 draws would hit token 63 about 5.6 times if it were not masked.
  torch::manual_seed(2);
  Vlm model(tiny_config());
  auto p = mixed_prompts();
  auto rep = repeat_interleave_batch(p.ids, p.mask, p.pixels, p.image_counts, 2);
  GenerationConfig g;
  g.max_new_tokens = 60;
  g.temperature = 100.0;
  g.seed = 4;
  auto out = generate(model, rep.input_ids, rep.attention_mask, rep.pixel_values, g);
  CHECK(out.sequences.size(1) == 60);
  CHECK(out.sequences.eq(kImage).sum().item<int64_t>() == 0);
  // The draws do reach the top of the vocabulary (ids 55-62 appear), so the absence is the mask.
  CHECK(out.sequences.ge(55).logical_and(out.sequences.lt(kImage)).sum().item<int64_t>() > 20);
}

}  // namespace unit_test_generation
