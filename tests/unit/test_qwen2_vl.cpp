// Qwen2-VL family pieces checked by hand (no transformers fixture needed beyond a config.json):
// M-RoPE positions on issue 14's example sequence, M-RoPE tables against 1-D rotary tables,
// Qwen2.5-VL's window layout, and config.json refusals that name the field.
#include "catch.h"
#include "test_util.h"

#include "mmpost/model/blocks.h"
#include "mmpost/model/qwen2_vl.h"

#include <cmath>
#include <filesystem>
#include <fstream>

namespace unit_test_qwen2_vl {

using namespace mmpost::model;

namespace {

const std::filesystem::path& kFixtures = mmpost::testing::kGoldenFixtures;
using mmpost::testing::read_json_file;

}  // namespace

TEST_CASE("M-RoPE positions on a hand-built sequence (issue 14 example)", "[unit][qwen2vl]") {
  // a b <vs> P P P P <ve> c with grid (1, 4, 4): 2x2 merge -> 4 placeholders on a 2x2 grid.
  const int64_t a = 10, b = 11, vs = 20, P = 30, ve = 21, c = 12;
  auto ids = torch::tensor({a, b, vs, P, P, P, P, ve, c}, torch::kInt64).view({1, -1});
  auto grid = torch::tensor({1, 4, 4}, torch::kInt64).view({1, 3});
  auto [pos, deltas] = mrope_position_ids(ids, grid, {}, P, 2);
  auto row = [&](int axis) {
    auto r = pos[axis][0].contiguous();
    return std::vector<int64_t>(r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + r.numel());
  };
  CHECK(row(0) == std::vector<int64_t>{0, 1, 2, 3, 3, 3, 3, 5, 6});
  CHECK(row(1) == std::vector<int64_t>{0, 1, 2, 3, 3, 4, 4, 5, 6});
  CHECK(row(2) == std::vector<int64_t>{0, 1, 2, 3, 4, 3, 4, 5, 6});
  CHECK(deltas.item<int64_t>() == -2);

  // Left padding: the same row shifted right by two pad tokens gets the same positions on its
  // real tokens and 0 on the pads; a non-square grid (1, 2, 6) advances text by max(1, 3) = 3.
  auto padded = torch::cat({torch::zeros({1, 2}, torch::kInt64), ids}, 1);
  auto mask = torch::cat({torch::zeros({1, 2}, torch::kInt64), torch::ones({1, 9}, torch::kInt64)}, 1);
  auto [pos2, deltas2] = mrope_position_ids(padded, grid, mask, P, 2);
  CHECK(torch::equal(pos2.narrow(2, 2, 9), pos));
  CHECK(pos2.narrow(2, 0, 2).abs().sum().item<int64_t>() == 0);
  CHECK(deltas2.item<int64_t>() == -2);
  auto wide = torch::tensor({a, vs, P, P, P, ve, c}, torch::kInt64).view({1, -1});
  auto [pos3, deltas3] =
      mrope_position_ids(wide, torch::tensor({1, 2, 6}, torch::kInt64).view({1, 3}), {}, P, 2);
  CHECK(pos3[2][0][4].item<int64_t>() == 2 + 2);  // third column
  CHECK(pos3[0][0][5].item<int64_t>() == 2 + 3);  // <ve> after max(1, 3)
  CHECK(deltas3.item<int64_t>() == 6 + 1 - 7);

  // Placeholder count disagreeing with the grid names the image.
  auto short_run = torch::tensor({a, vs, P, P, P, ve}, torch::kInt64).view({1, -1});
  CHECK_THROWS_WITH(mrope_position_ids(short_run, grid, {}, P, 2),
                    Catch::Contains("image 0 has grid (1, 4, 4) = 4 placeholder tokens"));
}

TEST_CASE("M-RoPE tables equal 1-D rotary tables when the three axes agree", "[unit][qwen2vl]") {
  auto p = torch::arange(7, torch::kInt64).view({1, 7});
  auto [c1, s1] = rope_cos_sin(p, 16, 1e6, torch::kFloat32);
  auto [c3, s3] = mrope_cos_sin(p.unsqueeze(0).expand({3, 1, 7}), 16, 1e6, {2, 3, 3},
                                torch::kFloat32);
  CHECK(torch::equal(c1, c3));
  CHECK(torch::equal(s1, s3));
  // Distinct axes: frequency i takes axis 0 for i < 2, axis 1 for 2 <= i < 5, axis 2 after.
  auto pos = torch::stack({torch::full({1, 1}, 1, torch::kInt64), torch::full({1, 1}, 2, torch::kInt64),
                           torch::full({1, 1}, 3, torch::kInt64)});
  auto [c, s] = mrope_cos_sin(pos, 16, 1e6, {2, 3, 3}, torch::kFloat32);
  for (int64_t i = 0; i < 8; ++i) {
    const double inv = 1.0 / std::pow(1e6, 2.0 * i / 16.0);
    const int64_t axis_pos = i < 2 ? 1 : i < 5 ? 2 : 3;
    CHECK(c[0][0][i].item<double>() == Approx(std::cos(axis_pos * inv)).margin(1e-6));
    CHECK(c[0][0][i + 8].item<double>() == Approx(std::cos(axis_pos * inv)).margin(1e-6));
  }
}

TEST_CASE("Qwen2.5-VL window index matches the reference layout", "[unit][qwen2vl]") {
  // Grid (1, 6, 8) with merge 2 -> 3x4 merged units; window_size 56 / 2 / 14 = 2 units per side:
  // windows (rows 0-1, cols 0-1), (0-1, 2-3), (2, 0-1), (2, 2-3) in that order.
  auto [index, cu] = vision_window_index({{1, 6, 8}}, 2, 56, 14);
  CHECK(index == std::vector<int64_t>{0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 10, 11});
  CHECK(cu == std::vector<int64_t>{0, 16, 32, 40, 48});
  // An exact multiple (2x2 units) gives one window; HF's extra padded window is empty and dropped.
  auto [index2, cu2] = vision_window_index({{1, 4, 4}}, 2, 56, 14);
  CHECK(index2 == std::vector<int64_t>{0, 1, 2, 3});
  CHECK(cu2 == std::vector<int64_t>{0, 16});
}

TEST_CASE("Qwen2-VL config refusals name the field", "[unit][qwen2vl]") {
  auto j = read_json_file(kFixtures / "qwen2_vl_tiny/config.json");
  auto bad = j;
  bad["text_config"]["rope_parameters"]["mrope_section"] = {2, 3, 4};
  CHECK_THROWS_WITH(qwen2_vl_config_from_json(bad), Catch::Contains("mrope_section"));
  bad = j;
  bad["vision_config"]["embed_dimm"] = 32;
  CHECK_THROWS_WITH(qwen2_vl_config_from_json(bad),
                    Catch::Contains("vision_config.embed_dimm: unknown key"));
  bad = j;
  bad["text_config"]["use_sliding_window"] = true;
  CHECK_THROWS_WITH(qwen2_vl_config_from_json(bad), Catch::Contains("use_sliding_window"));
  auto j25 = read_json_file(kFixtures / "qwen2_5_vl_tiny/config.json");
  bad = j25;
  bad["vision_config"]["fullatt_block_indexes"] = {1, 3};
  CHECK_THROWS_WITH(qwen2_vl_config_from_json(bad),
                    Catch::Contains("fullatt_block_indexes: 3 is out of range for depth 3"));
  bad = j;
  bad["vision_config"]["hidden_size"] = 48;
  CHECK_THROWS_WITH(qwen2_vl_config_from_json(bad), Catch::Contains("must equal text_config.hidden_size"));
}


TEST_CASE("a Qwen2-VL folder given to a LLaVA stage is refused with what works and what does not",
          "[unit][qwen2vl]") {
  auto j = read_json_file(kFixtures / "qwen2_5_vl_tiny/config.json");
  CHECK_THROWS_WITH(vlm_config_from_json(j),
                    Catch::Contains("model_type \"qwen2_5_vl\" is the Qwen2-VL family") &&
                        Catch::Contains("stages take LLaVA folders only so far"));
}

}  // namespace unit_test_qwen2_vl
