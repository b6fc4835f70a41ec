// Health checks over a run's metrics for `mmpost report`: the failure signs ML engineers look for
// in post-training curves (loss and gradient spikes, entropy collapse, KL runaway, reward rising
// while eval falls, completions drifting to the length limit, zero-std groups, truncation, skipped
// samples, non-finite values), each as a pure function of series that returns the steps where it
// fired. Thresholds live once, in HealthThresholds; the README section "See a run" lists them.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "mmpost/report/metrics.h"

namespace mmpost::report {

/// Every threshold of the health checks, with the defaults `mmpost report` uses.
struct HealthThresholds {
  /// Spikes (loss, grad_norm, grad_norm/<part>): a value fires when
  ///   value > level + max(spike_k x noise, spike_min_rel x |level|)
  /// where level = the median of the previous `spike_level` logged values and noise = the median
  /// of |x_j - x_{j-1}| over the previous `spike_window` values (the current one excluded; at
  /// least `spike_level` values needed). The noise scale of consecutive differences is a MAD that
  /// a falling or rising trend does not inflate (for Gaussian noise it is ~0.95 sigma, so k = 8
  /// is ~7.6 sigma); the level follows the curve down, so a 3x jump late in a falling loss
  /// fires; the relative floor keeps a flat series (noise ~ 0) from firing on rounding wiggles.
  int64_t spike_window = 20;
  int64_t spike_level = 5;
  double spike_k = 8.0;
  double spike_min_rel = 0.10;
  /// Entropy collapse (rlhf `entropy`, nats per token): fires where entropy <
  /// entropy_collapse_ratio x the first logged entropy (the policy lost 90% of its randomness:
  /// rollouts repeat, group rewards go all-equal, exploration stops).
  double entropy_collapse_ratio = 0.10;
  /// KL runaway (rlhf `kl`, `kl_full`: policy vs reference, nats per token): fires where the KL
  /// exceeds kl_max. GRPO/PPO runs with beta ~ 0.01-0.1 usually stay below ~0.1.
  double kl_max = 0.5;
  /// Reward up, eval down: at eval step s_i (i >= 2) it fires when the eval metric fell
  ///   e_i < e_{i-1} - max(eval_drop_min, eval_drop_se * sqrt(e_{i-1} (1 - e_{i-1}) / n))
  /// (n = eval/n at s_i when logged: a drop larger than two binomial standard errors of the
  /// eval set, not eval noise) while the training reward's mean over (s_{i-1}, s_i] exceeds its
  /// mean over (s_{i-2}, s_{i-1}] (s_0 = 0) by more than reward_rise.
  double eval_drop_min = 0.02;
  double eval_drop_se = 2.0;
  double reward_rise = 0.01;
  /// Completion length at the limit (rlhf): completions/mean_length >=
  /// length_frac x rlhf.max_completion_length (from recipe.json).
  double length_frac = 0.90;
  /// Zero-std groups (rlhf): frac_reward_zero_std > zero_std_max (more than half the groups
  /// give no GRPO/RLOO gradient: all their completions scored the same).
  double zero_std_max = 0.50;
  /// Truncation (rlhf): completions/clipped_ratio > truncation_max (completions that hit
  /// max_completion_length without an end token).
  double truncation_max = 0.20;
};

/// Steps of `s` whose value is a spike (HealthThresholds::spike_*). NaNs never fire and are not
/// part of any window.
std::vector<int64_t> spike_steps(const Series& s, const HealthThresholds& t);
/// Steps where `entropy` < ratio x its first finite value (none when that value is <= 0).
std::vector<int64_t> entropy_collapse_steps(const Series& entropy, const HealthThresholds& t);
/// Steps where the value is > limit (`at_least`: >= limit).
std::vector<int64_t> steps_above(const Series& s, double limit, bool at_least = false);
/// Eval steps where `eval` fell while `train_reward` rose (HealthThresholds::eval_drop_*,
/// reward_rise); `eval_n` (may be nullptr) gives the eval set size per eval step.
std::vector<int64_t> reward_up_eval_down_steps(const Series& train_reward, const Series& eval,
                                               const Series* eval_n, const HealthThresholds& t);
/// Steps where a cumulative count grew (its first row counts when > 0): `skipped`.
std::vector<int64_t> increase_steps(const Series& count);
/// Steps whose value is NaN or infinite.
std::vector<int64_t> non_finite_steps(const Series& s);

/// Outcome of one check on one run.
enum class CheckStatus { kOk, kFired, kNotApplicable };

/// One check on one run: which metrics it read, where it fired, and why (one line).
struct CheckResult {
  std::string id;     ///< stable name for scripts: "loss_spike", "kl_runaway", ...
  std::string title;  ///< "Loss spike"
  std::string rule;   ///< the threshold in words, with the numbers
  CheckStatus status = CheckStatus::kNotApplicable;
  std::vector<std::string> metrics;                   ///< metrics read
  std::vector<int64_t> steps;                         ///< where it fired, ascending, unique
  std::map<std::string, std::vector<int64_t>> marks;  ///< metric -> steps to mark on its plot
  std::string detail;  ///< the worst or first firing ("loss 9.1 at step 140, window median 2.3")
                       ///< or why the check does not apply
};

/// Runs every check on `run` (the list and order are fixed, whatever the stage; a check whose
/// metrics the run did not log is kNotApplicable).
std::vector<CheckResult> check_health(const RunMetrics& run, const HealthThresholds& t = {});

/// "ok" | "fired" | "n/a".
std::string to_string(CheckStatus s);

}  // namespace mmpost::report
