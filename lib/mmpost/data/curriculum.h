// Prompt-level curriculum for `mmpost rlhf` over an integer `difficulty` per prompt: uniform
// sampling (none), fixed stages that advance by step or pass rate (staged), or sampling the
// difficulties whose online pass rate is nearest a target (adaptive, in the spirit of DAPO's
// dynamic sampling and "learnability" curricula). Deterministic from the seed; the whole state
// round-trips through JSON for checkpoints.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

namespace mmpost::data {

enum class CurriculumMode { kNone, kStaged, kAdaptive };

/// "none" | "staged" | "adaptive"; throws Error(kUsage) listing the valid names.
CurriculumMode parse_curriculum_mode(const std::string& name);
std::string to_string(CurriculumMode mode);

/// One stage of a staged curriculum. It ends (the next stage begins) when either condition set
/// here holds; the last stage never ends.
struct CurriculumStage {
  std::vector<int64_t> difficulties;  // prompts served: those with one of these difficulties
  int64_t until_step = 0;             // > 0: serve batches for steps < until_step (global step)
  double min_pass_rate = -1;          // >= 0: end once the mean pass rate over `difficulties`
                                      //   reaches it, each difficulty having >= min_updates updates
};

/// Recipe section `curriculum`; defaults live here.
struct CurriculumConfig {
  CurriculumMode mode = CurriculumMode::kNone;
  std::vector<CurriculumStage> stages;  // staged only, in order
  double target_pass_rate = 0.5;  // adaptive: favour difficulties whose pass rate is nearest this
  double temperature = 0.1;       // adaptive: softmax(-|rate - target| / temperature); 0 = argmin
  std::string estimator = "ema";  // pass rate per difficulty: "ema" or "window" (mean of last N)
  double ema_alpha = 0.1;         // ema: rate <- (1 - alpha) rate + alpha x; the first x sets it
  int64_t window = 32;            // window: updates averaged
  int64_t min_updates = 4;        // updates before a difficulty counts as seen (adaptive, staged)
};

/// Parses the `curriculum` JSON object strictly (unknown keys, wrong types and bad values throw
/// Error(kUsage) naming the JSON path under `path`).
CurriculumConfig parse_curriculum_config(const nlohmann::json& j,
                                         const std::string& path = "curriculum");

/// Groups prompt indices 0..N-1 by their difficulty.
std::map<int64_t, std::vector<int64_t>> group_by_difficulty(
    const std::vector<int64_t>& difficulties);

/// Chooses the prompts of each batch. Prompts are drawn without replacement within a pool (the
/// stage's prompts for none/staged, one pool per difficulty for adaptive): each pool is walked in
/// a seeded permutation that is redrawn at every pass ("epoch"), so all state is a few counters.
class Curriculum {
 public:
  /// `pools`: difficulty -> prompt indices (group_by_difficulty). Throws Error(kUsage) when a
  /// stage names a difficulty without prompts, or the config is inconsistent.
  Curriculum(CurriculumConfig cfg, std::map<int64_t, std::vector<int64_t>> pools, uint64_t seed);

  /// The prompt indices of the next training step's batch (advances the staged stage first).
  std::vector<int64_t> next_batch(int64_t batch_size);
  /// Records one prompt's outcome: the fraction of its completions that passed, in [0, 1].
  /// Throws Error(kRuntime) for a difficulty that has no pool or a fraction outside [0, 1].
  void update(int64_t difficulty, double passed_fraction);

  int64_t step() const { return step_; }            // batches handed out so far
  int64_t current_stage() const { return stage_; }  // 0 unless staged
  /// Difficulty -> current pass-rate estimate, for difficulties with at least one update.
  std::map<int64_t, double> pass_rates() const;
  /// Difficulty -> number of updates received.
  std::map<int64_t, int64_t> update_counts() const;

  /// Everything needed to continue identically: seed, step, stage, pass-rate trackers, and each
  /// pool's permutation epoch and cursor.
  nlohmann::json state() const;
  /// Restores `state()`; throws Error(kData) when it does not fit this config or these pools.
  void load_state(const nlohmann::json& state);

 private:
  struct Tracker {
    double ema = 0;
    int64_t n = 0;
    std::deque<double> recent;  // window estimator
  };
  struct Pool {
    std::vector<int64_t> items;  // sorted prompt indices
    int64_t epoch = 0, cursor = 0;
    std::vector<int64_t> order;  // permutation of items for `epoch`
  };

  double rate(const Tracker& t) const;
  bool stage_done() const;
  int64_t pick_difficulty(int64_t slot);
  int64_t take(Pool& pool, uint64_t stream);
  void reset_stage_pool();

  CurriculumConfig cfg_;
  std::map<int64_t, std::vector<int64_t>> by_difficulty_;
  uint64_t seed_;
  int64_t step_ = 0, stage_ = 0;
  std::map<int64_t, Tracker> trackers_;
  Pool stage_pool_;                           // none / staged: the current stage's prompts
  std::map<int64_t, Pool> difficulty_pools_;  // adaptive
};

}  // namespace mmpost::data
