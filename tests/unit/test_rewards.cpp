// algo rewards: each verifier on its edge cases (numbers, unicode digits, <answer> extraction,
// choice letters, the format regex, DAPO's overlong penalty), the external command scorer, strict
// spec parsing and score_all's weighted total.
#include <cmath>
#include <regex>

#include "catch.h"
#include "mmpost/algo/rewards.h"
#include "mmpost/core/check.h"

namespace unit_test_rewards {

using namespace mmpost;
using algo::RewardKind;

namespace {

nlohmann::json J(const char* s) {
  return nlohmann::json::parse(s);
}

/// The message of the Error(kind) that `f` throws (fails the test if it does not throw one).
template <class F>
std::string error_of(F f, ErrorKind kind = ErrorKind::kUsage) {
  try {
    f();
  } catch (const Error& e) {
    CHECK(e.kind() == kind);
    return e.what();
  }
  FAIL("expected mmpost::Error");
  return "";
}

}  // namespace

TEST_CASE("rewards: <answer> extraction and whitespace", "[unit][rewards]") {
  CHECK(algo::extract_answer("<think>x</think><answer> 12 </answer>") == " 12 ");
  // The last complete pair wins; an unclosed tag does not count.
  CHECK(algo::extract_answer("<answer>1</answer> no, <answer>2</answer> <answer>3") == "2");
  CHECK_FALSE(algo::extract_answer("<answer>5").has_value());
  CHECK_FALSE(algo::extract_answer("just 5").has_value());
  CHECK(algo::normalize_whitespace("  a \t\n b  c\n") == "a b c");
}

TEST_CASE("rewards: exact_match", "[unit][rewards]") {
  CHECK(algo::exact_match("  New   York\n", "New York") == 1.0f);
  CHECK(algo::exact_match("<think>hmm</think><answer> 12</answer>", "12") == 1.0f);
  CHECK(algo::exact_match("<think>12</think><answer>13</answer>", "12") == 0.0f);
  CHECK(algo::exact_match("new york", "New York") == 0.0f);  // case-sensitive
  CHECK(algo::exact_match("12.", "12") == 0.0f);
}

TEST_CASE("rewards: parse_last_number", "[unit][rewards]") {
  CHECK_FALSE(algo::parse_last_number("no digits here").has_value());
  CHECK(*algo::parse_last_number("3 apples and 5 pears") == 5.0);  // last wins
  CHECK(*algo::parse_last_number("it is -7.") == -7.0);
  CHECK(*algo::parse_last_number("x=-3") == -3.0);
  CHECK(*algo::parse_last_number("5-3") == 3.0);  // binary minus, not a sign
  CHECK(*algo::parse_last_number("pi is 3.25") == 3.25);
  CHECK(*algo::parse_last_number("about .5") == 0.5);
  CHECK(*algo::parse_last_number("total 1,234,567 items") == 1234567.0);
  CHECK(*algo::parse_last_number("1,2") == 2.0);          // a list, not 1.2 or 12
  CHECK(*algo::parse_last_number("12345,678") == 678.0);  // no 5-digit lead group
  CHECK(*algo::parse_last_number("1.5e3") == 1500.0);
  CHECK(*algo::parse_last_number("2E-2") == Approx(0.02));
  CHECK(*algo::parse_last_number("3 eggs") == 3.0);
}

TEST_CASE("rewards: unicode digits normalize to ASCII", "[unit][rewards]") {
  // Arabic-Indic ٣ (U+0663), ١٢ (U+0661 U+0662); fullwidth ３ (U+FF13); Devanagari ४ (U+096A);
  // Thai ๗ (U+0E57); minus sign U+2212; Arabic decimal separator U+066B.
  CHECK(algo::normalize_digits("\u0663") == "3");
  CHECK(algo::normalize_digits("a\uFF13b\u096A\u0E57") == "a3b47");
  CHECK(algo::normalize_digits("\u2212\u0661\u0662\u066B\u0665") == "-12.5");
  CHECK(algo::normalize_digits("caf\u00e9 \xff") ==
        "caf\u00e9 \xff");  // other text, bad UTF-8 kept
  CHECK(*algo::parse_last_number("answer: \uFF11\uFF12") == 12.0);
  CHECK(algo::numeric_match("<answer>\u0661\u0662</answer>", "12") == 1.0f);
}

TEST_CASE("rewards: numeric_match", "[unit][rewards]") {
  CHECK(algo::numeric_match("The sum is 12.", "12") == 1.0f);
  CHECK(algo::numeric_match("7 + 5 = 12", "12") == 1.0f);
  CHECK(algo::numeric_match("12 or maybe 13", "12") == 0.0f);  // last number counts
  CHECK(algo::numeric_match("no idea", "12") == 0.0f);
  CHECK(algo::numeric_match("12.0", "12") == 1.0f);
  CHECK(algo::numeric_match("1,000", "1000") == 1.0f);
  // <answer> wins over numbers elsewhere.
  CHECK(algo::numeric_match("<think>5+8=13</think><answer>12</answer>", "12") == 1.0f);
  CHECK(algo::numeric_match("<think>5+7=12</think><answer>13</answer>", "12") == 0.0f);
  // Tolerance: |pred - ref| <= max(abs_tol, rel_tol * |ref|).
  CHECK(algo::numeric_match("3.14", "3.14159", 0.01) == 1.0f);
  CHECK(algo::numeric_match("3.14", "3.14159") == 0.0f);
  CHECK(algo::numeric_match("105", "100", 0.0, 0.05) == 1.0f);
  CHECK(algo::numeric_match("106", "100", 0.0, 0.05) == 0.0f);
  CHECK_THAT(error_of([] { algo::numeric_match("1", "n/a"); }, ErrorKind::kData),
             HasSubstr("holds no number"));
}

TEST_CASE("rewards: choice letters", "[unit][rewards]") {
  CHECK(algo::extract_choice("(B)") == 'B');
  CHECK(algo::extract_choice("B.") == 'B');
  CHECK(algo::extract_choice(" c ") == 'C');
  CHECK(algo::extract_choice("answer: b") == 'B');
  CHECK(algo::extract_choice("The answer is C") == 'C');
  CHECK(algo::extract_choice("I first thought A. The answer is (D).") == 'D');
  CHECK(algo::extract_choice("B) because the other options are wrong") == 'B');
  CHECK(algo::extract_choice("Options (A) and (C) differ; (C) fits") == 'C');
  CHECK_FALSE(algo::extract_choice("A cat sat").has_value());  // article, not an option
  CHECK_FALSE(algo::extract_choice("The answer is Cat").has_value());
  CHECK_FALSE(algo::extract_choice("(E)").has_value());  // not in ABCD
  CHECK(algo::extract_choice("(E)", "ABCDE") == 'E');
  CHECK(algo::choice_match("<think>..</think><answer>(b)</answer>", "B") == 1.0f);
  CHECK(algo::choice_match("The answer is C", "(B)") == 0.0f);
  CHECK(algo::choice_match("nothing", "A") == 0.0f);
}

TEST_CASE("rewards: format regex", "[unit][rewards]") {
  CHECK(algo::format_reward("<think>7+5=12</think><answer>12</answer>") == 1.0f);
  CHECK(algo::format_reward("<think>a\nb</think>\n <answer>1\n2</answer>") == 1.0f);
  CHECK(algo::format_reward("<think></think><answer></answer>") == 1.0f);
  CHECK(algo::format_reward("<think>7+5=12<answer>12</answer>") == 0.0f);      // missing </think>
  CHECK(algo::format_reward("<think>x</think><answer>12</answer>.") == 0.0f);  // trailing text
  CHECK(algo::format_reward(" <think>x</think><answer>12</answer>") == 0.0f);  // leading space
  CHECK(algo::format_reward("<think>x</think> so <answer>12</answer>") == 0.0f);
  CHECK(algo::format_reward("<answer>12</answer>") == 0.0f);
  CHECK(algo::format_reward("12", R"(^\d+$)") == 1.0f);
  CHECK(algo::format_reward("12a", R"(^\d+$)") == 0.0f);
  // The hand matcher of the default pattern agrees with std::regex on tricky inputs.
  const std::regex re(algo::kDefaultFormatPattern, std::regex::ECMAScript);
  for (const char* s : {"<think>a</think>b</think><answer>c</answer>", "<think></think><answer>",
                        "<think></think><answer></answer></answer>", "<think></think>\t<answer>x",
                        "<think>a</think><answer></think><answer>b</answer>", "<think></answer>",
                        "<think>x</think> <answer>1</answer>\n"}) {
    INFO(s);
    CHECK((algo::format_reward(s) == 1.0f) == std::regex_match(std::string(s), re));
  }
  // Long completions do not overflow the stack.
  CHECK(algo::format_reward("<think>" + std::string(200000, 'x') + "</think><answer>1</answer>") ==
        1.0f);
}

TEST_CASE("rewards: DAPO overlong penalty at its boundaries", "[unit][rewards]") {
  // L_max = 100, L_cache = 20: 0 up to 80 tokens, (80 - n) / 20 on (80, 100], -1 beyond.
  CHECK(algo::overlong_penalty(0, 100, 20) == 0.0f);
  CHECK(algo::overlong_penalty(80, 100, 20) == 0.0f);
  CHECK(algo::overlong_penalty(81, 100, 20) == Approx(-0.05));
  CHECK(algo::overlong_penalty(90, 100, 20) == Approx(-0.5));
  CHECK(algo::overlong_penalty(100, 100, 20) == Approx(-1.0));
  CHECK(algo::overlong_penalty(101, 100, 20) == -1.0f);
  CHECK(algo::overlong_penalty(5, 10, 10) == Approx(-0.5));  // cache = max: linear from 0
  CHECK_THROWS_AS(algo::overlong_penalty(5, 10, 11), Error);
}

TEST_CASE("rewards: external scorer", "[unit][rewards]") {
  std::vector<algo::ExternalItem> items = {
      {"0", "p", "a", "1"}, {"1", "p", "bb", "2"}, {"2", "p", "c", "3"}};
  auto v = algo::external_scores("awk '{print 0.5}'", items);
  REQUIRE(v.size() == 3);
  CHECK(v[0] == 0.5f);
  CHECK(v[2] == 0.5f);
  // The scorer sees one JSON object per line with id, prompt, completion, reference.
  v = algo::external_scores(
      R"sh(sed -n 's/.*"completion":"\([a-z]*\)".*"reference":"\([0-9]\)".*/\2/p')sh", items);
  CHECK(v == std::vector<float>{1.0f, 2.0f, 3.0f});
  // 4 MB in, 120 kB out: both far beyond a 64 kB pipe buffer, and no deadlock.
  std::vector<algo::ExternalItem> many(20000, {"x", "p", std::string(200, 'z'), "r"});
  CHECK(algo::external_scores("awk '{print 0.125}'", many).size() == 20000);

  CHECK_THAT(error_of([&] { algo::external_scores("cat > /dev/null; exit 3", items); },
                      ErrorKind::kRuntime),
             HasSubstr("`cat > /dev/null; exit 3`: exited with status 3"));
  CHECK_THAT(error_of([&] { algo::external_scores("echo 1; echo 2", items); }, ErrorKind::kRuntime),
             HasSubstr("printed 2 lines for 3 completions"));
  CHECK_THAT(error_of([&] { algo::external_scores("printf '1\\nnan?\\n3\\n'", items); },
                      ErrorKind::kRuntime),
             HasSubstr("stdout line 2 is 'nan?'"));
  CHECK_THAT(error_of([&] { algo::external_scores("sleep 5", items, 0.2); }, ErrorKind::kRuntime),
             HasSubstr("no result after 0.2 s"));
  // A command that ignores its stdin is fine (the input is a file, not a pipe it must drain).
  CHECK(algo::external_scores("printf '1\\n2\\n3\\n'", items) == std::vector<float>{1, 2, 3});
}

TEST_CASE("rewards: spec parsing is strict", "[unit][rewards]") {
  auto specs = algo::parse_reward_specs(J(R"([
      {"name": "numeric_match", "weight": 1.0, "params": {"abs_tol": 0.5}},
      {"name": "format", "weight": 0.25},
      {"name": "length_penalty", "params": {"max_len": 64, "cache_len": 16}}])"));
  REQUIRE(specs.size() == 3);
  CHECK(specs[0].kind == RewardKind::kNumericMatch);
  CHECK(specs[0].p.abs_tol == 0.5);
  CHECK(specs[1].p.pattern == algo::kDefaultFormatPattern);
  CHECK(specs[1].weight == 0.25);
  CHECK(specs[2].weight == 1.0);
  CHECK(specs[2].p.cache_len == 16);

  auto msg = error_of([] { algo::parse_reward_specs(J(R"([{"name": "acc"}])")); });
  CHECK_THAT(msg, HasSubstr("rewards[0].name: unknown reward 'acc'"));
  CHECK_THAT(
      msg, HasSubstr("exact_match, numeric_match, choice_match, format, length_penalty, external"));
  msg = error_of([] {
    algo::parse_reward_specs(J(R"([{"name": "format"}, {"name": "numeric_match",
                                                     "params": {"tol": 1}}])"));
  });
  CHECK_THAT(msg, HasSubstr("rewards[1].params.tol: unknown param"));
  CHECK_THAT(msg, HasSubstr("valid params: abs_tol, rel_tol"));
  CHECK_THAT(error_of([] { algo::parse_reward_specs(J(R"([{"name": "format", "wieght": 1}])")); }),
             HasSubstr("rewards[0].wieght: unknown key"));
  CHECK_THAT(error_of([] {
               algo::parse_reward_specs(J(R"([{"name": "format", "params": {"pattern": "(["}}])"));
             }),
             HasSubstr("rewards[0].params.pattern: not a valid ECMAScript regex"));
  CHECK_THAT(error_of([] { algo::parse_reward_specs(J(R"([{"name": "external"}])")); }),
             HasSubstr("rewards[0].params.command: required"));
  CHECK_THAT(error_of([] {
               algo::parse_reward_specs(J(R"([{"name": "length_penalty",
                                                        "params": {"max_len": 8, "cache_len": 9}}])"));
             }),
             HasSubstr("rewards[0].params.cache_len: must be in [1, max_len]"));
  CHECK_THAT(error_of([] {
               algo::parse_reward_specs(J(R"([{"name": "numeric_match", "weight": "1"}])"));
             }),
             HasSubstr("rewards[0].weight: expected a finite number"));
  CHECK_THAT(error_of([] { algo::parse_reward_specs(J("[]")); }), HasSubstr("non-empty array"));
  CHECK_THAT(error_of([] { algo::parse_reward_kind("f1"); }),
             HasSubstr("valid names: exact_match"));
}

TEST_CASE("rewards: score_all returns each function and the weighted total", "[unit][rewards]") {
  auto specs = algo::parse_reward_specs(J(R"([
      {"name": "numeric_match", "weight": 1.0},
      {"name": "format", "weight": 0.5},
      {"name": "length_penalty", "weight": 2.0, "params": {"max_len": 10, "cache_len": 4}},
      {"name": "external", "weight": 0.0, "params": {"command": "awk '{print NR}'"}},
      {"name": "external", "weight": 1.0, "params": {"command": "awk '{print -1}'"}}])"));
  std::vector<std::string> completions = {"<think>5+7=12</think><answer>12</answer>", "13",
                                          "twelve"};
  std::vector<std::string> refs = {"12", "13", "12"};
  std::vector<std::string> prompts(3, "What is the sum?");
  // Row 0: numeric 1, format 1, 8 tokens -> (6 - 8) / 4 = -0.5, externals 1 and -1:
  //   1 + 0.5 - 1 + 0 - 1 = -0.5
  // Row 1: 1 + 0 + 0 (5 tokens) + 0 * 2 - 1 = 0.   Row 2: 0 + 0 + 2 * -1 (11 tokens) + 0 - 1 = -3.
  auto out = algo::score_all(specs, completions, refs, prompts, {8, 5, 11});
  CHECK(out.names == std::vector<std::string>{"numeric_match", "format", "length_penalty",
                                              "external", "external_2"});
  REQUIRE(out.values.size() == 5);
  CHECK(out.values[3][2].item<float>() == 3.0f);
  CHECK(out.values[2][0].item<float>() == Approx(-0.5));
  CHECK(out.total[0].item<float>() == Approx(-0.5));
  CHECK(out.total[1].item<float>() == Approx(0.0));
  CHECK(out.total[2].item<float>() == Approx(-3.0));
  CHECK(out.values[0].mean().item<float>() == Approx(2.0 / 3.0));
  // length_penalty needs token counts; a bad reference names the reward and the row.
  CHECK_THROWS_AS(algo::score_all(specs, completions, refs, prompts, {}), Error);
  auto num = algo::parse_reward_specs(J(R"([{"name": "numeric_match"}])"));
  CHECK_THAT(
      error_of([&] { algo::score_all(num, {"1", "2"}, {"1", "?"}, {"", ""}, {}); },
               ErrorKind::kData),
      HasSubstr("reward numeric_match, row 1: numeric_match: reference '?' holds no number"));
}

TEST_CASE("rewards: a reward of 0.0 is a score, never a missing value", "[unit][rewards]") {
  // Tracker kind: `if reward:` / `reward or None` dropping 0.0 as if the function had not scored
  // the row, which shifts group means and advantages. Here "0", "0.0" and "-0" are scores that
  // count in the total and the mean; an empty line is refused (no silent default).
  std::vector<algo::ExternalItem> items = {
      {"0", "p", "a", "1"}, {"1", "p", "b", "1"}, {"2", "p", "c", "1"}, {"3", "p", "d", "1"}};
  auto v = algo::external_scores("printf '0\\n0.0\\n-0\\n1\\n'", items);
  CHECK(v == std::vector<float>{0.0f, 0.0f, 0.0f, 1.0f});
  auto specs = algo::parse_reward_specs(J(R"([
      {"name": "external", "weight": 1.0, "params": {"command": "printf '0\\n0.0\\n-0\\n1\\n'"}},
      {"name": "external", "weight": 2.0, "params": {"command": "printf '0\\n1\\n0\\n0\\n'"}}])"));
  auto out = algo::score_all(specs, {"a", "b", "c", "d"}, {"1", "1", "1", "1"},
                             std::vector<std::string>(4, "p"), {});
  // Totals 0, 2, 0, 1: the mean over all four rows is 3/4 (a reward skipping zeros would give
  // 1.5 over the two non-zero rows).
  CHECK(out.total[0].item<float>() == 0.0f);
  CHECK(out.total[1].item<float>() == 2.0f);
  CHECK(out.total.mean().item<float>() == Approx(0.75));
  CHECK(out.values[0].mean().item<float>() == Approx(0.25));
  CHECK_THAT(error_of([&] { algo::external_scores("printf '1\\n\\n3\\n4\\n'", items); },
                      ErrorKind::kRuntime),
             HasSubstr("stdout line 2 is ''"));
}

}  // namespace unit_test_rewards
