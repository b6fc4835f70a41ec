// The `mmpost report` page and health summary: one self-contained HTML file (inline CSS, SVG
// plots, a small script for hover readouts; nothing fetched at view time) over one or more run
// folders, and the machine-readable JSON of the health checks.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "mmpost/report/health.h"
#include "mmpost/report/metrics.h"

namespace mmpost::report {

/// Runs and the health of each (health[i] = check_health(runs[i])).
struct Report {
  std::vector<RunMetrics> runs;
  std::vector<std::vector<CheckResult>> health;
};

/// Reads each folder (read_run) and checks it. Throws what read_run throws.
Report build_report(const std::vector<std::string>& dirs, const HealthThresholds& t = {});

/// The section a metric's plot goes in: "Training", "Eval", "Rewards", "Policy",
/// "Completions", "Gradient norms per part", "Curriculum" or "Throughput".
std::string section_of(const std::string& metric);

/// Every metric any run logged, in page order (by section, then a fixed order of well-known
/// names, then alphabetically): one plot each.
std::vector<std::string> plotted_metrics(const Report& r);

/// The whole page. Plots are <figure class="plot" data-metric="NAME"> holding one <svg>; the
/// curriculum timeline is a <figure class="timeline">. The page's script sets
/// <body data-report-status="ok"> once it has wired every plot ("error" and a message in
/// #report-errors if a script error occurs).
std::string render_html(const Report& r);

/// The health summary: {"runs": [{"name", "dir", "stage", "rows", "last_step", "total_steps",
/// "finished", "partial_last_line", "fired": [ids], "checks": [{"id", "title", "status", "rule",
/// "metrics", "steps", "detail"}]}], "n_fired": total fired checks over all runs}.
nlohmann::json health_summary(const Report& r);

/// The page's stylesheet and script (page_assets.cpp).
const char* page_css();
const char* page_js();

}  // namespace mmpost::report
