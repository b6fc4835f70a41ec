// data::Curriculum: none = every prompt once per pass, staged advancement by step and by pass rate,
// adaptive sampling near the target pass rate (with unseen difficulties first), the two pass-rate
// estimators, determinism from the seed, the JSON state round trip, and strict config parsing.
#include <algorithm>
#include <numeric>

#include "catch.h"
#include "mmpost/core/check.h"
#include "mmpost/data/curriculum.h"

namespace unit_test_curriculum {

using namespace mmpost;
using data::Curriculum;
using data::CurriculumConfig;

namespace {

// Prompts 0..5 have difficulty 2, 6..9 difficulty 3, 10..11 difficulty 4.
std::map<int64_t, std::vector<int64_t>> pools() {
  return data::group_by_difficulty({2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4});
}

int64_t difficulty_of(int64_t prompt) {
  return prompt < 6 ? 2 : prompt < 10 ? 3 : 4;
}

CurriculumConfig parse(const char* s) {
  return data::parse_curriculum_config(nlohmann::json::parse(s));
}

std::string usage_error(const char* s) {
  try {
    parse(s);
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::kUsage);
    return e.what();
  }
  FAIL("expected mmpost::Error");
  return "";
}

}  // namespace

TEST_CASE("curriculum none: each pass is a permutation of every prompt", "[unit][curriculum]") {
  Curriculum c(CurriculumConfig{}, pools(), /*seed=*/7);
  for (int pass = 0; pass < 3; ++pass) {
    auto b = c.next_batch(12);
    std::sort(b.begin(), b.end());
    std::vector<int64_t> all(12);
    std::iota(all.begin(), all.end(), 0);
    CHECK(b == all);
  }
  CHECK(c.step() == 3);
  CHECK(c.current_stage() == 0);
  // Passes are reshuffled: the first two passes are not in the same order.
  Curriculum d(CurriculumConfig{}, pools(), 7);
  CHECK(d.next_batch(12) != d.next_batch(12));
}

TEST_CASE("curriculum staged: advances at until_step", "[unit][curriculum]") {
  auto cfg = parse(R"({"mode": "staged", "stages": [{"difficulties": [2], "until_step": 2},
                                                     {"difficulties": [3, 4]}]})");
  Curriculum c(cfg, pools(), 1);
  for (int step = 0; step < 2; ++step)
    for (int64_t p : c.next_batch(4)) CHECK(difficulty_of(p) == 2);
  CHECK(c.current_stage() == 0);
  for (int step = 2; step < 5; ++step)
    for (int64_t p : c.next_batch(4)) CHECK(difficulty_of(p) != 2);
  CHECK(c.current_stage() == 1);  // the last stage never ends
}

TEST_CASE("curriculum staged: advances when the pass rate is reached", "[unit][curriculum]") {
  // ema_alpha 0.5, min_updates 2, min_pass_rate 0.8 on difficulty 2:
  //   update 1.0 -> rate 1.0 but only 1 update; update 0.5 -> 0.5*1 + 0.5*0.5 = 0.75 < 0.8;
  //   update 1.0 -> 0.5*0.75 + 0.5*1 = 0.875 >= 0.8 -> the next batch comes from stage 1.
  auto cfg = parse(R"({"mode": "staged", "ema_alpha": 0.5, "min_updates": 2,
                       "stages": [{"difficulties": [2], "min_pass_rate": 0.8}, {"difficulties": [3]}]})");
  Curriculum c(cfg, pools(), 1);
  c.next_batch(2);
  c.update(2, 1.0);
  c.next_batch(2);
  CHECK(c.current_stage() == 0);
  c.update(2, 0.5);
  c.next_batch(2);
  CHECK(c.current_stage() == 0);
  CHECK(c.pass_rates().at(2) == Approx(0.75));
  c.update(2, 1.0);
  CHECK(c.pass_rates().at(2) == Approx(0.875));
  auto b = c.next_batch(3);
  CHECK(c.current_stage() == 1);
  for (int64_t p : b) CHECK(difficulty_of(p) == 3);
}

TEST_CASE("curriculum pass-rate estimators: ema and window", "[unit][curriculum]") {
  // ema, alpha 0.5: 1 -> 1; 0 -> 0.5; 0 -> 0.25.  window 2: mean of the last two = 0.
  Curriculum ema(parse(R"({"ema_alpha": 0.5})"), pools(), 0);
  Curriculum win(parse(R"({"estimator": "window", "window": 2})"), pools(), 0);
  for (double x : {1.0, 0.0, 0.0}) {
    ema.update(3, x);
    win.update(3, x);
  }
  CHECK(ema.pass_rates().at(3) == Approx(0.25));
  CHECK(win.pass_rates().at(3) == 0.0);
  CHECK(win.update_counts().at(3) == 3);
  CHECK(ema.pass_rates().count(2) == 0);
  CHECK_THROWS_AS(ema.update(5, 0.5), Error);  // no prompt has difficulty 5
  CHECK_THROWS_AS(ema.update(2, 1.5), Error);
}

TEST_CASE("curriculum adaptive: unseen first, then the difficulty nearest the target",
          "[unit][curriculum]") {
  auto cfg = parse(R"({"mode": "adaptive", "min_updates": 1, "temperature": 0})");
  Curriculum c(cfg, pools(), 3);
  c.update(2, 0.9);
  // Difficulties 3 and 4 have no outcome yet: they get every slot.
  for (int64_t p : c.next_batch(8)) CHECK(difficulty_of(p) != 2);
  c.update(3, 0.55);
  c.update(4, 0.1);
  // |0.9 - 0.5| = 0.4, |0.55 - 0.5| = 0.05, |0.1 - 0.5| = 0.4: temperature 0 -> always 3.
  for (int64_t p : c.next_batch(8)) CHECK(difficulty_of(p) == 3);

  // Temperature 0.05: weights exp(-(0.4 - 0.05) / 0.05) = e^-7 for 2 and 4, 1 for 3, so
  // P(3) = 1 / (1 + 2 e^-7) = 0.998; of 400 draws nearly all (>= 390) are difficulty 3.
  auto soft = parse(R"({"mode": "adaptive", "min_updates": 1, "temperature": 0.05})");
  Curriculum s(soft, pools(), 3);
  s.update(2, 0.9);
  s.update(3, 0.55);
  s.update(4, 0.1);
  int n3 = 0;
  for (int64_t p : s.next_batch(400)) n3 += difficulty_of(p) == 3;
  CHECK(n3 >= 390);
  // A flat softmax (large temperature) spreads out: all three difficulties appear.
  auto flat = parse(R"({"mode": "adaptive", "min_updates": 1, "temperature": 100})");
  Curriculum f(flat, pools(), 3);
  f.update(2, 0.9);
  f.update(3, 0.55);
  f.update(4, 0.1);
  std::map<int64_t, int> seen;
  for (int64_t p : f.next_batch(60)) ++seen[difficulty_of(p)];
  CHECK(seen.size() == 3);
}

TEST_CASE("curriculum is deterministic from the seed", "[unit][curriculum]") {
  auto cfg = parse(R"({"mode": "adaptive", "min_updates": 1, "temperature": 0.3})");
  Curriculum a(cfg, pools(), 42), b(cfg, pools(), 42), other(cfg, pools(), 43);
  std::vector<int64_t> ba, bb, bo;
  for (int step = 0; step < 6; ++step) {
    auto x = a.next_batch(5), y = b.next_batch(5), z = other.next_batch(5);
    ba.insert(ba.end(), x.begin(), x.end());
    bb.insert(bb.end(), y.begin(), y.end());
    bo.insert(bo.end(), z.begin(), z.end());
    for (auto* c : {&a, &b, &other})
      for (int64_t d : {2, 3, 4}) c->update(d, d == 3 ? 0.5 : 0.2 * step / 5.0);
  }
  CHECK(ba == bb);
  CHECK(ba != bo);
}

TEST_CASE("curriculum state round-trips through JSON text", "[unit][curriculum]") {
  for (const char* s :
       {R"({"mode": "adaptive", "min_updates": 2, "estimator": "window", "window": 3})",
        R"({"mode": "staged", "stages": [{"difficulties": [2], "until_step": 3},
                                                         {"difficulties": [2, 3, 4]}]})",
        R"({})"}) {
    INFO(s);
    auto cfg = parse(s);
    Curriculum a(cfg, pools(), 11);
    for (int step = 0; step < 4; ++step) {
      for (int64_t p : a.next_batch(5)) a.update(difficulty_of(p), (p % 3) / 2.0);
    }
    const std::string text = a.state().dump();
    Curriculum b(cfg, pools(), /*seed=*/999);  // the state's seed wins
    b.load_state(nlohmann::json::parse(text));
    CHECK(b.step() == a.step());
    CHECK(b.current_stage() == a.current_stage());
    CHECK(b.pass_rates() == a.pass_rates());
    for (int step = 0; step < 5; ++step) {
      auto x = a.next_batch(7), y = b.next_batch(7);
      CHECK(x == y);
      for (int64_t p : x) {
        a.update(difficulty_of(p), 0.25);
        b.update(difficulty_of(p), 0.25);
      }
    }
    CHECK(b.state() == a.state());
  }
  Curriculum none(CurriculumConfig{}, pools(), 1);
  auto staged = parse(R"({"mode": "staged", "stages": [{"difficulties": [2]}]})");
  Curriculum st(staged, pools(), 1);
  CHECK_THROWS_AS(st.load_state(none.state()), Error);  // mode mismatch
  CHECK_THROWS_AS(st.load_state(nlohmann::json{{"version", 1}}), Error);
}

TEST_CASE("curriculum config parsing is strict", "[unit][curriculum]") {
  auto cfg = parse(R"({"mode": "staged", "stages": [{"difficulties": [2, 3], "until_step": 50},
                                                      {"difficulties": [3], "min_pass_rate": 0.6}]})");
  CHECK(cfg.mode == data::CurriculumMode::kStaged);
  REQUIRE(cfg.stages.size() == 2);
  CHECK(cfg.stages[0].difficulties == std::vector<int64_t>{2, 3});
  CHECK(cfg.stages[1].min_pass_rate == 0.6);
  CHECK(cfg.target_pass_rate == 0.5);

  CHECK_THAT(usage_error(R"({"mode": "easy"})"),
             HasSubstr("curriculum.mode: unknown curriculum mode 'easy'"));
  CHECK_THAT(usage_error(R"({"target": 0.5})"), HasSubstr("curriculum.target: unknown key"));
  CHECK_THAT(usage_error(R"({"mode": "staged"})"), HasSubstr("needs at least one stage"));
  CHECK_THAT(usage_error(
                 R"({"mode": "staged", "stages": [{"difficulties": [2]}, {"difficulties": [3]}]})"),
             HasSubstr("curriculum.stages[0]: never ends"));
  CHECK_THAT(usage_error(R"({"mode": "staged", "stages": [{"difficulties": [2], "until": 3}]})"),
             HasSubstr("curriculum.stages[0].until: unknown key"));
  CHECK_THAT(usage_error(R"({"mode": "adaptive", "stages": [{"difficulties": [2]}]})"),
             HasSubstr("only mode staged reads stages"));
  CHECK_THAT(usage_error(R"({"estimator": "median"})"), HasSubstr("unknown estimator 'median'"));
  CHECK_THAT(usage_error(R"({"window": 1.5})"),
             HasSubstr("curriculum.window: expected an integer"));
  // A stage naming a difficulty the data lacks fails when the curriculum is built.
  auto bad = parse(R"({"mode": "staged", "stages": [{"difficulties": [7]}]})");
  try {
    Curriculum c(bad, pools(), 0);
    FAIL("expected mmpost::Error");
  } catch (const Error& e) {
    CHECK_THAT(std::string(e.what()),
               HasSubstr("curriculum.stages[0].difficulties: no prompt has difficulty 7"));
    CHECK_THAT(std::string(e.what()), HasSubstr("the data has difficulties 2, 3, 4"));
  }
}

}  // namespace unit_test_curriculum
