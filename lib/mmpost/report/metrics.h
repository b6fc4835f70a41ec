// A run folder as `mmpost report` reads it: every numeric key of metrics.jsonl as a series over
// step (training rows and "eval/..." rows alike), recipe.json and run.json. A run still being
// written is read as it stands: a torn last line (the writer mid-line, no newline yet) is skipped
// and counted; any other malformed line is an error naming the file and line.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace mmpost::report {

/// One metric of one run: `values[i]` was logged at `steps[i]`. Steps ascend strictly (a step
/// logged twice keeps its last value); a JSON null (a NaN written by the logger) is a NaN here.
struct Series {
  std::vector<double> steps;
  std::vector<double> values;
  size_t size() const { return steps.size(); }
  bool empty() const { return steps.empty(); }
};

/// What one run folder holds.
struct RunMetrics {
  std::string name;                      ///< label in legends and tables: the folder's name
  std::filesystem::path dir;             ///< the folder as given
  std::string stage;                     ///< sft | dpo | rm | rlhf, "" when nothing says
  std::map<std::string, Series> series;  ///< metric name -> series ("step" itself excluded)
  int64_t n_rows = 0;                    ///< rows read (training and eval)
  int64_t last_step = 0;                 ///< the largest step logged (0: no row yet)
  int64_t total_steps = 0;               ///< run.json's total_steps, else recipe train.max_steps
  bool finished = false;                 ///< run.json present: the final model is written
  bool partial_last_line = false;        ///< a torn last line was skipped (run in progress)
  nlohmann::json recipe;                 ///< recipe.json (null when the folder has none)
  nlohmann::json summary;                ///< run.json (null while the run is in progress)

  /// The series named `name`, or nullptr when the run never logged it.
  const Series* find(const std::string& name) const;
};

/// Adds the rows of metrics.jsonl text to `run` (`path` names the file in errors). A row is a
/// JSON object with an integer "step"; its other numeric (or null) values join the series of
/// their key; strings and booleans are ignored. Blank lines are skipped. A malformed last line
/// without a trailing newline sets `partial_last_line` instead of failing.
/// Throws Error(kData) "PATH:LINE: malformed JSON: ...", "PATH:LINE: expected a JSON object",
/// "PATH:LINE: no integer \"step\"" for any other bad line.
void parse_metrics(const std::string& text, const std::string& path, RunMetrics& run);

/// Reads the run folder `dir`: metrics.jsonl (required), recipe.json and run.json (optional;
/// run.json marks a finished run). The stage is run.json's, else the recipe's stage section
/// (dpo, rm, rlhf; sft otherwise). Throws Error(kUsage) "DIR: no such folder" and
/// "DIR/metrics.jsonl: missing" (with a hint), Error(kUsage) for a malformed recipe.json or
/// run.json, and parse_metrics' Error(kData).
RunMetrics read_run(const std::filesystem::path& dir);

/// The value at a dotted path ("rlhf.max_completion_length") of a JSON object, or nullptr.
const nlohmann::json* json_at(const nlohmann::json& object, const std::string& dotted);

/// Flattens a JSON object to dotted keys -> compact JSON text of each leaf (arrays are leaves),
/// e.g. {"optim": {"lr": 0.001}} -> {"optim.lr": "0.001"}. A non-object gives {"": dump}.
std::map<std::string, std::string> flatten(const nlohmann::json& object);

}  // namespace mmpost::report
