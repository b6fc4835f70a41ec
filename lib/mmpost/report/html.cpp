// The `mmpost report` page (see html.h): run table, health checks, a grid of plots per section,
// the curriculum timeline, recipes side by side, and the JSON the hover script reads.
#include "mmpost/report/html.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <set>
#include <tuple>

#include "mmpost/report/svg.h"

namespace mmpost::report {
namespace {

// Tableau 10: distinct, colour-blind-friendly run colours.
const char* const kRunColors[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                  "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};
const char* const kStageColors[] = {"#c6dbef", "#9ecae1", "#6baed6", "#4292c6", "#2171b5",
                                    "#08519c"};
const std::vector<std::string> kSections = {
    "Training", "Eval", "Rewards", "Policy", "Completions", "Gradient norms per part",
    "Curriculum", "Progress and throughput"};
// Well-known metrics first within their section, in this order; the rest alphabetically.
const std::vector<std::string> kOrder = {
    "loss", "grad_norm", "lr", "value_loss", "value_clipfrac", "eval/accuracy", "eval/loss",
    "eval/rewards/accuracies", "eval/rewards/margins", "reward", "reward_std", "pass_rate",
    "rewards/accuracies", "rewards/margins", "rewards/chosen", "rewards/rejected", "accuracy",
    "frac_reward_zero_std", "kl", "kl_full", "entropy", "approx_kl", "completions/mean_length",
    "completions/max_length", "completions/clipped_ratio", "grad_norm/vision_tower",
    "grad_norm/projector", "grad_norm/language_model", "curriculum/stage", "tokens_per_s"};

std::string color_of(size_t run) { return kRunColors[run % std::size(kRunColors)]; }

bool starts(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

/// `name` with every character but letters and digits as '-' (for element ids).
std::string dashed(const std::string& name) {
  std::string s;
  for (char c : name) s += std::isalnum(static_cast<unsigned char>(c)) ? c : '-';
  return s;
}

std::string slug(size_t i, const std::string& metric) {
  return "plot-" + std::to_string(i) + "-" + dashed(metric);
}

std::string steps_text(const std::vector<int64_t>& steps) {
  std::string o;
  const size_t shown = std::min<size_t>(steps.size(), 10);
  for (size_t i = 0; i < shown; ++i) o += (i ? ", " : "") + std::to_string(steps[i]);
  if (steps.size() > shown) o += ", ... (+" + std::to_string(steps.size() - shown) + " more)";
  return o;
}

std::string swatch(size_t run) {
  return "<span class=\"swatch\" style=\"background:" + color_of(run) + "\"></span>";
}

std::string runs_table(const Report& r) {
  std::string o = "<table class=\"runs\"><thead><tr><th>run</th><th>stage</th><th>progress</th>"
                  "<th>status</th><th>rows</th><th>folder</th></tr></thead><tbody>";
  for (size_t i = 0; i < r.runs.size(); ++i) {
    const auto& run = r.runs[i];
    std::string progress = "step " + std::to_string(run.last_step);
    if (run.total_steps > 0) progress += " of " + std::to_string(run.total_steps);
    std::string status = run.finished ? "finished" : "in progress or stopped";
    if (run.partial_last_line) status += "; a torn last line of metrics.jsonl was skipped";
    o += "<tr><td>" + swatch(i) + "<b>" + html_escape(run.name) + "</b></td><td>" +
         html_escape(run.stage.empty() ? "?" : run.stage) + "</td><td>" + progress +
         "</td><td>" + html_escape(status) + "</td><td>" + std::to_string(run.n_rows) +
         "</td><td><code>" + html_escape(run.dir.string()) + "</code></td></tr>";
  }
  return o + "</tbody></table>";
}

std::string health_section(const Report& r, const std::map<std::string, std::string>& plot_ids) {
  int64_t fired = 0;
  for (const auto& h : r.health) {
    for (const auto& c : h) fired += c.status == CheckStatus::kFired ? 1 : 0;
  }
  std::string o = "<section id=\"health\"><h2>Health checks</h2><p class=\"banner " +
                  std::string(fired ? "bad\">" : "good\">") +
                  (fired ? std::to_string(fired) + " check(s) fired; the steps are marked on the "
                                                   "plots in red."
                         : std::string("No check fired.")) +
                  "</p><table class=\"health\"><thead><tr><th>check</th>";
  for (size_t i = 0; i < r.runs.size(); ++i) o += "<th>" + swatch(i) + html_escape(r.runs[i].name) + "</th>";
  o += "</tr></thead><tbody>";
  const size_t n_checks = r.health.empty() ? 0 : r.health[0].size();
  for (size_t k = 0; k < n_checks; ++k) {
    const auto& first = r.health[0][k];
    o += "<tr data-check=\"" + first.id + "\"><td><b>" + html_escape(first.title) +
         "</b><div class=\"rule\">" + html_escape(first.rule) + "</div></td>";
    for (const auto& h : r.health) {
      const auto& c = h[k];
      const std::string st = to_string(c.status);
      o += "<td class=\"status-" + std::string(st == "n/a" ? "na" : st) + "\"><span class=\"badge\">" +
           st + "</span>";
      if (c.status == CheckStatus::kFired) {
        o += " <span class=\"steps\">steps " + steps_text(c.steps) + "</span>";
        for (const auto& [metric, steps] : c.marks) {
          auto it = plot_ids.find(metric);
          if (it != plot_ids.end()) o += " <a href=\"#" + it->second + "\">" + html_escape(metric) + "</a>";
        }
      }
      if (!c.detail.empty()) o += "<div class=\"detail\">" + html_escape(c.detail) + "</div>";
      o += "</td>";
    }
    o += "</tr>";
  }
  return o + "</tbody></table></section>";
}

/// One line of the hover readout's data: the run and its points (decimated as drawn; NaN as
/// null).
nlohmann::json hover_line(size_t run, const Series& s) {
  nlohmann::json x = nlohmann::json::array(), y = nlohmann::json::array();
  for (size_t k : decimate(s.values, kMaxPoints)) {
    x.push_back(s.steps[k]);
    y.push_back(std::isfinite(s.values[k]) ? nlohmann::json(s.values[k]) : nlohmann::json());
  }
  return {{"run", run}, {"x", x}, {"y", y}};
}

/// One plot: every run that logged `metric`, with the steps health checks marked on it.
std::string plot_figure(const Report& r, const std::string& metric, const std::string& id,
                        nlohmann::json& hover) {
  Chart chart;
  chart.id = id;
  std::set<double> marks;
  std::set<std::string> checks;
  std::string legend;
  nlohmann::json lines = nlohmann::json::array();
  for (size_t i = 0; i < r.runs.size(); ++i) {
    const Series* s = r.runs[i].find(metric);
    if (s == nullptr) continue;
    chart.lines.push_back({r.runs[i].name, color_of(i), s->steps, s->values});
    legend += "<span class=\"entry\">" + swatch(i) + html_escape(r.runs[i].name) + "</span>";
    lines.push_back(hover_line(i, *s));
    for (const auto& c : r.health[i]) {
      auto it = c.marks.find(metric);
      if (it == c.marks.end()) continue;
      marks.insert(it->second.begin(), it->second.end());
      checks.insert(c.title);
    }
  }
  hover[id] = lines;
  chart.marks.assign(marks.begin(), marks.end());
  std::string flag;
  for (const auto& c : checks) flag += "<span class=\"flag\">" + html_escape(c) + "</span>";
  return "<figure class=\"plot\" data-metric=\"" + html_escape(metric) + "\"><figcaption>" +
         html_escape(metric) + flag + "</figcaption>" +
         (r.runs.size() > 1 ? "<div class=\"legend\">" + legend + "</div>" : "") +
         render_svg(chart) + "</figure>";
}

/// Per run that logged two or more `grad_norm/<part>`: one chart overlaying its parts (their
/// relative sizes at a glance), hover-readable like the plots.
std::string part_overlays(const Report& r, nlohmann::json& hover) {
  std::string o;
  for (size_t i = 0; i < r.runs.size(); ++i) {
    Chart chart;
    chart.id = "parts-" + std::to_string(i);
    nlohmann::json lines = nlohmann::json::array();
    std::string legend;
    for (const auto& [name, s] : r.runs[i].series) {
      if (!starts(name, "grad_norm/") || s.empty()) continue;
      const std::string part = name.substr(10), color = color_of(chart.lines.size() + 4);
      chart.lines.push_back({part, color, s.steps, s.values});
      legend += "<span class=\"entry\"><span class=\"swatch\" style=\"background:" + color +
                "\"></span>" + html_escape(part) + "</span>";
      auto line = hover_line(i, s);
      line["label"] = part;
      line["color"] = color;
      lines.push_back(line);
    }
    if (chart.lines.size() < 2) continue;
    hover[chart.id] = lines;
    o += "<figure class=\"overlay\"><figcaption>grad_norm by part: " + html_escape(r.runs[i].name) +
         "</figcaption><div class=\"legend\">" + legend + "</div>" + render_svg(chart) + "</figure>";
  }
  return o;
}

/// Stage segments of one run: (first step, last step, stage), consecutive equal stages merged.
std::vector<std::tuple<double, double, int64_t>> stage_segments(const Series& s) {
  std::vector<std::tuple<double, double, int64_t>> out;
  double prev = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (!std::isfinite(s.values[i])) continue;
    const auto stage = static_cast<int64_t>(s.values[i]);
    if (!out.empty() && std::get<2>(out.back()) == stage) std::get<1>(out.back()) = s.steps[i];
    else out.emplace_back(prev, s.steps[i], stage);
    prev = s.steps[i];
  }
  return out;
}

/// The curriculum timeline: one bar per run, a segment per stage; "" when no run has stages.
std::string curriculum_timeline(const Report& r) {
  std::vector<size_t> rows;
  double x1 = 1;
  for (size_t i = 0; i < r.runs.size(); ++i) {
    const Series* s = r.runs[i].find("curriculum/stage");
    const auto* mode = json_at(r.runs[i].recipe, "rlhf.curriculum.mode");
    const bool staged = mode && mode->is_string() && mode->get<std::string>() != "none";
    if (s == nullptr || (!staged && stage_segments(*s).size() < 2)) continue;
    rows.push_back(i);
    x1 = std::max(x1, s->steps.back());
  }
  if (rows.empty()) return "";
  const double left = 150, right = 16, row_h = 26, width = 1200;
  const double height = 28 + row_h * static_cast<double>(rows.size());
  auto sx = [&](double v) { return left + v / x1 * (width - left - right); };
  auto f = [](double v) { return std::to_string(static_cast<int64_t>(std::lround(v))); };
  std::string o = "<figure class=\"timeline\"><figcaption>curriculum stage timeline</figcaption>"
                  "<svg class=\"chart\" viewBox=\"0 0 " + f(width) + " " + f(height) + "\">";
  for (size_t row = 0; row < rows.size(); ++row) {
    const auto& run = r.runs[rows[row]];
    const double y = 6 + row_h * static_cast<double>(row);
    o += "<text class=\"tick\" x=\"" + f(left - 8) + "\" y=\"" + f(y + 14) +
         "\" text-anchor=\"end\">" + html_escape(run.name) + "</text>";
    for (const auto& [a, b, stage] : stage_segments(*run.find("curriculum/stage"))) {
      std::string what = "stage " + std::to_string(stage) + ": steps " + f(a + 1) + "-" + f(b);
      if (const auto* d = json_at(run.recipe, "rlhf.curriculum.stages");
          d && d->is_array() && stage >= 0 && stage < static_cast<int64_t>(d->size())) {
        if (const auto* diff = json_at((*d)[stage], "difficulties")) what += ", difficulties " + diff->dump();
      }
      const double w = std::max(1.0, sx(b) - sx(a));
      o += "<rect class=\"stage\" x=\"" + std::to_string(sx(a)) + "\" y=\"" + f(y) + "\" width=\"" +
           std::to_string(w) + "\" height=\"20\" fill=\"" +
           kStageColors[static_cast<size_t>(std::max<int64_t>(0, stage)) % std::size(kStageColors)] +
           "\"><title>" + html_escape(run.name + ": " + what) + "</title></rect>";
      if (w > 48) {
        o += "<text class=\"stage-label\" x=\"" + std::to_string(sx(a) + w / 2) + "\" y=\"" +
             f(y + 14) + "\" text-anchor=\"middle\">stage " + std::to_string(stage) + "</text>";
      }
    }
  }
  const auto ticks = nice_ticks(0, x1, 8);
  for (double t : ticks) {
    o += "<text class=\"tick\" x=\"" + std::to_string(sx(t)) + "\" y=\"" + f(height - 4) +
         "\" text-anchor=\"middle\">" + format_tick(t, ticks.size() > 1 ? ticks[1] - ticks[0] : 1) +
         "</text>";
  }
  return o + "</svg></figure>";
}

std::string recipes_section(const Report& r) {
  std::vector<std::map<std::string, std::string>> flat;
  std::set<std::string> keys;
  for (const auto& run : r.runs) {
    flat.push_back(run.recipe.is_object() ? flatten(run.recipe) : std::map<std::string, std::string>{});
    for (const auto& [k, v] : flat.back()) keys.insert(k);
  }
  std::string body;
  int64_t n_diff = 0;
  for (const auto& k : keys) {
    std::set<std::string> distinct;
    std::string cells;
    for (size_t i = 0; i < r.runs.size(); ++i) {
      if (!r.runs[i].recipe.is_object()) {
        cells += "<td class=\"none\"></td>";
        continue;
      }
      auto it = flat[i].find(k);
      const std::string v = it == flat[i].end() ? "" : it->second;
      distinct.insert(v);
      cells += it == flat[i].end() ? "<td class=\"none\">(absent)</td>" : "<td>" + html_escape(v) + "</td>";
    }
    const bool diff = distinct.size() > 1;
    n_diff += diff ? 1 : 0;
    body += "<tr" + std::string(diff ? " class=\"diff\"" : "") + "><th>" + html_escape(k) + "</th>" +
            cells + "</tr>";
  }
  std::string head = "<tr><th>key</th>";
  for (size_t i = 0; i < r.runs.size(); ++i) {
    head += "<th>" + swatch(i) + html_escape(r.runs[i].name) +
            (r.runs[i].recipe.is_object() ? "" : " (no recipe.json)") + "</th>";
  }
  return "<section id=\"recipes\"><h2>Resolved recipes</h2><p>" + std::to_string(keys.size()) +
         " keys, " + std::to_string(n_diff) +
         " differ between runs (highlighted). <label><input type=\"checkbox\" id=\"only-diff\"> "
         "show only differences</label></p><div class=\"scroll\"><table class=\"recipe\" "
         "id=\"recipe-table\"><thead>" + head + "</tr></thead><tbody>" + body +
         "</tbody></table></div></section>";
}

/// JSON text safe inside a <script> element.
std::string script_json(const nlohmann::json& j) {
  std::string s = j.dump(-1, ' ', /*ensure_ascii=*/false, nlohmann::json::error_handler_t::replace);
  std::string o;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<' && i + 1 < s.size() && s[i + 1] == '/') o += "<\\";
    else o += s[i];
  }
  return o;
}

}  // namespace

Report build_report(const std::vector<std::string>& dirs, const HealthThresholds& t) {
  Report r;
  for (const auto& d : dirs) {
    r.runs.push_back(read_run(d));
    r.health.push_back(check_health(r.runs.back(), t));
  }
  // Two folders with one name (runs/a/out, runs/b/out): label them by their paths.
  for (auto& run : r.runs) {
    const auto same = std::count_if(r.runs.begin(), r.runs.end(),
                                    [&](const RunMetrics& o) { return o.name == run.name; });
    if (same > 1) run.name = run.dir.string();
  }
  return r;
}

std::string section_of(const std::string& m) {
  if (starts(m, "eval/")) return "Eval";
  if (starts(m, "grad_norm/")) return "Gradient norms per part";
  if (starts(m, "curriculum/")) return "Curriculum";
  if (starts(m, "completions/")) return "Completions";
  if (m == "reward" || m == "reward_std" || m == "pass_rate" || m == "accuracy" ||
      m == "frac_reward_zero_std" || m == "filtered_groups" || starts(m, "rewards/") ||
      starts(m, "advantages/")) {
    return "Rewards";
  }
  if (m == "kl" || m == "kl_full" || m == "kl_loss_term" || m == "approx_kl" || m == "entropy" ||
      starts(m, "clip_ratio/") || starts(m, "logps/") || starts(m, "logits/") || starts(m, "mdpo/")) {
    return "Policy";
  }
  const bool rate = m.size() > 6 && m.compare(m.size() - 6, 6, "_per_s") == 0;
  if (rate || m == "step_time_s" || m == "epoch" || m == "skipped" || starts(m, "dist/")) {
    return "Progress and throughput";
  }
  return "Training";
}

std::vector<std::string> plotted_metrics(const Report& r) {
  std::set<std::string> names;
  for (const auto& run : r.runs) {
    for (const auto& [name, s] : run.series) {
      if (!s.empty()) names.insert(name);
    }
  }
  auto key = [](const std::string& m) {
    const auto sec = std::find(kSections.begin(), kSections.end(), section_of(m)) - kSections.begin();
    const auto rank = std::find(kOrder.begin(), kOrder.end(), m) - kOrder.begin();
    return std::make_tuple(sec, rank, m);
  };
  std::vector<std::string> out(names.begin(), names.end());
  std::sort(out.begin(), out.end(), [&](const auto& a, const auto& b) { return key(a) < key(b); });
  return out;
}

std::string render_html(const Report& r) {
  const auto metrics = plotted_metrics(r);
  std::map<std::string, std::string> plot_ids;
  for (size_t i = 0; i < metrics.size(); ++i) plot_ids[metrics[i]] = slug(i, metrics[i]);
  nlohmann::json hover = nlohmann::json::object(), runs = nlohmann::json::array();
  std::string title;
  for (size_t i = 0; i < r.runs.size(); ++i) {
    runs.push_back({{"name", r.runs[i].name}, {"color", color_of(i)}});
    title += (i ? ", " : "") + r.runs[i].name;
  }
  std::string nav, sections;
  for (const auto& sec : kSections) {
    std::string figs;
    for (const auto& m : metrics) {
      if (section_of(m) == sec) figs += plot_figure(r, m, plot_ids[m], hover);
    }
    if (sec == "Curriculum") figs = curriculum_timeline(r) + figs;
    if (sec == "Gradient norms per part" && !figs.empty()) figs = part_overlays(r, hover) + figs;
    if (figs.empty()) continue;
    const std::string id = "sec-" + dashed(sec);
    nav += "<a href=\"#" + id + "\">" + sec + "</a>";
    sections += "<section class=\"plots\" id=\"" + id + "\"><h2>" + sec + "</h2><div class=\"grid\">" +
                figs + "</div></section>";
  }
  if (metrics.empty()) sections = "<p class=\"banner\">No metrics logged yet.</p>";
  return "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
         "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>mmpost report: " +
         html_escape(title) + "</title><style>" + page_css() + "</style></head><body>"
         "<header><h1>mmpost report</h1>" + runs_table(r) + "</header><nav><a href=\"#health\">Health</a>" +
         nav + "<a href=\"#recipes\">Recipes</a></nav><main>" + health_section(r, plot_ids) +
         sections + recipes_section(r) + "</main><div id=\"tooltip\"></div><footer>"
         "<span>mmpost report: " + std::to_string(metrics.size()) + " plots over " +
         std::to_string(r.runs.size()) + " run(s)</span> <span id=\"report-status\">static</span>"
         "<pre id=\"report-errors\"></pre></footer><script type=\"application/json\" id=\"report-data\">" +
         script_json({{"runs", runs}, {"plots", hover}}) + "</script><script>" + page_js() +
         "</script></body></html>\n";
}

nlohmann::json health_summary(const Report& r) {
  nlohmann::json runs = nlohmann::json::array();
  int64_t n_fired = 0;
  for (size_t i = 0; i < r.runs.size(); ++i) {
    const auto& run = r.runs[i];
    nlohmann::json checks = nlohmann::json::array(), fired = nlohmann::json::array();
    for (const auto& c : r.health[i]) {
      checks.push_back({{"id", c.id}, {"title", c.title}, {"status", to_string(c.status)},
                        {"rule", c.rule}, {"metrics", c.metrics}, {"steps", c.steps},
                        {"detail", c.detail}});
      if (c.status == CheckStatus::kFired) fired.push_back(c.id);
    }
    n_fired += static_cast<int64_t>(fired.size());
    runs.push_back({{"name", run.name}, {"dir", run.dir.string()}, {"stage", run.stage},
                    {"rows", run.n_rows}, {"last_step", run.last_step},
                    {"total_steps", run.total_steps}, {"finished", run.finished},
                    {"partial_last_line", run.partial_last_line}, {"fired", fired},
                    {"checks", checks}});
  }
  return {{"runs", runs}, {"n_fired", n_fired}};
}

}  // namespace mmpost::report
