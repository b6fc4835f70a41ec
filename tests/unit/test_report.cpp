// Tests for report/: the metrics.jsonl reader (torn last line, FILE:LINE errors), every health
// check on hand-built series whose firing steps are worked out in the comments, the SVG chart
// writer (ticks, decimation, NaN breaks) and the page and JSON summary over two runs.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>

#include "catch.h"
#include "mmpost/core/check.h"
#include "mmpost/report/health.h"
#include "mmpost/report/html.h"
#include "mmpost/report/metrics.h"
#include "mmpost/report/svg.h"
#include "test_util.h"

namespace unit_test_report {

namespace fs = std::filesystem;
using namespace mmpost::report;
using mmpost::testing::TempDir;

namespace {

const double kNaN = std::nan("");

/// A series at steps first, first + every, ...
Series series(const std::vector<double>& values, double first = 1, double every = 1) {
  Series s;
  for (size_t i = 0; i < values.size(); ++i) {
    s.steps.push_back(first + every * static_cast<double>(i));
    s.values.push_back(values[i]);
  }
  return s;
}

/// A run from metrics.jsonl text, with `stage` and `recipe` set as read_run would.
RunMetrics run_of(const std::string& text, const std::string& stage,
                  const nlohmann::json& recipe = nullptr) {
  RunMetrics run;
  run.name = stage + "-run";
  run.dir = "runs/" + stage;
  run.stage = stage;
  run.recipe = recipe;
  parse_metrics(text, "runs/" + stage + "/metrics.jsonl", run);
  return run;
}

/// The message of the Error `f` throws, and its kind.
template <class F>
std::pair<std::string, mmpost::ErrorKind> error_of(F f) {
  try {
    f();
  } catch (const mmpost::Error& e) {
    return {e.what(), e.kind()};
  }
  FAIL("no mmpost::Error thrown");
  return {};
}

const CheckResult& check(const std::vector<CheckResult>& all, const std::string& id) {
  for (const auto& c : all) {
    if (c.id == id) return c;
  }
  throw std::runtime_error("no check " + id);
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

using Steps = std::vector<int64_t>;

}  // namespace

TEST_CASE("report: metrics.jsonl rows become series by step, eval rows included", "[unit][report]") {
  // Line 3 is blank; step 10 is logged twice for loss (the last value wins); strings and booleans
  // are ignored; null (a NaN the logger wrote) stays a NaN point; rows out of order are sorted.
  const std::string text =
      "{\"step\": 5, \"loss\": 2.5, \"lr\": 0.001, \"note\": \"x\", \"flag\": true}\n"
      "{\"step\": 10, \"loss\": 2.0, \"grad_norm\": null}\n"
      "\n"
      "{\"step\": 10, \"eval/accuracy\": 0.25, \"eval/n\": 32}\n"
      "{\"step\": 10, \"loss\": 1.9}\n"
      "{\"step\": 7.0, \"loss\": 2.2}\n";
  auto run = run_of(text, "sft");
  CHECK(run.n_rows == 5);
  CHECK(run.last_step == 10);
  CHECK_FALSE(run.partial_last_line);
  REQUIRE(run.find("loss"));
  CHECK(run.find("loss")->steps == std::vector<double>{5, 7, 10});
  CHECK(run.find("loss")->values == std::vector<double>{2.5, 2.2, 1.9});
  CHECK(run.find("eval/accuracy")->values == std::vector<double>{0.25});
  CHECK(std::isnan(run.find("grad_norm")->values.at(0)));
  CHECK(run.find("note") == nullptr);
  CHECK(run.find("flag") == nullptr);
  CHECK(run.find("step") == nullptr);
}

TEST_CASE("report: a torn last line is skipped and counted, any other bad line names FILE:LINE",
          "[unit][report]") {
  // No newline after the last line: the writer is mid-line (a run in progress).
  auto run = run_of("{\"step\": 1, \"loss\": 3}\n{\"step\": 2, \"loss\": 2}\n{\"step\": 3, \"lo", "sft");
  CHECK(run.partial_last_line);
  CHECK(run.n_rows == 2);
  CHECK(run.find("loss")->values == std::vector<double>{3, 2});

  // The same line with its newline is complete, so it is malformed: an error naming line 3.
  auto [msg, kind] = error_of([] { run_of("{\"step\": 1}\n\n{\"step\": 3, \"lo\n", "sft"); });
  CHECK_THAT(msg, HasSubstr("runs/sft/metrics.jsonl:3: malformed JSON"));
  CHECK(kind == mmpost::ErrorKind::kData);
  // A malformed line in the middle of an unterminated file is not the torn one.
  std::tie(msg, kind) = error_of([] { run_of("{\"step\": 1}\n{oops\n{\"step\": 3}", "sft"); });
  CHECK_THAT(msg, HasSubstr("metrics.jsonl:2: malformed JSON"));
  std::tie(msg, kind) = error_of([] { run_of("{\"step\": 1}\n[1, 2]\n", "sft"); });
  CHECK_THAT(msg, HasSubstr("metrics.jsonl:2: expected a JSON object, got array"));
  std::tie(msg, kind) = error_of([] { run_of("{\"loss\": 1}\n", "sft"); });
  CHECK_THAT(msg, HasSubstr("metrics.jsonl:1: no integer \"step\""));
  std::tie(msg, kind) = error_of([] { run_of("{\"step\": 1.5, \"loss\": 1}\n", "sft"); });
  CHECK_THAT(msg, HasSubstr("metrics.jsonl:1: no integer \"step\""));
}

TEST_CASE("report: read_run finds the stage, total steps and state, and bad folders are usage errors",
          "[unit][report]") {
  TempDir tmp("report_read");
  auto [msg, kind] = error_of([&] { read_run(tmp.path / "nope"); });
  CHECK_THAT(msg, HasSubstr((tmp.path / "nope").string() + ": no such folder"));
  CHECK(kind == mmpost::ErrorKind::kUsage);
  std::tie(msg, kind) = error_of([&] { read_run(tmp.path); });
  CHECK_THAT(msg, HasSubstr((tmp.path / "metrics.jsonl").string() + ": missing"));
  CHECK(kind == mmpost::ErrorKind::kUsage);

  std::ofstream(tmp.path / "metrics.jsonl") << "";  // a run before its first log step
  std::ofstream(tmp.path / "recipe.json") << R"({"train": {"max_steps": 40}, "dpo": {"beta": 0.1}})";
  auto run = read_run(tmp.path);
  CHECK(run.stage == "dpo");
  CHECK(run.total_steps == 40);
  CHECK(run.n_rows == 0);
  CHECK_FALSE(run.finished);
  CHECK(run.name == tmp.path.filename().string());

  std::ofstream(tmp.path / "run.json") << R"({"stage": "dpo", "total_steps": 50})";
  run = read_run(tmp.path);
  CHECK(run.finished);
  CHECK(run.total_steps == 50);
  std::ofstream(tmp.path / "recipe.json") << "{not json";
  std::tie(msg, kind) = error_of([&] { read_run(tmp.path); });
  CHECK_THAT(msg, HasSubstr("recipe.json"));
}

TEST_CASE("report: spikes fire above level + max(k x noise, 10% |level|)", "[unit][report]") {
  HealthThresholds t;  // level: median of 5 previous; noise: median |diff| over 20; k 8; 10%
  // Steps 10..100. At 70 (2.0): level = median{1.1, 1, 1.1, 1, 1.1} = 1.1, noise = median of
  // five 0.1 steps = 0.1, threshold 1.1 + max(0.8, 0.11) = 1.9: fires. At 90 (1.85): level =
  // median{1.1, 1, 1.1, 2, 1} = 1.1, diffs {.1 x5, .9, 1} -> 0.1, threshold 1.9: no. At 100
  // (1.95): level median{1, 1.1, 2, 1, 1.85} = 1.1, noise 0.1, threshold 1.9: fires.
  auto s = series({1.0, 1.1, 1.0, 1.1, 1.0, 1.1, 2.0, 1.0, 1.85, 1.95}, 10, 10);
  CHECK(spike_steps(s, t) == Steps{70, 100});
  // Fewer than 5 earlier values: nothing can fire, however large.
  CHECK(spike_steps(series({1, 50, 1, 1, 1}), t).empty());
  // A 3.5x jump late in a falling loss fires: level = median{2.3, 2.05, 1.85, 1.7, 1.6} = 1.85,
  // noise = median{.4, .3, .25, .2, .15, .1} = .225, threshold 1.85 + 1.8 = 3.65 < 6.
  CHECK(spike_steps(series({3.0, 2.6, 2.3, 2.05, 1.85, 1.7, 1.6, 6.0}), t) == Steps{8});
  // A falling loss and a steady ramp never fire (ramp: value - level = 3 < 8 x slope 1); NaNs
  // neither fire nor enter the window.
  CHECK(spike_steps(series({6, 5, 4, 3.2, 2.5, 2.0, kNaN, 1.8, 1.6, 1.5, 1.45}), t).empty());
  std::vector<double> ramp(30);
  for (int i = 0; i < 30; ++i) ramp[i] = i + 1.0;
  CHECK(spike_steps(series(ramp), t).empty());
  // A flat series (noise 0): the 10% floor decides. Threshold 2 + 0.2 = 2.2: 2.1 no, 2.3 yes.
  CHECK(spike_steps(series({2, 2, 2, 2, 2, 2, 2.1, 2.3}), t) == Steps{8});
  // The noise window trails. After an alternating 1/3 stretch and four 1s, 1.5 at step 11:
  // over 3 previous values {1, 1, 1} the noise is 0 (threshold 1.1, fires); over 20 the diffs
  // {2 x6, 0 x3} give noise 2 (threshold 17, does not).
  HealthThresholds w3 = t;
  w3.spike_window = 3;
  const auto calm = series({1, 3, 1, 3, 1, 3, 1, 1, 1, 1, 1.5});
  CHECK(spike_steps(calm, w3) == Steps{11});
  CHECK(spike_steps(calm, t).empty());
}

TEST_CASE("report: entropy collapse fires below 10% of the first entropy", "[unit][report]") {
  HealthThresholds t;
  // First value 2.0 -> threshold 0.2: 0.21 (step 4) no, 0.19 (5) and 0.1 (6) yes, NaN skipped,
  // 0.3 (8) no.
  CHECK(entropy_collapse_steps(series({2.0, 1.5, 0.5, 0.21, 0.19, 0.1, kNaN, 0.3}), t) ==
        Steps{5, 6});
  // The first finite value is the reference (a leading NaN is skipped); a zero reference
  // cannot collapse.
  CHECK(entropy_collapse_steps(series({kNaN, 1.0, 0.05}), t) == Steps{3});
  CHECK(entropy_collapse_steps(series({0.0, 0.0}), t).empty());
}

TEST_CASE("report: threshold checks (KL, zero-std, truncation, length) and counters",
          "[unit][report]") {
  // Strictly above: 0.5 itself does not fire.
  CHECK(steps_above(series({0.01, 0.2, 0.5, 0.51, 2.0}), 0.5) == Steps{4, 5});
  // At least (the length check): 3.6 == 0.9 x 4 fires.
  CHECK(steps_above(series({2.0, 3.59, 3.6, 4.0}), 3.6, /*at_least=*/true) == Steps{3, 4});
  CHECK(steps_above(series({kNaN, 0.7}), 0.5) == Steps{2});
  // Cumulative skipped count: fires where it grows (the first row when > 0).
  CHECK(increase_steps(series({0, 0, 2, 2, 5}, 10, 10)) == Steps{30, 50});
  CHECK(increase_steps(series({3, 3}, 10, 10)) == Steps{10});
  CHECK(non_finite_steps(series({1, kNaN, INFINITY, 2})) == Steps{2, 3});
}

TEST_CASE("report: reward up while eval down fires only past the eval set's noise",
          "[unit][report]") {
  HealthThresholds t;  // drop > max(0.02, 2 SE), reward rise > 0.01
  // Reward 0.2 over steps 1-10, 0.5 over 11-20, 0.8 over 21-30; eval at 10, 20, 30, n = 100.
  std::vector<double> r(30);
  for (int i = 0; i < 30; ++i) r[i] = i < 10 ? 0.2 : i < 20 ? 0.5 : 0.8;
  const auto reward = series(r);
  const auto n = series({100, 100, 100}, 10, 10);
  // Step 20: eval rose (0.6 -> 0.7): no. Step 30: 0.7 -> 0.5; SE = sqrt(.7 x .3 / 100) = .0458,
  // threshold max(.02, .0917) = .0917, 0.5 < 0.6083: fell; reward mean 0.8 over (20, 30] vs 0.5
  // over (10, 20]: rose. Fires at 30.
  CHECK(reward_up_eval_down_steps(reward, series({0.6, 0.7, 0.5}, 10, 10), &n, t) == Steps{30});
  // 0.7 -> 0.65 is within 2 SE of a 100-sample eval: no. Without eval/n only the 0.02 floor
  // applies and 0.65 < 0.68 fires.
  CHECK(reward_up_eval_down_steps(reward, series({0.6, 0.7, 0.65}, 10, 10), &n, t).empty());
  CHECK(reward_up_eval_down_steps(reward, series({0.6, 0.7, 0.65}, 10, 10), nullptr, t) ==
        Steps{30});
  // Eval falls but the reward is flat (0.5 over (10, 20] and (20, 30]): no.
  std::vector<double> flat(r);
  for (int i = 20; i < 30; ++i) flat[i] = 0.5;
  CHECK(reward_up_eval_down_steps(series(flat), series({0.6, 0.7, 0.5}, 10, 10), &n, t).empty());
  // The first eval has no previous one: a single eval never fires.
  CHECK(reward_up_eval_down_steps(reward, series({0.1}, 10, 10), &n, t).empty());
}

TEST_CASE("report: check_health wires each stage's metrics and says what does not apply",
          "[unit][report]") {
  // An rlhf run logging every 10 steps; max_completion_length 10 -> length threshold 9.
  std::string text;
  const double entropy[] = {2.0, 1.0, 0.15, 0.1}, kl[] = {0.0, 0.1, 0.6, 0.7};
  const double zero_std[] = {0.2, 0.6, 0.5, 0.9}, clipped[] = {0.0, 0.1, 0.25, 0.3};
  const double length[] = {3, 6, 8.9, 9.5}, skipped[] = {0, 0, 1, 1};
  for (int i = 0; i < 4; ++i) {
    text += nlohmann::json{{"step", 10 * (i + 1)}, {"loss", 0.01 * i}, {"grad_norm", 1.0},
                           {"reward", 0.1 * i}, {"entropy", entropy[i]}, {"kl", kl[i]},
                           {"frac_reward_zero_std", zero_std[i]},
                           {"completions/clipped_ratio", clipped[i]},
                           {"completions/mean_length", length[i]}, {"skipped", skipped[i]}}
                .dump() + "\n";
  }
  auto run = run_of(text, "rlhf", {{"rlhf", {{"max_completion_length", 10}}}});
  auto h = check_health(run);
  CHECK(h.size() == 10);
  CHECK(check(h, "entropy_collapse").steps == Steps{30, 40});  // < 0.2
  CHECK(check(h, "kl_runaway").steps == Steps{30, 40});        // > 0.5
  CHECK(check(h, "zero_std_groups").steps == Steps{20, 40});   // > 0.5 (0.5 itself: no)
  CHECK(check(h, "truncation").steps == Steps{30, 40});        // > 0.2
  CHECK(check(h, "length_at_limit").steps == Steps{40});       // >= 9
  CHECK(check(h, "skipped_samples").steps == Steps{30});
  CHECK(check(h, "kl_runaway").marks.at("kl") == Steps{30, 40});
  CHECK(check(h, "grad_norm_spike").status == CheckStatus::kOk);
  // rlhf's policy loss has no scale: only PPO's value_loss is checked, absent here.
  CHECK(check(h, "loss_spike").status == CheckStatus::kNotApplicable);
  CHECK(check(h, "reward_up_eval_down").status == CheckStatus::kNotApplicable);  // no eval
  CHECK(check(h, "non_finite").status == CheckStatus::kOk);
  CHECK_THAT(check(h, "kl_runaway").detail, HasSubstr("kl 0.6 at step 30 (2 steps)"));

  // Without the recipe the length limit is unknown: not applicable, said why.
  auto no_recipe = check_health(run_of(text, "rlhf"));
  CHECK(check(no_recipe, "length_at_limit").status == CheckStatus::kNotApplicable);
  CHECK_THAT(check(no_recipe, "length_at_limit").detail, HasSubstr("max_completion_length"));

  // An sft run: train loss falls while eval accuracy falls (overfitting) at step 30; the rlhf
  // checks do not apply; a null loss is a non-finite value.
  auto sft = run_of(
      "{\"step\": 10, \"loss\": 3.0, \"grad_norm\": 1}\n{\"step\": 10, \"eval/accuracy\": 0.5}\n"
      "{\"step\": 20, \"loss\": 2.0, \"grad_norm\": 1}\n{\"step\": 20, \"eval/accuracy\": 0.8}\n"
      "{\"step\": 30, \"loss\": null, \"grad_norm\": 1}\n{\"step\": 31, \"loss\": 1.0}\n"
      "{\"step\": 31, \"eval/accuracy\": 0.6}\n",
      "sft");
  auto hs = check_health(sft);
  CHECK(check(hs, "reward_up_eval_down").steps == Steps{31});
  CHECK(check(hs, "reward_up_eval_down").marks.count("loss") == 1);
  CHECK(check(hs, "non_finite").steps == Steps{30});
  CHECK(check(hs, "entropy_collapse").status == CheckStatus::kNotApplicable);
  CHECK(check(hs, "loss_spike").status == CheckStatus::kOk);
}

TEST_CASE("report: chart ticks, labels and decimation", "[unit][report]") {
  CHECK(nice_ticks(0, 1, 5) == std::vector<double>{0, 0.2, 0.4, 0.6000000000000001, 0.8, 1.0});
  // (2500 - 1) / 6 = 416.5 -> 5 x 100: 500, 1000, ..., 2500.
  CHECK(nice_ticks(1, 2500, 6) == std::vector<double>{500, 1000, 1500, 2000, 2500});
  CHECK(nice_ticks(3, 3, 5) == std::vector<double>{3});
  CHECK(format_tick(0.6000000000000001, 0.2) == "0.6");
  CHECK(format_tick(1500, 500) == "1500");
  CHECK(format_tick(25000, 5000) == "25k");
  CHECK(format_tick(2000, 1000) == "2k");
  CHECK(format_tick(2e-5, 1e-5) == "2e-05");
  CHECK(format_tick(-1e-17, 0.5) == "0");
  CHECK(format_tick(12, 2) == "12");
  // 10,000 points into 200: the first, the last and each bucket's min and max, so one spike at
  // 5,000 survives.
  std::vector<double> y(10000, 1.0);
  y[5000] = 100;
  auto keep = decimate(y, 200);
  CHECK(keep.size() <= 200);
  CHECK(keep.front() == 0);
  CHECK(keep.back() == 9999);
  CHECK(std::find(keep.begin(), keep.end(), 5000) != keep.end());
  CHECK(decimate({1, 2, 3}, 200) == std::vector<size_t>{0, 1, 2});
}

TEST_CASE("report: an SVG chart draws each line, breaks at NaN and marks flagged steps",
          "[unit][report]") {
  Chart c;
  c.id = "plot-0-loss";
  c.lines.push_back({"run <a>", "#4e79a7", {1, 2, 3, 4, 5}, {5, 4, kNaN, 2, 1}});
  c.lines.push_back({"b", "#f28e2b", {1, 5}, {3, 3}});
  c.marks = {4, 99};  // 99 is outside the steps: not drawn
  const auto svg = render_svg(c);
  // Line 1 breaks at the NaN into {1, 2} and {4, 5}; line 2 is one polyline.
  CHECK(count(svg, "<polyline class=\"series\"") == 3);
  CHECK(count(svg, "data-run=\"run &lt;a&gt;\"") == 2 + 4);  // 2 polylines + 4 point markers
  CHECK(count(svg, "<g class=\"mark\"") == 1);
  CHECK(count(svg, "<circle class=\"point\"") == 4 + 2);
  CHECK(svg.rfind("<svg id=\"plot-0-loss\"", 0) == 0);
  CHECK_THAT(svg, HasSubstr("data-x0=\"1\" data-x1=\"5\""));
  // y from 1 to 5: (5 - 1) / 5 = 0.8 -> spacing 1, ticks 1..5 on the left, each labelled.
  std::regex label(R"(<text class="tick"[^>]*text-anchor="end"[^>]*>([^<]*)</text>)");
  std::vector<std::string> labels;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), label); it != std::sregex_iterator(); ++it) {
    labels.push_back((*it)[1]);
  }
  CHECK(labels == std::vector<std::string>{"1", "2", "3", "4", "5"});
  // A chart without finite values still renders, and says so.
  Chart empty;
  empty.lines.push_back({"a", "#000", {1}, {kNaN}});
  CHECK_THAT(render_svg(empty), HasSubstr("no finite values"));
}

TEST_CASE("report: the page has one plot per metric, overlays runs and highlights recipe diffs",
          "[unit][report]") {
  Report r;
  r.runs.push_back(run_of("{\"step\": 1, \"loss\": 2, \"lr\": 0.1}\n{\"step\": 2, \"loss\": 1, \"lr\": 0.1}\n"
                          "{\"step\": 2, \"eval/accuracy\": 0.5}\n",
                          "sft", {{"optim", {{"lr", 0.1}}}, {"seed", 1}}));
  r.runs.push_back(run_of("{\"step\": 1, \"loss\": 3, \"grad_norm/projector\": 0.5}\n"
                          "{\"step\": 2, \"loss\": 2.5, \"grad_norm/projector\": 0.4}\n",
                          "sft", {{"optim", {{"lr", 0.2}}}, {"seed", 1}}));
  r.runs[1].name = "second";
  for (const auto& run : r.runs) r.health.push_back(check_health(run));
  CHECK(plotted_metrics(r) ==
        std::vector<std::string>{"loss", "lr", "eval/accuracy", "grad_norm/projector"});
  CHECK(section_of("grad_norm/projector") == "Gradient norms per part");
  CHECK(section_of("completions/clipped_ratio") == "Completions");
  CHECK(section_of("rollout_tokens_per_s") == "Progress and throughput");
  CHECK(section_of("kl") == "Policy");
  const auto html = render_html(r);
  CHECK(count(html, "<figure class=\"plot\"") == 4);
  CHECK_THAT(html, HasSubstr("<figure class=\"plot\" data-metric=\"loss\">"));
  // loss overlays both runs: a legend with both names, one polyline each.
  const auto loss = html.substr(html.find("data-metric=\"loss\""));
  const auto loss_fig = loss.substr(0, loss.find("</figure>"));
  CHECK(count(loss_fig, "<polyline class=\"series\"") == 2);
  CHECK_THAT(loss_fig, HasSubstr("second"));
  // Recipes: optim.lr differs (highlighted), seed does not.
  CHECK_THAT(html, HasSubstr("<tr class=\"diff\"><th>optim.lr</th><td>0.1</td><td>0.2</td></tr>"));
  CHECK_THAT(html, HasSubstr("<tr><th>seed</th><td>1</td><td>1</td></tr>"));
  // Self-contained: nothing fetched at view time.
  CHECK(html.find("http://") == std::string::npos);
  CHECK(html.find("https://") == std::string::npos);
  CHECK(html.find(" src=") == std::string::npos);
  CHECK_THAT(html, HasSubstr("id=\"report-data\""));
  // One part's grad norm: no by-part overlay; two parts: one, beside the per-metric plots.
  CHECK(count(html, "<figure class=\"overlay\">") == 0);
  r.runs[1] = run_of("{\"step\": 1, \"grad_norm/projector\": 0.5, \"grad_norm/vision_tower\": 0.1}\n"
                     "{\"step\": 2, \"grad_norm/projector\": 0.4, \"grad_norm/vision_tower\": 0.2}\n",
                     "sft");
  const auto parts = render_html(r);
  CHECK(count(parts, "<figure class=\"overlay\"><figcaption>grad_norm by part: sft-run") == 1);
  CHECK(count(parts, "<figure class=\"plot\"") == 5);

  const auto j = health_summary(r);
  REQUIRE(j["runs"].size() == 2);
  CHECK(j["runs"][0]["stage"] == "sft");
  CHECK(j["runs"][0]["checks"].size() == 10);
  CHECK(j["runs"][0]["checks"][0]["id"] == "loss_spike");
  CHECK(j["n_fired"] == 0);
}

TEST_CASE("report: the curriculum timeline has one segment per stage with its steps",
          "[unit][report]") {
  // Stage 0 logged at steps 5 and 10, stage 1 at 15, stage 2 at 20 and 25: three segments,
  // steps 1-10, 11-15 and 16-25, with the difficulties the recipe gives each stage.
  Report r;
  nlohmann::json recipe = {{"rlhf", {{"curriculum", {{"mode", "staged"},
                                                     {"stages", {{{"difficulties", {0}}},
                                                                 {{"difficulties", {0, 1}}},
                                                                 {{"difficulties", {0, 1, 2}}}}}}}}}};
  std::string text;
  const int stage[] = {0, 0, 1, 2, 2};
  for (int i = 0; i < 5; ++i) {
    text += nlohmann::json{{"step", 5 * (i + 1)}, {"curriculum/stage", stage[i]}}.dump() + "\n";
  }
  r.runs.push_back(run_of(text, "rlhf", recipe));
  r.health.push_back(check_health(r.runs[0]));
  const auto html = render_html(r);
  CHECK(count(html, "<figure class=\"timeline\">") == 1);
  CHECK(count(html, "<rect class=\"stage\"") == 3);
  CHECK_THAT(html, HasSubstr("rlhf-run: stage 0: steps 1-10, difficulties [0]"));
  CHECK_THAT(html, HasSubstr("rlhf-run: stage 1: steps 11-15, difficulties [0,1]"));
  CHECK_THAT(html, HasSubstr("rlhf-run: stage 2: steps 16-25, difficulties [0,1,2]"));
  // Without a staged recipe and with one stage throughout there is no timeline.
  r.runs[0] = run_of("{\"step\": 5, \"curriculum/stage\": 0}\n{\"step\": 10, \"curriculum/stage\": 0}\n", "rlhf");
  CHECK(count(render_html(r), "<figure class=\"timeline\">") == 0);
}

}  // namespace unit_test_report
