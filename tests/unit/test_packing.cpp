// Packing (data.packing): best-fit-decreasing rows with samples numbered in the attention mask,
// the block-diagonal causal mask it gives, per-sample positions (1-D and M-RoPE), and the SFT
// loss of a packed batch equal to the unpacked one.
#include "catch.h"
#include "test_util.h"

#include "mmpost/algo/sft_loss.h"
#include "mmpost/data/collate.h"
#include "mmpost/model/blocks.h"
#include "mmpost/model/vlm.h"

namespace unit_test_packing {

using namespace mmpost;

namespace {
std::vector<int64_t> row_of(const torch::Tensor& t) {
  auto c = t.contiguous().to(torch::kInt64);
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

// A sample of `n` tokens with ids base, base+1, ..., labels = ids on its second half.
data::SftSample sample(int64_t base, int64_t n) {
  data::SftSample s;
  s.id = std::to_string(base);
  for (int64_t i = 0; i < n; ++i) {
    s.input_ids.push_back(base + i);
    s.labels.push_back(i >= n / 2 ? base + i : -100);
  }
  return s;
}
}  // namespace

TEST_CASE("collate_packed: best-fit decreasing rows, samples numbered, first labels ignored",
          "[unit][packing]") {
  // Lengths 2, 5, 3, 4 into rows of 8: 5 opens row 0, 4 opens row 1 (3 left in row 0), 3 goes
  // to row 0 (least room that fits: 3 < 4), 2 to row 1. Placement order: s1, s2, s3, s0.
  std::vector<data::SftSample> s = {sample(10, 2), sample(20, 5), sample(30, 3), sample(40, 4)};
  s[0].pixel_values = torch::zeros({1, 3, 2, 2});
  s[2].pixel_values = torch::full({1, 3, 2, 2}, 2.0);
  auto b = data::collate_packed(s, /*pad_id=*/0, /*capacity=*/8);
  REQUIRE(b.input_ids.sizes() == torch::IntArrayRef({2, 8}));
  CHECK(row_of(b.input_ids[0]) == std::vector<int64_t>{20, 21, 22, 23, 24, 30, 31, 32});
  CHECK(row_of(b.input_ids[1]) == std::vector<int64_t>{40, 41, 42, 43, 10, 11, 0, 0});
  CHECK(row_of(b.attention_mask[0]) == std::vector<int64_t>{1, 1, 1, 1, 1, 2, 2, 2});
  CHECK(row_of(b.attention_mask[1]) == std::vector<int64_t>{1, 1, 1, 1, 2, 2, 0, 0});
  // Second halves supervised; each sample's first label dropped (never a target unpacked).
  CHECK(row_of(b.labels[0]) == std::vector<int64_t>{-100, -100, 22, 23, 24, -100, 31, 32});
  CHECK(row_of(b.labels[1]) == std::vector<int64_t>{-100, -100, 42, 43, -100, 11, -100, -100});
  CHECK(b.n_tokens == 14);
  CHECK(b.ids == std::vector<std::string>{"20", "30", "40", "10"});
  // Images follow the packed order: s2's before s0's.
  REQUIRE(b.pixel_values.size(0) == 2);
  CHECK(b.pixel_values[0].mean().item<double>() == 2.0);
  CHECK(b.pixel_values[1].mean().item<double>() == 0.0);
  // Same targets as unpacked.
  auto plain = data::collate(s, 0);
  CHECK(algo::n_supervised_targets(b.labels) == algo::n_supervised_targets(plain.labels));
  // A sample longer than the capacity gets a row of its own length.
  auto wide = data::collate_packed({sample(1, 3), sample(50, 9)}, 0, 8);
  CHECK(wide.input_ids.sizes() == torch::IntArrayRef({2, 9}));
  CHECK_THROWS(data::collate_packed({}, 0, 8));
}

TEST_CASE("causal_bias: numbered samples give a block-diagonal causal mask", "[unit][packing]") {
  auto mask = torch::tensor({1, 1, 2, 2, 2, 0}, torch::kInt64).view({1, 6});
  auto allowed = model::causal_bias(mask, 6, torch::kFloat32)[0][0].eq(0).to(torch::kInt64);
  const std::vector<std::vector<int64_t>> want = {
      {1, 0, 0, 0, 0, 0}, {1, 1, 0, 0, 0, 0}, {0, 0, 1, 0, 0, 0},
      {0, 0, 1, 1, 0, 0}, {0, 0, 1, 1, 1, 0},
      {1, 1, 1, 1, 1, 0}};  // a padding query keeps the plain causal + padding rule
  for (int64_t q = 0; q < 6; ++q) {
    INFO("query " << q);
    CHECK(row_of(allowed[q]) == want[q]);
  }
  // A 0/1 mask is unchanged: causal + padding.
  auto plain = torch::tensor({0, 1, 1}, torch::kInt64).view({1, 3});
  auto a2 = model::causal_bias(plain, 3, torch::kFloat32)[0][0].eq(0).to(torch::kInt64);
  CHECK(row_of(a2.reshape({-1})) == std::vector<int64_t>{0, 0, 0, 0, 1, 0, 0, 1, 1});
}

TEST_CASE("packed_position_ids restart per sample, M-RoPE per sample for Qwen2-VL",
          "[unit][packing]") {
  model::Vlm llava(mmpost::testing::tiny_llava_config());
  auto ids = torch::zeros({1, 6}, torch::kInt64);
  auto mask = torch::tensor({1, 1, 1, 2, 2, 0}, torch::kInt64).view({1, 6});
  CHECK(row_of(model::packed_position_ids(*llava, ids, mask, {})[0]) ==
        std::vector<int64_t>{0, 1, 2, 0, 1, 0});

  // The hand-built example (a b <vs> P P P P <ve> c, grid (1, 4, 4)) packed after a
  // two-token text sample keeps its positions: t 0 1 2 3 3 3 3 5 6, h 0 1 2 3 3 4 4 5 6,
  // w 0 1 2 3 4 3 4 5 6.
  auto cj = mmpost::testing::read_json_file(mmpost::testing::kGoldenFixtures /
                                            "qwen2_vl_tiny/config.json");
  model::Vlm qwen(model::build_qwen2_vl(model::qwen2_vl_config_from_json(cj)));
  const int64_t P = qwen->config().image_token_index;
  const int64_t a = 10, b = 11, vs = 20, ve = 21, c = 12;
  auto packed = torch::tensor(std::vector<int64_t>{5, 6, a, b, vs, P, P, P, P, ve, c}).view({1, -1});
  auto segs = torch::tensor({1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2}, torch::kInt64).view({1, -1});
  auto grid = torch::tensor({1, 4, 4}, torch::kInt64).view({1, 3});
  auto pos = model::packed_position_ids(*qwen, packed, segs, grid);
  REQUIRE(pos.sizes() == torch::IntArrayRef({3, 1, 11}));
  CHECK(row_of(pos[0][0]) == std::vector<int64_t>{0, 1, 0, 1, 2, 3, 3, 3, 3, 5, 6});
  CHECK(row_of(pos[1][0]) == std::vector<int64_t>{0, 1, 0, 1, 2, 3, 3, 4, 4, 5, 6});
  CHECK(row_of(pos[2][0]) == std::vector<int64_t>{0, 1, 0, 1, 2, 3, 4, 3, 4, 5, 6});
  // Image tokens no grid covers are a data error, not a silent fallback to 1-D positions.
  CHECK_THROWS_WITH(model::packed_position_ids(*qwen, packed, segs, {}),
                    Catch::Contains("grids do not cover"));
}

TEST_CASE("a packed batch gives the unpacked SFT loss and gradients (LLaVA)", "[unit][packing]") {
  torch::manual_seed(4);
  auto cfg = mmpost::testing::tiny_llava_config();
  model::Vlm m(cfg);
  const int64_t P = cfg.n_image_tokens(), img = cfg.image_token_index;
  // Mixed lengths, some with an image (P tokens after a one-token prefix), some text only.
  std::vector<data::SftSample> s;
  for (int64_t i = 0; i < 6; ++i) {
    const bool with_image = i % 2 == 0;
    const int64_t n_text = 3 + 5 * i;
    data::SftSample x;
    x.input_ids.push_back(1);
    if (with_image) x.input_ids.insert(x.input_ids.end(), P, img);
    for (int64_t k = 0; k < n_text; ++k) x.input_ids.push_back(2 + (7 * i + 3 * k) % 60);
    x.labels.assign(x.input_ids.size(), -100);
    for (size_t k = x.input_ids.size() - n_text / 2; k < x.input_ids.size(); ++k) {
      x.labels[k] = x.input_ids[k];
    }
    if (with_image) x.pixel_values = torch::randn({1, 3, 32, 32});
    s.push_back(x);
  }
  auto loss_and_grad = [&](const data::Batch& b) {
    m->zero_grad();
    auto loss = algo::sft_loss_sum(
        m->forward(b.input_ids, b.pixel_values, b.attention_mask, nullptr, b.position_ids),
        b.labels);
    loss.backward();
    auto g = m->language_model->model->embed_tokens->weight.grad().clone();
    return std::make_pair(loss.item<double>(), g);
  };
  auto plain = data::collate(s, 0);
  auto packed = data::collate_packed(s, 0, /*capacity=*/48);
  packed.position_ids =
      model::packed_position_ids(*m, packed.input_ids, packed.attention_mask, {});
  CHECK(packed.input_ids.size(0) < plain.input_ids.size(0));
  const double pad_before = 1.0 - plain.n_tokens / static_cast<double>(plain.input_ids.numel());
  const double pad_after = 1.0 - packed.n_tokens / static_cast<double>(packed.input_ids.numel());
  CHECK(pad_after < pad_before);
  auto [l0, g0] = loss_and_grad(plain);
  auto [l1, g1] = loss_and_grad(packed);
  CHECK(l1 == Approx(l0).epsilon(1e-5));
  CHECK((g1 - g0).abs().max().item<double>() <= 1e-5 * (1.0 + g0.abs().max().item<double>()));
  // Without the per-sample mask and positions the loss differs: the test can fail.
  auto leaky = packed;
  leaky.attention_mask = packed.attention_mask.ne(0).to(torch::kInt64);
  leaky.position_ids = torch::Tensor();
  torch::NoGradGuard ng;
  auto l2 = algo::sft_loss_sum(m->forward(leaky.input_ids, leaky.pixel_values,
                                          leaky.attention_mask), leaky.labels).item<double>();
  CHECK(std::abs(l2 - l0) > 1e-3);
}

}  // namespace unit_test_packing
