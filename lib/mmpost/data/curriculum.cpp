// Prompt curriculum (see curriculum.h). Randomness is counter-based (splitmix64 of seed, stream,
// epoch/step, slot) rather than a stateful engine, so the checkpointed state is a few integers
// and the sequence is the same on every platform and after any resume.
#include "mmpost/data/curriculum.h"

#include <algorithm>
#include <cmath>

#include "mmpost/core/check.h"

namespace mmpost::data {
namespace {

constexpr int64_t kStateVersion = 1;
constexpr uint64_t kChoiceStream = 0x9E3779B97F4A7C15ULL;  // difficulty draws (adaptive)
constexpr uint64_t kDifficultyStream = 1ULL << 40;         // + difficulty: per-difficulty pools

/// splitmix64's output function (Steele et al., "Fast splittable pseudorandom number generators").
uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

uint64_t hash(uint64_t seed, uint64_t a, uint64_t b, uint64_t c = 0) {
  return mix(seed ^ mix(a ^ mix(b ^ mix(c))));
}

/// Uniform in [0, 1) from the top 53 bits.
double to_unit(uint64_t x) {
  return static_cast<double>(x >> 11) * 0x1.0p-53;
}

/// Uniform in [0, n) (multiply-shift; bias below n / 2^64).
uint64_t below(uint64_t x, uint64_t n) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(x) * n) >> 64);
}

/// Fisher-Yates permutation of `items`, a function of (seed, stream, epoch) only.
std::vector<int64_t> permute(const std::vector<int64_t>& items, uint64_t seed, uint64_t stream,
                             int64_t epoch) {
  std::vector<int64_t> out = items;
  uint64_t state = hash(seed, stream, static_cast<uint64_t>(epoch));
  for (size_t i = out.size(); i > 1; --i) {
    state = mix(state);
    std::swap(out[i - 1], out[below(state, i)]);
  }
  return out;
}

[[noreturn]] void fail(const std::string& path, const std::string& msg,
                       const std::string& hint = "") {
  throw Error(ErrorKind::kUsage, path + ": " + msg, hint);
}

void check_keys(const nlohmann::json& j, const std::string& path,
                const std::vector<std::string>& valid) {
  if (!j.is_object()) fail(path, "expected an object");
  for (const auto& [key, v] : j.items()) {
    if (std::find(valid.begin(), valid.end(), key) != valid.end()) continue;
    std::string names;
    for (const auto& n : valid) names += (names.empty() ? "" : ", ") + n;
    fail(path + "." + key, "unknown key", "valid keys: " + names);
  }
}

double get_number(const nlohmann::json& j, const std::string& key, const std::string& path,
                  double def) {
  if (!j.contains(key)) return def;
  if (!j.at(key).is_number()) fail(path + "." + key, "expected a number");
  return j.at(key).get<double>();
}

int64_t get_int(const nlohmann::json& j, const std::string& key, const std::string& path,
                int64_t def) {
  if (!j.contains(key)) return def;
  if (!j.at(key).is_number_integer()) fail(path + "." + key, "expected an integer");
  return j.at(key).get<int64_t>();
}

CurriculumStage parse_stage(const nlohmann::json& j, const std::string& path) {
  check_keys(j, path, {"difficulties", "until_step", "min_pass_rate"});
  CurriculumStage s;
  const auto& d = j.contains("difficulties") ? j.at("difficulties") : nlohmann::json();
  if (!d.is_array() || d.empty())
    fail(path + ".difficulties", "expected a non-empty array of integers");
  for (const auto& v : d) {
    if (!v.is_number_integer()) fail(path + ".difficulties", "expected integers");
    s.difficulties.push_back(v.get<int64_t>());
  }
  s.until_step = get_int(j, "until_step", path, s.until_step);
  s.min_pass_rate = get_number(j, "min_pass_rate", path, s.min_pass_rate);
  if (s.until_step < 0) fail(path + ".until_step", "must be >= 0 (0: no step limit)");
  if (j.contains("min_pass_rate") && !(s.min_pass_rate >= 0 && s.min_pass_rate <= 1))
    fail(path + ".min_pass_rate", "must be in [0, 1]");
  return s;
}

}  // namespace

// ---- config -------------------------------------------------------------------------------------

CurriculumMode parse_curriculum_mode(const std::string& name) {
  if (name == "none") return CurriculumMode::kNone;
  if (name == "staged") return CurriculumMode::kStaged;
  if (name == "adaptive") return CurriculumMode::kAdaptive;
  throw Error(ErrorKind::kUsage,
              "unknown curriculum mode '" + name + "'; valid: none, staged, adaptive");
}

std::string to_string(CurriculumMode mode) {
  switch (mode) {
    case CurriculumMode::kNone: return "none";
    case CurriculumMode::kStaged: return "staged";
    case CurriculumMode::kAdaptive: return "adaptive";
  }
  return "?";
}

CurriculumConfig parse_curriculum_config(const nlohmann::json& j, const std::string& path) {
  check_keys(j, path,
             {"mode", "stages", "target_pass_rate", "temperature", "estimator", "ema_alpha",
              "window", "min_updates"});
  CurriculumConfig c;
  if (j.contains("mode")) {
    if (!j.at("mode").is_string())
      fail(path + ".mode", "expected a string: none | staged | adaptive");
    try {
      c.mode = parse_curriculum_mode(j.at("mode").get<std::string>());
    } catch (const Error& e) {
      fail(path + ".mode", e.message());
    }
  }
  if (j.contains("stages")) {
    if (!j.at("stages").is_array()) fail(path + ".stages", "expected an array of stages");
    for (size_t k = 0; k < j.at("stages").size(); ++k)
      c.stages.push_back(
          parse_stage(j.at("stages")[k], path + ".stages[" + std::to_string(k) + "]"));
  }
  c.target_pass_rate = get_number(j, "target_pass_rate", path, c.target_pass_rate);
  c.temperature = get_number(j, "temperature", path, c.temperature);
  if (j.contains("estimator")) {
    if (!j.at("estimator").is_string())
      fail(path + ".estimator", "expected a string: ema | window");
    c.estimator = j.at("estimator").get<std::string>();
  }
  c.ema_alpha = get_number(j, "ema_alpha", path, c.ema_alpha);
  c.window = get_int(j, "window", path, c.window);
  c.min_updates = get_int(j, "min_updates", path, c.min_updates);

  if (!(c.target_pass_rate >= 0 && c.target_pass_rate <= 1))
    fail(path + ".target_pass_rate", "must be in [0, 1]");
  if (!(c.temperature >= 0)) fail(path + ".temperature", "must be >= 0 (0: always the nearest)");
  if (c.estimator != "ema" && c.estimator != "window")
    fail(path + ".estimator", "unknown estimator '" + c.estimator + "'", "valid: ema, window");
  if (!(c.ema_alpha > 0 && c.ema_alpha <= 1)) fail(path + ".ema_alpha", "must be in (0, 1]");
  if (c.window < 1) fail(path + ".window", "must be >= 1");
  if (c.min_updates < 1) fail(path + ".min_updates", "must be >= 1");
  if (c.mode == CurriculumMode::kStaged && c.stages.empty())
    fail(path + ".stages", "mode staged needs at least one stage",
         "e.g. [{\"difficulties\": [2], \"until_step\": 100}, {\"difficulties\": [2, 3]}]");
  if (c.mode != CurriculumMode::kStaged && !c.stages.empty())
    fail(path + ".stages", "only mode staged reads stages (mode is " + to_string(c.mode) + ")");
  for (size_t k = 0; k + 1 < c.stages.size(); ++k)
    if (c.stages[k].until_step == 0 && c.stages[k].min_pass_rate < 0)
      fail(path + ".stages[" + std::to_string(k) + "]", "never ends",
           "set until_step or min_pass_rate (only the last stage may have neither)");
  return c;
}

std::map<int64_t, std::vector<int64_t>> group_by_difficulty(
    const std::vector<int64_t>& difficulties) {
  std::map<int64_t, std::vector<int64_t>> out;
  for (size_t i = 0; i < difficulties.size(); ++i)
    out[difficulties[i]].push_back(static_cast<int64_t>(i));
  return out;
}

// ---- curriculum ---------------------------------------------------------------------------------

Curriculum::Curriculum(CurriculumConfig cfg, std::map<int64_t, std::vector<int64_t>> pools,
                       uint64_t seed)
    : cfg_(std::move(cfg)), seed_(seed) {
  for (auto& [d, items] : pools) {
    if (items.empty()) continue;
    std::sort(items.begin(), items.end());
    by_difficulty_[d] = items;
  }
  MMPOST_CHECK_USAGE(!by_difficulty_.empty(), "curriculum: the prompt pool is empty");
  if (cfg_.mode == CurriculumMode::kStaged) {
    MMPOST_CHECK_USAGE(!cfg_.stages.empty(),
                       "curriculum.stages: mode staged needs at least one stage");
    std::string have;
    for (const auto& [d, items] : by_difficulty_)
      have += (have.empty() ? "" : ", ") + std::to_string(d);
    for (size_t k = 0; k < cfg_.stages.size(); ++k)
      for (int64_t d : cfg_.stages[k].difficulties)
        if (!by_difficulty_.count(d))
          throw Error(
              ErrorKind::kUsage,
              detail::cat("curriculum.stages[", k, "].difficulties: no prompt has difficulty ", d),
              "the data has difficulties " + have);
  }
  for (const auto& [d, items] : by_difficulty_) {
    Pool p;
    p.items = items;
    p.order = permute(items, seed_, kDifficultyStream + static_cast<uint64_t>(d), 0);
    difficulty_pools_[d] = std::move(p);
  }
  reset_stage_pool();
}

void Curriculum::reset_stage_pool() {
  stage_pool_ = Pool{};
  for (const auto& [d, items] : by_difficulty_) {
    bool in = cfg_.mode != CurriculumMode::kStaged;  // none (and adaptive, unused): every prompt
    if (!in) {
      const auto& want = cfg_.stages[stage_].difficulties;
      in = std::find(want.begin(), want.end(), d) != want.end();
    }
    if (in) stage_pool_.items.insert(stage_pool_.items.end(), items.begin(), items.end());
  }
  std::sort(stage_pool_.items.begin(), stage_pool_.items.end());
  stage_pool_.order = permute(stage_pool_.items, seed_, 1 + static_cast<uint64_t>(stage_), 0);
}

int64_t Curriculum::take(Pool& pool, uint64_t stream) {
  if (pool.cursor >= static_cast<int64_t>(pool.order.size())) {
    ++pool.epoch;
    pool.cursor = 0;
    pool.order = permute(pool.items, seed_, stream, pool.epoch);
  }
  return pool.order[pool.cursor++];
}

double Curriculum::rate(const Tracker& t) const {
  if (cfg_.estimator == "ema" || t.recent.empty()) return t.ema;
  double sum = 0;
  for (double x : t.recent) sum += x;
  return sum / static_cast<double>(t.recent.size());
}

bool Curriculum::stage_done() const {
  const auto& st = cfg_.stages[stage_];
  if (st.until_step > 0 && step_ >= st.until_step) return true;
  if (st.min_pass_rate < 0) return false;
  double sum = 0;
  for (int64_t d : st.difficulties) {
    auto it = trackers_.find(d);
    if (it == trackers_.end() || it->second.n < cfg_.min_updates) return false;
    sum += rate(it->second);
  }
  return sum / static_cast<double>(st.difficulties.size()) >= st.min_pass_rate;
}

int64_t Curriculum::pick_difficulty(int64_t slot) {
  const uint64_t h =
      hash(seed_, kChoiceStream, static_cast<uint64_t>(step_), static_cast<uint64_t>(slot));
  const double u = to_unit(h);
  // Difficulties with fewer than min_updates outcomes come first, uniformly.
  std::vector<int64_t> unseen, seen;
  for (const auto& [d, items] : by_difficulty_) {
    auto it = trackers_.find(d);
    (it == trackers_.end() || it->second.n < cfg_.min_updates ? unseen : seen).push_back(d);
  }
  if (!unseen.empty()) return unseen[below(h, unseen.size())];
  // Distance of each pass rate from the target; softmax(-dist / T), or the nearest for T = 0.
  std::vector<double> dist;
  for (int64_t d : seen) dist.push_back(std::abs(rate(trackers_.at(d)) - cfg_.target_pass_rate));
  const double best = *std::min_element(dist.begin(), dist.end());
  if (cfg_.temperature == 0) return seen[std::min_element(dist.begin(), dist.end()) - dist.begin()];
  std::vector<double> w;
  double total = 0;
  for (double x : dist) total += w.emplace_back(std::exp(-(x - best) / cfg_.temperature));
  double acc = 0;
  for (size_t k = 0; k < seen.size(); ++k) {
    acc += w[k] / total;
    if (u < acc) return seen[k];
  }
  return seen.back();
}

std::vector<int64_t> Curriculum::next_batch(int64_t batch_size) {
  MMPOST_CHECK(batch_size > 0, "curriculum: batch_size must be > 0, got ", batch_size);
  if (cfg_.mode == CurriculumMode::kStaged) {
    while (stage_ + 1 < static_cast<int64_t>(cfg_.stages.size()) && stage_done()) {
      ++stage_;
      reset_stage_pool();
    }
  }
  std::vector<int64_t> out;
  for (int64_t slot = 0; slot < batch_size; ++slot) {
    if (cfg_.mode == CurriculumMode::kAdaptive) {
      const int64_t d = pick_difficulty(slot);
      out.push_back(take(difficulty_pools_.at(d), kDifficultyStream + static_cast<uint64_t>(d)));
    } else {
      out.push_back(take(stage_pool_, 1 + static_cast<uint64_t>(stage_)));
    }
  }
  ++step_;
  return out;
}

void Curriculum::update(int64_t difficulty, double passed_fraction) {
  MMPOST_CHECK(by_difficulty_.count(difficulty), "curriculum: update for difficulty ", difficulty,
               ", which no prompt has");
  MMPOST_CHECK(passed_fraction >= 0 && passed_fraction <= 1, "curriculum: passed fraction ",
               passed_fraction, " is outside [0, 1]");
  auto& t = trackers_[difficulty];
  t.ema =
      t.n == 0 ? passed_fraction : (1 - cfg_.ema_alpha) * t.ema + cfg_.ema_alpha * passed_fraction;
  ++t.n;
  t.recent.push_back(passed_fraction);
  while (static_cast<int64_t>(t.recent.size()) > cfg_.window) t.recent.pop_front();
}

std::map<int64_t, double> Curriculum::pass_rates() const {
  std::map<int64_t, double> out;
  for (const auto& [d, t] : trackers_) out[d] = rate(t);
  return out;
}

std::map<int64_t, int64_t> Curriculum::update_counts() const {
  std::map<int64_t, int64_t> out;
  for (const auto& [d, t] : trackers_) out[d] = t.n;
  return out;
}

// ---- state --------------------------------------------------------------------------------------

nlohmann::json Curriculum::state() const {
  nlohmann::json trackers = nlohmann::json::array(), pools = nlohmann::json::array();
  for (const auto& [d, t] : trackers_)
    trackers.push_back({{"difficulty", d},
                        {"n", t.n},
                        {"ema", t.ema},
                        {"recent", std::vector<double>(t.recent.begin(), t.recent.end())}});
  for (const auto& [d, p] : difficulty_pools_)
    pools.push_back({{"difficulty", d}, {"epoch", p.epoch}, {"cursor", p.cursor}});
  return {{"version", kStateVersion},
          {"mode", to_string(cfg_.mode)},
          {"seed", seed_},
          {"step", step_},
          {"stage", stage_},
          {"trackers", trackers},
          {"stage_pool", {{"epoch", stage_pool_.epoch}, {"cursor", stage_pool_.cursor}}},
          {"difficulty_pools", pools}};
}

void Curriculum::load_state(const nlohmann::json& s) {
  try {
    MMPOST_CHECK_DATA(s.at("version").get<int64_t>() == kStateVersion, "curriculum state: version ",
                      s.at("version").dump(), ", expected ", kStateVersion);
    MMPOST_CHECK_DATA(s.at("mode").get<std::string>() == to_string(cfg_.mode),
                      "curriculum state: mode '", s.at("mode").get<std::string>(),
                      "' but the recipe says '", to_string(cfg_.mode), "'");
    const int64_t stage = s.at("stage").get<int64_t>();
    MMPOST_CHECK_DATA(stage == 0 || (stage > 0 && stage < static_cast<int64_t>(cfg_.stages.size())),
                      "curriculum state: stage ", stage, " but the recipe has ", cfg_.stages.size(),
                      " stages");
    seed_ = s.at("seed").get<uint64_t>();
    step_ = s.at("step").get<int64_t>();
    stage_ = stage;
    trackers_.clear();
    for (const auto& t : s.at("trackers")) {
      const int64_t d = t.at("difficulty").get<int64_t>();
      MMPOST_CHECK_DATA(by_difficulty_.count(d), "curriculum state: difficulty ", d,
                        " has no prompts");
      auto& tr = trackers_[d];
      tr.n = t.at("n").get<int64_t>();
      tr.ema = t.at("ema").get<double>();
      for (double x : t.at("recent")) tr.recent.push_back(x);
    }
    auto restore = [&](Pool& p, const nlohmann::json& j, uint64_t stream) {
      p.epoch = j.at("epoch").get<int64_t>();
      p.cursor = j.at("cursor").get<int64_t>();
      MMPOST_CHECK_DATA(p.cursor >= 0 && p.cursor <= static_cast<int64_t>(p.items.size()),
                        "curriculum state: cursor ", p.cursor, " beyond a pool of ",
                        p.items.size());
      p.order = permute(p.items, seed_, stream, p.epoch);
    };
    reset_stage_pool();
    restore(stage_pool_, s.at("stage_pool"), 1 + static_cast<uint64_t>(stage_));
    for (const auto& j : s.at("difficulty_pools")) {
      const int64_t d = j.at("difficulty").get<int64_t>();
      MMPOST_CHECK_DATA(difficulty_pools_.count(d), "curriculum state: difficulty ", d,
                        " has no prompts");
      restore(difficulty_pools_.at(d), j, kDifficultyStream + static_cast<uint64_t>(d));
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorKind::kData, std::string("curriculum state: malformed: ") + e.what());
  }
}

}  // namespace mmpost::data
