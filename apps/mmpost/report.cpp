// mmpost report RUN_DIR [RUN_DIR ...] [--out report.html] [--format html|json]: one
// self-contained HTML page over run folders (every logged metric plotted against step, runs
// overlaid, health checks at the top, curriculum timeline, recipes side by side), or the health
// summary as JSON for scripts. Reads what is there, so it works on a run still in progress.
#include <iostream>

#include "mmpost/cli_common.h"
#include "mmpost/core/log.h"
#include "mmpost/io/checkpoint.h"
#include "mmpost/report/html.h"

namespace mmpost::cli {
namespace {

struct ReportArgs {
  std::vector<std::string> runs;
  std::string out;
  std::string format = "html";
};

int run_report(const ReportArgs& a) {
  const auto report = report::build_report(a.runs);
  for (const auto& run : report.runs) {
    if (run.partial_last_line) {
      log_warn("report: " + (run.dir / "metrics.jsonl").string() +
               ": the last line is incomplete (a run still writing?); skipped");
    }
  }
  const auto summary = report::health_summary(report);
  if (a.format == "json") {
    if (a.out.empty() || a.out == "-") std::cout << summary.dump() << std::endl;
    else io::write_text_atomic(a.out, summary.dump(2) + "\n");
    return 0;
  }
  const std::string out = a.out.empty() ? "report.html" : a.out;
  const size_t n_plots = report::plotted_metrics(report).size();
  io::write_text_atomic(out, report::render_html(report));
  log_info("report: " + out + ": " + std::to_string(n_plots) + " plots over " +
           std::to_string(report.runs.size()) + " run(s), " +
           std::to_string(summary["n_fired"].get<int64_t>()) + " health check(s) fired");
  std::cout << nlohmann::json{{"out", out}, {"runs", report.runs.size()}, {"plots", n_plots},
                              {"n_fired", summary["n_fired"]}}
                   .dump()
            << std::endl;
  return 0;
}

}  // namespace

Stage setup_report(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "report", "an HTML page (or JSON health summary) of one or more run folders' metrics");
  auto a = std::make_shared<ReportArgs>();
  sub->add_option("runs", a->runs, "run folders (the --output of sft, dpo, rm or rlhf)")
      ->required();
  sub->add_option("--out,-o", a->out,
                  "output file (html default: report.html; json default: standard output)");
  sub->add_option("--format", a->format, "html (the page) or json (health summary)")
      ->check(CLI::IsMember({"html", "json"}));
  return {sub, [a] { return run_report(*a); }};
}

}  // namespace mmpost::cli
