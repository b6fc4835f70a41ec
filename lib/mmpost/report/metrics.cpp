// Reading a run folder for `mmpost report` (see metrics.h): metrics.jsonl parsed line by line with
// physical line numbers, a torn last line tolerated, series sorted by step.
#include "mmpost/report/metrics.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>
#include <utility>

#include "mmpost/core/check.h"
#include "mmpost/io/jsonl.h"

namespace mmpost::report {
namespace fs = std::filesystem;

const Series* RunMetrics::find(const std::string& name) const {
  auto it = series.find(name);
  return it == series.end() || it->second.empty() ? nullptr : &it->second;
}

namespace {

/// The step of a row: an integer, or a float with an integral value. False otherwise.
bool step_of(const nlohmann::json& row, int64_t& step) {
  auto it = row.find("step");
  if (it == row.end() || !it->is_number()) return false;
  if (it->is_number_integer()) {
    step = it->get<int64_t>();
    return true;
  }
  const double d = it->get<double>();
  if (!std::isfinite(d) || d != std::floor(d)) return false;
  step = static_cast<int64_t>(d);
  return true;
}

/// Sorts each series by step (stable: a step logged twice keeps its last value) and drops the
/// earlier duplicates.
void sort_and_dedupe(std::vector<std::pair<double, double>>& points, Series& out) {
  std::stable_sort(points.begin(), points.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  out.steps.clear();
  out.values.clear();
  for (size_t i = 0; i < points.size(); ++i) {
    if (i + 1 < points.size() && points[i + 1].first == points[i].first) continue;
    out.steps.push_back(points[i].first);
    out.values.push_back(points[i].second);
  }
}

std::string read_file(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  MMPOST_CHECK(in.good(), file.string(), ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// A JSON object file of the run folder, or null when it is absent. Throws Error(kUsage) naming
/// it when it is not a JSON object.
nlohmann::json optional_json_file(const fs::path& file) {
  if (!fs::exists(file)) return nullptr;
  return io::read_json_object_file(file);
}

std::string stage_of(const RunMetrics& run) {
  if (run.summary.is_object() && run.summary.contains("stage") && run.summary["stage"].is_string()) {
    return run.summary["stage"].get<std::string>();
  }
  if (run.recipe.is_object()) {
    for (const char* s : {"rlhf", "dpo", "rm"}) {
      if (run.recipe.contains(s)) return s;
    }
    return "sft";
  }
  // Neither file: guess from the metrics each stage alone logs.
  if (run.find("reward")) return "rlhf";
  if (run.find("rewards/accuracies")) return "dpo";
  if (run.find("rewards/margins")) return "rm";
  return run.series.empty() ? "" : "sft";
}

void flatten_into(const nlohmann::json& j, const std::string& prefix,
                  std::map<std::string, std::string>& out) {
  if (j.is_object() && !j.empty()) {
    for (const auto& [k, v] : j.items()) flatten_into(v, prefix.empty() ? k : prefix + "." + k, out);
    return;
  }
  out[prefix] = j.dump();
}

}  // namespace

void parse_metrics(const std::string& text, const std::string& path, RunMetrics& run) {
  std::map<std::string, std::vector<std::pair<double, double>>> points;
  for (const auto& [name, s] : run.series) {  // rows already read stay
    for (size_t i = 0; i < s.size(); ++i) points[name].emplace_back(s.steps[i], s.values[i]);
  }
  size_t pos = 0;
  int64_t line_no = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    const bool terminated = end != std::string::npos;
    if (!terminated) end = text.size();
    std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (line_no == 1 && line.rfind("\xEF\xBB\xBF", 0) == 0) line.erase(0, 3);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    const std::string where = io::location(path, line_no);
    nlohmann::json row;
    try {
      row = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      if (!terminated) {  // the writer is mid-line: keep what is there so far
        run.partial_last_line = true;
        break;
      }
      throw Error(ErrorKind::kData, where + ": malformed JSON: " + e.what(),
                  "metrics.jsonl holds one JSON object per line, as mmpost's stages write it");
    }
    MMPOST_CHECK_DATA(row.is_object(), where, ": expected a JSON object, got ", row.type_name());
    int64_t step = 0;
    MMPOST_CHECK_DATA(step_of(row, step), where, ": no integer \"step\" in this row");
    ++run.n_rows;
    run.last_step = std::max(run.last_step, step);
    for (const auto& [key, v] : row.items()) {
      if (key == "step") continue;
      if (v.is_number()) points[key].emplace_back(static_cast<double>(step), v.get<double>());
      else if (v.is_null()) {
        points[key].emplace_back(static_cast<double>(step), std::numeric_limits<double>::quiet_NaN());
      }
    }
  }
  for (auto& [name, p] : points) sort_and_dedupe(p, run.series[name]);
}

RunMetrics read_run(const fs::path& dir) {
  if (!fs::is_directory(dir)) {
    throw Error(ErrorKind::kUsage, dir.string() + ": no such folder",
                "pass a run's output folder (the --output of mmpost sft|dpo|rm|rlhf)");
  }
  const fs::path metrics = dir / "metrics.jsonl";
  if (!fs::is_regular_file(metrics)) {
    throw Error(ErrorKind::kUsage, metrics.string() + ": missing",
                "a run folder gets metrics.jsonl at its first log step; is " + dir.string() +
                    " the --output of a training stage?");
  }
  RunMetrics run;
  run.dir = dir;
  run.name = fs::absolute(dir).lexically_normal().filename().string();
  if (run.name.empty()) run.name = fs::absolute(dir).lexically_normal().parent_path().filename().string();
  run.recipe = optional_json_file(dir / "recipe.json");
  run.summary = optional_json_file(dir / "run.json");
  run.finished = run.summary.is_object();
  parse_metrics(read_file(metrics), metrics.string(), run);
  run.stage = stage_of(run);
  if (const auto* t = json_at(run.summary, "total_steps"); t && t->is_number_integer()) {
    run.total_steps = t->get<int64_t>();
  } else if (const auto* m = json_at(run.recipe, "train.max_steps"); m && m->is_number_integer()) {
    run.total_steps = std::max<int64_t>(0, m->get<int64_t>());
  }
  return run;
}

const nlohmann::json* json_at(const nlohmann::json& object, const std::string& dotted) {
  const nlohmann::json* j = &object;
  size_t pos = 0;
  while (true) {
    const size_t dot = dotted.find('.', pos);
    const std::string key = dotted.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    if (!j->is_object()) return nullptr;
    auto it = j->find(key);
    if (it == j->end()) return nullptr;
    j = &*it;
    if (dot == std::string::npos) return j;
    pos = dot + 1;
  }
}

std::map<std::string, std::string> flatten(const nlohmann::json& object) {
  std::map<std::string, std::string> out;
  flatten_into(object, "", out);
  return out;
}

}  // namespace mmpost::report
