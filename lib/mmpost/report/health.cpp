// Health checks of `mmpost report` (see health.h for each rule and its threshold): pure functions
// over series, then check_health() wiring them to the metrics each stage logs.
#include "mmpost/report/health.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <set>
#include <sstream>

namespace mmpost::report {
namespace {

double median(std::vector<double> v) {
  const size_t n = v.size(), mid = n / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  if (n % 2 == 1) return v[mid];
  const double hi = v[mid];
  return (*std::max_element(v.begin(), v.begin() + mid) + hi) / 2;
}

/// The spike threshold after the previous values `window` (oldest first, at least spike_level,
/// at most max(spike_window, spike_level)).
double spike_threshold(const std::deque<double>& window, const HealthThresholds& t) {
  const auto n_level = static_cast<std::ptrdiff_t>(std::min<size_t>(window.size(), t.spike_level));
  const double level = median(std::vector<double>(window.end() - n_level, window.end()));
  std::vector<double> diffs;
  const size_t first = window.size() - std::min<size_t>(window.size(), t.spike_window);
  for (size_t j = first + 1; j < window.size(); ++j) diffs.push_back(std::abs(window[j] - window[j - 1]));
  const double noise = diffs.empty() ? 0.0 : median(diffs);
  return level + std::max({t.spike_k * noise, t.spike_min_rel * std::abs(level), 1e-12});
}

std::string num(double v) {
  std::ostringstream os;
  os.precision(4);
  os << v;
  return os.str();
}

/// The value of `s` at `step` (NaN when it has none).
double value_at(const Series& s, int64_t step) {
  auto it = std::lower_bound(s.steps.begin(), s.steps.end(), static_cast<double>(step));
  if (it == s.steps.end() || *it != static_cast<double>(step)) return std::nan("");
  return s.values[static_cast<size_t>(it - s.steps.begin())];
}

/// Mean of the finite values of `s` with step in (lo, hi]; false when there is none.
bool interval_mean(const Series& s, double lo, double hi, double& mean) {
  double sum = 0;
  int64_t n = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s.steps[i] > lo && s.steps[i] <= hi && std::isfinite(s.values[i])) {
      sum += s.values[i];
      ++n;
    }
  }
  if (n > 0) mean = sum / static_cast<double>(n);
  return n > 0;
}

CheckResult new_check(std::string id, std::string title, std::string rule) {
  CheckResult c;
  c.id = std::move(id);
  c.title = std::move(title);
  c.rule = std::move(rule);
  return c;
}

/// Records that `c` fired for `metric` at `steps` (with `detail` for the first firing seen).
void fire(CheckResult& c, const std::string& metric, const std::vector<int64_t>& steps,
          const std::string& detail) {
  if (steps.empty()) return;
  c.status = CheckStatus::kFired;
  auto& m = c.marks[metric];
  m.insert(m.end(), steps.begin(), steps.end());
  std::set<int64_t> all(c.steps.begin(), c.steps.end());
  all.insert(steps.begin(), steps.end());
  c.steps.assign(all.begin(), all.end());
  if (c.detail.empty()) c.detail = detail;
}

/// A check over the metrics `names` that the run logged: kOk unless `one` fires on one of them;
/// kNotApplicable (with `why_na`) when none was logged.
template <class F>
CheckResult check_each(const RunMetrics& run, std::string id, std::string title, std::string rule,
                       const std::vector<std::string>& names, const std::string& why_na, F one) {
  CheckResult c = new_check(std::move(id), std::move(title), std::move(rule));
  for (const auto& name : names) {
    const Series* s = run.find(name);
    if (s == nullptr) continue;
    c.metrics.push_back(name);
    if (c.status == CheckStatus::kNotApplicable) c.status = CheckStatus::kOk;
    auto steps = one(name, *s);
    if (!steps.empty()) {
      fire(c, name, steps,
           name + " " + num(value_at(*s, steps.front())) + " at step " +
               std::to_string(steps.front()) +
               (steps.size() > 1 ? " (" + std::to_string(steps.size()) + " steps)" : ""));
    }
  }
  if (c.metrics.empty()) c.detail = why_na;
  return c;
}

/// A check that fires where one of `names` exceeds `limit`; the rule reads "NAME > LIMIT WHY".
CheckResult above_check(const RunMetrics& run, std::string id, std::string title,
                        const std::vector<std::string>& names, double limit,
                        const std::string& why, const std::string& why_na) {
  return check_each(run, std::move(id), std::move(title), names[0] + " > " + num(limit) + " " + why,
                    names, why_na,
                    [&](const std::string&, const Series& s) { return steps_above(s, limit); });
}

std::vector<std::string> grad_norm_names(const RunMetrics& run) {
  std::vector<std::string> names = {"grad_norm"};
  for (const auto& [name, s] : run.series) {
    if (name.rfind("grad_norm/", 0) == 0) names.push_back(name);
  }
  return names;
}

CheckResult reward_vs_eval(const RunMetrics& run, const HealthThresholds& t) {
  // The training signal that should track the eval metric, per stage; sft's is -loss.
  std::string reward = "reward", eval = "eval/accuracy";
  if (run.stage == "dpo") reward = "rewards/margins", eval = "eval/rewards/accuracies";
  if (run.stage == "rm") reward = "accuracy";
  if (run.stage == "sft" || run.stage.empty()) reward = "loss";
  CheckResult c = new_check(
      "reward_up_eval_down", "Reward up, eval down",
      "at an eval step, eval fell by more than max(" + num(t.eval_drop_min) +
                        ", " + num(t.eval_drop_se) +
                        " binomial standard errors) since the previous eval while the mean "
                        "training " + (reward == "loss" ? std::string("-loss") : reward) +
                        " since then rose by more than " + num(t.reward_rise));
  const Series* r = run.find(reward);
  const Series* e = run.find(eval);
  if (r == nullptr || e == nullptr || e->size() < 2) {
    c.detail = "needs " + reward + " and at least two " + eval + " rows";
    return c;
  }
  c.status = CheckStatus::kOk;
  c.metrics = {reward, eval};
  Series signal = *r;
  if (reward == "loss") {
    for (double& v : signal.values) v = -v;
  }
  auto steps = reward_up_eval_down_steps(signal, *e, run.find("eval/n"), t);
  if (!steps.empty()) {
    const int64_t s = steps.front();
    fire(c, eval, steps, eval + " fell to " + num(value_at(*e, s)) + " at step " +
                              std::to_string(s) + " while " + reward +
                              (reward == "loss" ? " fell" : " rose"));
    c.marks[reward] = steps;
  }
  return c;
}

CheckResult length_at_limit(const RunMetrics& run, const HealthThresholds& t) {
  const nlohmann::json* limit_j = json_at(run.recipe, "rlhf.max_completion_length");
  const int64_t limit = limit_j && limit_j->is_number_integer() ? limit_j->get<int64_t>() : 0;
  const std::string rule = "completions/mean_length >= " + num(t.length_frac) +
                           " x rlhf.max_completion_length" +
                           (limit > 0 ? " (" + num(t.length_frac * limit) + " tokens)" : "");
  auto c = check_each(run, "length_at_limit", "Completions at the length limit", rule,
                      {"completions/mean_length"}, "rlhf only (completions/mean_length)",
                      [&](const std::string&, const Series& s) {
                        return limit > 0 ? steps_above(s, t.length_frac * limit, true)
                                         : std::vector<int64_t>{};
                      });
  if (c.status != CheckStatus::kNotApplicable && limit <= 0) {
    c.status = CheckStatus::kNotApplicable;
    c.detail = "no rlhf.max_completion_length in recipe.json";
  }
  return c;
}

}  // namespace

std::vector<int64_t> spike_steps(const Series& s, const HealthThresholds& t) {
  std::vector<int64_t> out;
  std::deque<double> window;
  for (size_t i = 0; i < s.size(); ++i) {
    const double v = s.values[i];
    if (!std::isfinite(v)) continue;
    if (static_cast<int64_t>(window.size()) >= std::max<int64_t>(1, t.spike_level) &&
        v > spike_threshold(window, t)) {
      out.push_back(static_cast<int64_t>(s.steps[i]));
    }
    window.push_back(v);
    if (static_cast<int64_t>(window.size()) > std::max(t.spike_window, t.spike_level)) {
      window.pop_front();
    }
  }
  return out;
}

std::vector<int64_t> entropy_collapse_steps(const Series& entropy, const HealthThresholds& t) {
  std::vector<int64_t> out;
  double first = std::nan("");
  for (size_t i = 0; i < entropy.size(); ++i) {
    const double v = entropy.values[i];
    if (!std::isfinite(v)) continue;
    if (std::isnan(first)) first = v;
    if (first > 0 && v < t.entropy_collapse_ratio * first) {
      out.push_back(static_cast<int64_t>(entropy.steps[i]));
    }
  }
  return out;
}

std::vector<int64_t> steps_above(const Series& s, double limit, bool at_least) {
  std::vector<int64_t> out;
  for (size_t i = 0; i < s.size(); ++i) {
    const double v = s.values[i];
    if (std::isfinite(v) && (at_least ? v >= limit : v > limit)) {
      out.push_back(static_cast<int64_t>(s.steps[i]));
    }
  }
  return out;
}

std::vector<int64_t> reward_up_eval_down_steps(const Series& train_reward, const Series& eval,
                                               const Series* eval_n, const HealthThresholds& t) {
  std::vector<double> steps, values;  // the finite eval points
  for (size_t i = 0; i < eval.size(); ++i) {
    if (std::isfinite(eval.values[i])) {
      steps.push_back(eval.steps[i]);
      values.push_back(eval.values[i]);
    }
  }
  std::vector<int64_t> out;
  for (size_t j = 1; j < steps.size(); ++j) {
    const double prev = values[j - 1];
    const double n = eval_n ? value_at(*eval_n, static_cast<int64_t>(steps[j])) : std::nan("");
    const double se =
        std::isfinite(n) && n > 0 ? std::sqrt(std::max(0.0, prev * (1 - prev)) / n) : 0.0;
    const bool fell = values[j] < prev - std::max(t.eval_drop_min, t.eval_drop_se * se);
    double now = 0, before = 0;
    const bool rose =
        interval_mean(train_reward, steps[j - 1], steps[j], now) &&
        interval_mean(train_reward, j >= 2 ? steps[j - 2] : 0.0, steps[j - 1], before) &&
        now - before > t.reward_rise;
    if (fell && rose) out.push_back(static_cast<int64_t>(steps[j]));
  }
  return out;
}

std::vector<int64_t> increase_steps(const Series& count) {
  std::vector<int64_t> out;
  double prev = 0;
  for (size_t i = 0; i < count.size(); ++i) {
    const double v = count.values[i];
    if (!std::isfinite(v)) continue;
    if (v > prev) out.push_back(static_cast<int64_t>(count.steps[i]));
    prev = v;
  }
  return out;
}

std::vector<int64_t> non_finite_steps(const Series& s) {
  std::vector<int64_t> out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (!std::isfinite(s.values[i])) out.push_back(static_cast<int64_t>(s.steps[i]));
  }
  return out;
}

std::vector<CheckResult> check_health(const RunMetrics& run, const HealthThresholds& t) {
  const std::string spike_rule =
      "value > level + max(" + num(t.spike_k) + " x noise, " + num(t.spike_min_rel) +
      " x |level|); level = median of the previous " + std::to_string(t.spike_level) +
      " values, noise = median |step-to-step change| over the previous " +
      std::to_string(t.spike_window);
  auto spikes = [&](const std::string&, const Series& s) { return spike_steps(s, t); };
  std::vector<CheckResult> out;
  // rlhf's policy-gradient loss is ~0 by construction (mean advantage 0): no scale for a spike.
  out.push_back(check_each(run, "loss_spike", "Loss spike", spike_rule,
                           {run.stage == "rlhf" ? "value_loss" : "loss"},
                           run.stage == "rlhf" ? "rlhf: the policy loss has no scale of its own "
                                                 "(see grad_norm); PPO's value_loss is checked"
                                               : "no loss logged",
                           spikes));
  out.push_back(check_each(run, "grad_norm_spike", "Gradient-norm spike", spike_rule,
                           grad_norm_names(run), "no grad_norm logged", spikes));
  out.push_back(check_each(
      run, "entropy_collapse", "Entropy collapse",
      "entropy < " + num(t.entropy_collapse_ratio) + " x its first logged value", {"entropy"},
      "rlhf only (entropy)",
      [&](const std::string&, const Series& s) { return entropy_collapse_steps(s, t); }));
  out.push_back(above_check(run, "kl_runaway", "KL runaway", {"kl", "kl_full"}, t.kl_max,
                            "nats per token (policy vs reference)", "rlhf with a KL term only (kl)"));
  out.push_back(reward_vs_eval(run, t));
  out.push_back(length_at_limit(run, t));
  out.push_back(above_check(run, "zero_std_groups", "Many zero-std groups",
                            {"frac_reward_zero_std"}, t.zero_std_max,
                            "(groups whose rewards are all equal give no gradient)",
                            "rlhf only (frac_reward_zero_std)"));
  out.push_back(above_check(run, "truncation", "High truncation", {"completions/clipped_ratio"},
                            t.truncation_max, "(completions cut at max_completion_length)",
                            "rlhf only (completions/clipped_ratio)"));
  out.push_back(check_each(run, "skipped_samples", "Skipped samples",
                           "the cumulative skipped count grew (data.on_bad_sample: skip)",
                           {"skipped"}, "no skipped count logged",
                           [](const std::string&, const Series& s) { return increase_steps(s); }));
  std::vector<std::string> all;
  for (const auto& [name, s] : run.series) all.push_back(name);
  out.push_back(check_each(run, "non_finite", "Non-finite values",
                           "a metric is NaN or infinite (null in metrics.jsonl)", all,
                           "no metrics yet",
                           [](const std::string&, const Series& s) { return non_finite_steps(s); }));
  return out;
}

std::string to_string(CheckStatus s) {
  switch (s) {
    case CheckStatus::kOk: return "ok";
    case CheckStatus::kFired: return "fired";
    case CheckStatus::kNotApplicable: return "n/a";
  }
  return "n/a";
}

}  // namespace mmpost::report
