// One training run's plumbing, shared by every stage (sft, dpo, rm, rlhf): the output-folder lock,
// resume discovery, the finished-run check, signals, metrics.jsonl (truncated to the resumed step),
// progress and ETA, log lines, and the one-line JSON summary on stdout. The stage loop itself stays
// in each driver (STYLE.md 2); it calls this component between its own forward/backward lines.
#pragma once

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mmpost/config/recipe.h"
#include "mmpost/core/device.h"
#include "mmpost/core/log.h"
#include "mmpost/dist/process_group.h"
#include "mmpost/io/jsonl.h"
#include "mmpost/train/checkpointing.h"
#include "mmpost/train/optimizer.h"

namespace mmpost::train {

/// Means of logged quantities between two log lines: each key is averaged over its own add()s,
/// plus tokens/samples counters turned into rates over the window's wall time.
class MetricWindow {
 public:
  /// Adds one observation of `key` (a host double: callers gather device values first).
  void add(const std::string& key, double value);
  /// Counts work done (for tokens_per_s and `<unit>_per_s`).
  void count(int64_t tokens, int64_t samples);
  /// The window's means, `tokens_per_s` and `<unit>_per_s` (unit e.g. "samples", "pairs"), then
  /// resets. Keys that were never added are absent.
  nlohmann::json flush(const std::string& unit);
  /// The sums and counts as JSON {"sum": {key: s}, "n": {key: n}, "tokens", "samples"}, and
  /// the inverse that adds another window's into this one (merging ranks; keeps this start time).
  nlohmann::json sums() const;
  void add_sums(const nlohmann::json& other);

 private:
  std::map<std::string, double> sum_;
  std::map<std::string, int64_t> n_;
  int64_t tokens_ = 0, samples_ = 0;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

/// Adds one optimizer step's grad_norm and, in a multi-process run, its communication to `w`:
/// dist/allreduce_mb (gradient payload per rank), dist/comm_wait_s (time blocked in the
/// all-reduce after backward), dist/comm_s (all of the reduction step).
void add_step_stats(MetricWindow& w, const StepStats& st);

/// How a run ended, as reported in the summary ("exit_reason").
enum class RunEnd { kCompleted, kAlreadyFinished, kSignal };

/// A training run in an output folder. Construct it first thing in a stage: it joins the
/// process group when launched as several processes (torchrun or srun: dist::world_from_env;
/// one device per local rank on CUDA), refuses a folder that another run holds (rank 0 takes an
/// exclusive fcntl lock on OUTPUT/.lock for the run's lifetime; the error names the holder's PID),
/// installs SIGINT/SIGTERM handlers, applies num_threads and the seed, and finds the newest
/// complete checkpoint (rank 0 decides; every rank resumes from the same one). With
/// allow_resume == false the previous run's step folders, metrics and summary are removed. Only
/// rank 0 writes (recipe, metrics, summary, checkpoints); nothing is written before start().
/// Throws Error(kUsage) for the refusals above and a malformed launcher environment,
/// dist::DistError when the peers do not meet within dist.timeout_s.
class Run {
 public:
  Run(std::string stage, const config::CommonConfig& cfg, bool allow_resume);
  ~Run();
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;

  const std::string& stage() const { return stage_; }
  const std::filesystem::path& output_dir() const { return out_; }
  torch::Device device() const { return device_; }
  /// Parameter dtype: float32 under mixed_precision bf16, else the recipe's dtype.
  torch::Dtype dtype() const { return dtype_; }
  /// True under mixed_precision bf16: this thread computes under autocast while the Run lives.
  bool mixed_precision() const { return mixed_precision_; }
  /// The checkpoint to resume from (nullopt: a fresh start).
  const std::optional<std::filesystem::path>& checkpoint() const { return ckpt_; }

  /// The loop state: read from the checkpoint's state.json on resume, else zero.
  TrainState state;

  /// True when the resumed checkpoint already reached `total_steps` and the folder holds the
  /// final model (run.json): rerunning then changes nothing. Call before start().
  bool finished(int64_t total_steps) const;
  /// Logs that the run is already complete and prints its saved summary on stdout. Returns 0.
  int report_already_finished();

  /// Begins the loop: writes recipe.json, opens metrics.jsonl (rows past the resumed step are
  /// dropped; a fresh start truncates it), starts progress and ETA at state.step. When resuming,
  /// compares `recipe` with the one the checkpoint recorded: a different model.config or lora
  /// (the checkpoint's model would resume, not the one described) throws Error(kUsage) listing
  /// each key with its old and new value; other changes but train.max_steps / train.epochs are
  /// logged as a warning and applied.
  void start(int64_t total_steps, const nlohmann::json& recipe);

  /// True when `every` > 0 divides the current step and the run is not at its last step (the
  /// final eval/save happen after the loop).
  bool due(int64_t every) const;

  /// Writes a training metrics row (step, lr and `m`) and a log line with `shown` keys (those
  /// present), grad_norm, lr, throughput and, in batch jobs, the ETA.
  void log_step(nlohmann::json m, const std::vector<std::string>& shown);
  /// MetricWindow::flush over every rank (call it on all ranks at the same step): each metric is
  /// the mean of all ranks' observations, tokens_per_s and `<unit>_per_s` count every rank's work
  /// over rank 0's wall time. One all-gather of the windows' sums; one process flushes directly.
  /// Throws dist::DistError when a peer fails.
  nlohmann::json flush(MetricWindow& window, const std::string& unit) const;
  /// Writes an eval row (keys prefixed "eval/" by the caller) and the log line `line`.
  void log_eval(const nlohmann::json& m, const std::string& line);
  /// Redraws the progress bar (after each step).
  void progress();

  /// The received stop signal (SIGINT 2, SIGTERM 15) or 0; in a multi-process run the same on
  /// every rank (a signal seen by any rank stops all at this step: one small all-reduce).
  int stop_requested() const;
  /// This process's place in the job (a world of one without a launcher).
  const dist::WorldInfo& world() const { return world_; }
  /// True on rank 0 (the only rank that writes files and prints results).
  bool is_main() const { return world_.rank == 0; }
  /// The process group of a multi-process run, nullptr for one process.
  dist::ProcessGroup* process_group() const { return pg_.get(); }
  /// Element-wise sum over ranks of host values (the values themselves for one process), e.g.
  /// the step's token count and loss. Throws dist::DistError.
  std::vector<double> all_sum(std::vector<double> values) const;
  /// After the stop checkpoint: logs, prints the summary (exit_reason "signal"), returns 128+sig.
  int stopped(int sig);
  /// After the final model is written at the top level: writes OUTPUT/run.json (last, so its
  /// presence means the final model is complete) and prints the same summary on stdout.
  /// Returns 0.
  int completed(const nlohmann::json& extra = nlohmann::json::object());

  int64_t total_steps() const { return total_steps_; }

 private:
  nlohmann::json summary(RunEnd end) const;
  void check_resumed_recipe(const nlohmann::json& recipe) const;

  std::string stage_;
  std::filesystem::path out_;
  dist::WorldInfo world_;
  std::unique_ptr<dist::ProcessGroup> pg_;
  torch::Device device_{torch::kCPU};
  torch::Dtype dtype_ = torch::kFloat32;
  bool mixed_precision_ = false;
  std::unique_ptr<AutocastGuard> autocast_;
  int lock_fd_ = -1;
  std::optional<std::filesystem::path> ckpt_;
  int64_t total_steps_ = 0;
  int64_t start_step_ = 0;
  std::unique_ptr<io::JsonlWriter> metrics_;
  std::unique_ptr<Progress> progress_;
  nlohmann::json last_train_ = nlohmann::json::object(), last_eval_ = nlohmann::json::object();
};

/// Total optimizer steps of a stage: train.max_steps, else ceil(epochs * n_records / per_step)
/// (at least 1).
int64_t total_steps_of(const config::TrainSection& t, int64_t n_records, int64_t per_step);

/// Human-readable rate: "812", "12.3k", "4.51M" (3 significant digits).
std::string format_rate(double per_s);

}  // namespace mmpost::train
