// Logging to stderr (stdout is reserved for machine-readable results) and a progress display:
// a redrawn bar with ETA when stderr is a TTY, plain periodic log lines in batch jobs (Slurm).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace mmpost {

/// Writes "[mmpost HH:MM:SS] msg" to stderr; thread-safe; ranks other than 0 stay quiet.
void log_info(const std::string& msg);
/// "[mmpost HH:MM:SS] [rank R/N] warning: msg" on every rank (the rank tag only when N > 1).
void log_warn(const std::string& msg);
/// Sets the distributed rank and world size (default 0 of 1): info lines come from rank 0 only,
/// warnings and errors from every rank, tagged with rank_prefix().
void set_log_rank(int rank, int world_size);
/// "[rank R/N] " in a multi-process run, "" otherwise.
std::string rank_prefix();
/// True when stderr is a terminal (progress bars are drawn only then).
bool stderr_is_tty();

/// Progress over `total` units of work. On a TTY redraws one line with a bar, rate and ETA, cut to
/// the terminal width (80 when unknown);
/// otherwise prints nothing itself (the caller's periodic log lines are the batch-job progress).
class Progress {
 public:
  Progress(std::string label, int64_t total);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  /// Sets the absolute position and a short status suffix (e.g. "loss 0.412").
  void update(int64_t done, const std::string& status = "");
  /// Clears the bar line (call before printing a log line while a bar is shown).
  void clear();
  /// Finishes the bar (prints a final newline on a TTY).
  void finish();
  /// Seconds since the first update().
  double elapsed_s() const;
  /// Estimated seconds left from this process's average rate (0 when unknown): steps before the
  /// first update() (a resumed prefix) count neither as work done nor as time spent.
  double eta_s() const;

 private:
  std::string label_;
  int64_t total_;
  int64_t done_ = 0;
  int64_t base_ = -1;  // position at the first update (a resumed run's start)
  bool tty_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
};

/// Formats seconds as "1h02m", "3m05s" or "12.3s".
std::string format_duration(double seconds);

}  // namespace mmpost
