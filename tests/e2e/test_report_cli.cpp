// End-to-end `mmpost report`: a short real digits SFT and a GRPO run (with a staged curriculum)
// from it, reported together and rendered by headless Chromium as a person would open the file:
// the rendered DOM has one plot per metric either run logged, each with a line of >= 2 points,
// the page script ran without errors, and the screenshot shows both runs' colours. Also the
// JSON summary, a run in progress, and the errors and exit codes for bad folders.
#include <opencv2/imgcodecs.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "catch.h"
#include "e2e_util.h"
#include "mmpost/io/jsonl.h"
#include "test_util.h"

namespace e2e_test_report_cli {

namespace fs = std::filesystem;
using mmpost::testing::kDigitsDir;
using mmpost::testing::read_all;
using mmpost::testing::run_cli;
using mmpost::testing::TempDir;

namespace {

/// The headless browser on PATH ("" when none): Debian's chromium, or chromium-browser.
std::string find_chromium() {
  for (const char* name : {"chromium", "chromium-browser"}) {
    if (std::system(("command -v " + std::string(name) + " > /dev/null 2>&1").c_str()) == 0) return name;
  }
  return "";
}

/// Runs headless Chromium on `page` with `flags`; stdout to `out`, stderr (console) to `log`.
/// Returns the exit status (a hung browser is killed after 90 s).
int chromium(const std::string& exe, const fs::path& page, const std::string& flags,
             const fs::path& out, const fs::path& log) {
  const std::string cmd = "timeout 90 " + exe +
                          " --headless --no-sandbox --disable-gpu --hide-scrollbars"
                          " --no-first-run --enable-logging=stderr --v=0 " + flags + " file://" +
                          fs::absolute(page).string() + " > " + out.string() + " 2> " + log.string();
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/// Every metric name with a numeric value in a metrics.jsonl, and how many rows carry each.
std::map<std::string, int> logged_metrics(const fs::path& file) {
  std::map<std::string, int> out;
  mmpost::io::JsonlReader in(file);
  mmpost::io::JsonlRecord rec;
  while (in.next(rec)) {
    REQUIRE(rec.error.empty());
    for (const auto& [k, v] : rec.value.items()) {
      if (k != "step" && v.is_number()) ++out[k];
    }
  }
  return out;
}

/// Runs `mmpost ARGS`, REQUIREs exit 0 (showing stderr otherwise) and returns the result.
mmpost::testing::CliResult run_ok(const std::string& args, const fs::path& log) {
  auto r = run_cli(args, log);
  INFO(r.err);
  REQUIRE(r.code == 0);
  return r;
}

/// `n` digit prompts with their answer and difficulty i % 2 (for a staged curriculum).
fs::path write_prompts(const fs::path& dir, int n) {
  mmpost::io::JsonlReader in(kDigitsDir / "train.jsonl");
  mmpost::io::JsonlRecord rec;
  auto path = dir / "prompts.jsonl";
  std::ofstream out(path);
  for (int i = 0; i < n && in.next(rec); ++i) {
    auto r = rec.value;
    r["images"] = {(kDigitsDir / r["images"][0].get<std::string>()).string()};
    r["answer"] = r["messages"][1]["content"];
    r["messages"] = {r["messages"][0]};
    r["difficulty"] = i % 2;
    out << r.dump() << "\n";
  }
  return path;
}

/// (metric, inner markup) of every <figure class="plot" data-metric="..."> in `dom`.
std::vector<std::pair<std::string, std::string>> plots_in(const std::string& dom) {
  const std::string open = "<figure class=\"plot\" data-metric=\"";
  std::vector<std::pair<std::string, std::string>> out;
  for (size_t p = dom.find(open); p != std::string::npos; p = dom.find(open, p + 1)) {
    const size_t name_end = dom.find('"', p + open.size());
    const size_t end = dom.find("</figure>", p);
    REQUIRE(end != std::string::npos);
    out.emplace_back(dom.substr(p + open.size(), name_end - p - open.size()), dom.substr(p, end - p));
  }
  return out;
}

/// The most points of any <polyline class="series"> in `markup` (0 when none).
size_t most_points(const std::string& markup) {
  size_t most = 0;
  for (size_t p = markup.find("<polyline class=\"series\""); p != std::string::npos;
       p = markup.find("<polyline class=\"series\"", p + 1)) {
    const size_t a = markup.find(" points=\"", p) + 9, b = markup.find('"', a);
    const std::string pts = markup.substr(a, b - a);
    most = std::max<size_t>(most, std::count(pts.begin(), pts.end(), ','));
  }
  return most;
}

/// Pixels of `img` within 12 levels (per channel) of the colour `hex` ("#4e79a7").
int count_colour(const cv::Mat& img, const std::string& hex) {
  const int r = std::stoi(hex.substr(1, 2), nullptr, 16), g = std::stoi(hex.substr(3, 2), nullptr, 16),
            b = std::stoi(hex.substr(5, 2), nullptr, 16);
  int n = 0;
  for (int y = 0; y < img.rows; ++y) {
    for (int x = 0; x < img.cols; ++x) {
      const auto& p = img.at<cv::Vec3b>(y, x);  // BGR
      if (std::abs(p[0] - b) <= 12 && std::abs(p[1] - g) <= 12 && std::abs(p[2] - r) <= 12) ++n;
    }
  }
  return n;
}

}  // namespace

TEST_CASE("report: a digits SFT and a GRPO run render in headless Chromium, one plot per metric",
          "[e2e][report]") {
  const std::string browser = find_chromium();
  if (browser.empty()) MMPOST_SKIP("chromium is not installed (scripts/setup.sh installs it)");
  TempDir dir("report_e2e");
  // SFT: 20 steps, a row every 2 steps, eval at 10 and 20 (two points on each eval curve).
  auto sft = dir.path / "sft";
  run_ok("sft -r recipes/tiny/sft-tiny.json --output " + sft.string() +
             " --set train.max_steps=20 --set train.log_every_n_steps=2"
             " --set train.eval_every_n_steps=10 --set train.save_every_n_steps=0",
         dir.path / "log_sft");
  // GRPO from it: 6 steps with a KL term, a staged curriculum (difficulty 0 until step 3),
  // greedy eval at 3 and 6.
  auto grpo = dir.path / "grpo";
  run_ok("rlhf -r recipes/tiny/grpo-tiny.json --output " + grpo.string() +
             " --set model.path=" + sft.string() + " --set data.train=" +
             write_prompts(dir.path, 48).string() +
             " --set data.eval=data/digits-vqa/val.jsonl --set train.eval_max_samples=16"
             " --set train.max_steps=6 --set train.log_every_n_steps=1"
             " --set train.eval_every_n_steps=3 --set rlhf.beta=0.04"
             " --set 'rlhf.curriculum={\"mode\": \"staged\", \"stages\": [{\"difficulties\":"
             " [0], \"until_step\": 3}, {\"difficulties\": [0, 1]}]}'",
         dir.path / "log_grpo");

  auto page = dir.path / "report.html";
  auto r = run_ok("report " + sft.string() + " " + grpo.string() + " --out " + page.string(),
                  dir.path / "log_report");
  auto summary = nlohmann::json::parse(r.out.substr(r.out.rfind('{')));
  auto metrics = logged_metrics(sft / "metrics.jsonl");
  for (const auto& [k, n] : logged_metrics(grpo / "metrics.jsonl")) metrics[k] = std::max(metrics[k], n);
  CHECK(summary["plots"] == metrics.size());
  for (const char* k : {"loss", "eval/accuracy", "grad_norm/projector", "kl", "entropy",
                        "curriculum/stage", "completions/mean_length", "frac_reward_zero_std"}) {
    CHECK(metrics.count(k) == 1);  // what this test is about was logged
  }

  // The browser's DOM after the page script ran.
  auto dom_file = dir.path / "dom.html";
  REQUIRE(chromium(browser, page, "--dump-dom", dom_file, dir.path / "console.txt") == 0);
  const std::string dom = read_all(dom_file), console = read_all(dir.path / "console.txt");
  INFO(console.substr(0, 4000));
  CHECK(dom.find("data-report-status=\"ok\"") != std::string::npos);
  CHECK(dom.find("<pre id=\"report-errors\"></pre>") != std::string::npos);
  CHECK(console.find("Uncaught") == std::string::npos);
  CHECK(console.find("CONSOLE") == std::string::npos);  // the page logs nothing
  std::set<std::string> plotted;
  for (const auto& [metric, body] : plots_in(dom)) {
    INFO(metric);
    CHECK(plotted.insert(metric).second);  // one plot per metric
    CHECK(most_points(body) >= 2);         // a line with data in it
  }
  std::set<std::string> expected;
  for (const auto& [k, n] : metrics) expected.insert(k);
  CHECK(plotted == expected);
  CHECK(dom.find("<figure class=\"timeline\">") != std::string::npos);  // curriculum stages
  CHECK(dom.find("<rect class=\"stage\"") != std::string::npos);

  // Pixels: both runs' colours are drawn (blue sft, orange grpo lines, legends, swatches).
  auto png = dir.path / "page.png";
  REQUIRE(chromium(browser, page, "--window-size=1400,2400 --screenshot=" + png.string(),
                   dir.path / "shot.txt", dir.path / "shot_log.txt") == 0);
  cv::Mat img = cv::imread(png.string(), cv::IMREAD_COLOR);
  REQUIRE(!img.empty());
  CHECK(count_colour(img, "#4e79a7") > 300);
  CHECK(count_colour(img, "#f28e2b") > 300);

  // --format json: the health summary on stdout.
  r = run_ok("report " + sft.string() + " " + grpo.string() + " --format json", dir.path / "log_json");
  auto health = nlohmann::json::parse(r.out);
  REQUIRE(health["runs"].size() == 2);
  CHECK(health["runs"][0]["stage"] == "sft");
  CHECK(health["runs"][1]["stage"] == "rlhf");
  CHECK(health["runs"][1]["finished"] == true);
  CHECK(health["runs"][1]["last_step"] == 6);
  CHECK(health["runs"][0]["checks"].size() == 10);
}

TEST_CASE("report: a run in progress is read as it stands, and bad folders and lines exit 2 and 3",
          "[e2e][report]") {
  TempDir dir("report_bad");
  auto run = dir.path / "live";
  fs::create_directories(run);
  std::ofstream(run / "recipe.json") << R"({"train": {"max_steps": 100}})";
  // Two complete rows and the writer mid-line.
  std::ofstream(run / "metrics.jsonl") << "{\"step\": 1, \"loss\": 2.0, \"grad_norm\": 1.0}\n"
                                          "{\"step\": 2, \"loss\": 1.5, \"grad_norm\": 0.9}\n"
                                          "{\"step\": 3, \"loss\": 1.";
  auto r = run_ok("report " + run.string() + " --format json", dir.path / "log1");
  auto j = nlohmann::json::parse(r.out);
  CHECK(j["runs"][0]["partial_last_line"] == true);
  CHECK(j["runs"][0]["rows"] == 2);
  CHECK(j["runs"][0]["finished"] == false);
  CHECK(j["runs"][0]["total_steps"] == 100);
  CHECK_THAT(r.err, HasSubstr("metrics.jsonl: the last line is incomplete"));
  run_ok("report " + run.string() + " --out " + (dir.path / "live.html").string(), dir.path / "log2");
  CHECK_THAT(read_all(dir.path / "live.html"), HasSubstr("a torn last line of metrics.jsonl was skipped"));

  // A malformed line that is not the last: the file and line, exit 3 (bad data).
  std::ofstream(run / "metrics.jsonl") << "{\"step\": 1, \"loss\": 2.0}\n{\"step\": 2, loss}\n"
                                          "{\"step\": 3, \"loss\": 1.0}\n";
  r = run_cli("report " + run.string(), dir.path / "log3");
  CHECK(r.code == 3);
  CHECK_THAT(r.err, HasSubstr((run / "metrics.jsonl").string() + ":2: malformed JSON"));
  // A missing folder and a folder without metrics.jsonl: exit 2 (bad usage), named.
  r = run_cli("report " + (dir.path / "nope").string(), dir.path / "log4");
  CHECK(r.code == 2);
  CHECK_THAT(r.err, HasSubstr((dir.path / "nope").string() + ": no such folder"));
  fs::create_directories(dir.path / "empty");
  r = run_cli("report " + (dir.path / "empty").string(), dir.path / "log5");
  CHECK(r.code == 2);
  CHECK_THAT(r.err, HasSubstr((dir.path / "empty" / "metrics.jsonl").string() + ": missing"));
  r = run_cli("report " + run.string() + " --format pdf", dir.path / "log6");
  CHECK(r.code == 2);
  r = run_cli("report", dir.path / "log7");
  CHECK(r.code == 2);
}

}  // namespace e2e_test_report_cli
