// mmpost rm: trains a Bradley-Terry reward model (the VLM + a scalar `score` head read at the last
// real token, as HF *ForSequenceClassification) on TRL preference JSONL, optionally with a
// per-record "margin". The stage is the loop: setup -> model + head -> data -> optimizer ->
// resume -> loop -> final save. Each micro-batch is one concatenated forward (chosen rows on
// rejected rows, one vision pass per image); the loss is algo::bradley_terry_loss (TRL
// RewardTrainer). The output folder is a reward-model folder (model/reward_model.h) that
// `mmpost rlhf` loads with model::load_reward_model.
#include <chrono>
#include <cmath>
#include <filesystem>

#include "mmpost/algo/reward_loss.h"
#include "mmpost/cli_common.h"
#include "mmpost/config/recipe.h"
#include "mmpost/config/schema.h"
#include "mmpost/core/check.h"
#include "mmpost/core/device.h"
#include "mmpost/core/log.h"
#include "mmpost/core/signals.h"
#include "mmpost/data/loader.h"
#include "mmpost/data/preference_dataset.h"
#include "mmpost/io/checkpoint.h"
#include "mmpost/io/jsonl.h"
#include "mmpost/model/reward_model.h"
#include "mmpost/stage_common.h"
#include "mmpost/train/checkpointing.h"
#include "mmpost/train/optimizer.h"

namespace mmpost::cli {
namespace fs = std::filesystem;

namespace {

/// A preference pair plus the record's optional "margin" (TRL RewardTrainer).
struct RmSample {
  data::PreferenceSample pair;
  double margin = 0.0;
  bool has_margin = false;
};

RmSample make_rm_sample(const nlohmann::json& rec, int64_t line, const data::SampleContext& ctx,
                        const data::PreferenceLimits& limits) {
  RmSample s{data::make_preference_sample(rec, line, ctx, limits)};
  if (rec.is_object() && rec.contains("margin") && !rec["margin"].is_null()) {
    MMPOST_CHECK_DATA(rec["margin"].is_number(), ctx.source, ":", line,
                      ": \"margin\" must be a number, got ", rec["margin"].dump());
    s.margin = rec["margin"].get<double>();
    s.has_margin = true;
  }
  return s;
}

/// A collated batch [2B rows] and its margins [B] (undefined when no pair has one).
struct RmBatch {
  data::PreferenceBatch b;
  torch::Tensor margin;
};

RmBatch collate_rm(const std::vector<RmSample>& samples, int64_t pad_id,
                   const torch::Device& device, torch::Dtype dtype) {
  std::vector<data::PreferenceSample> pairs;
  std::vector<double> margins;
  bool any_margin = false;
  for (const auto& s : samples) {
    pairs.push_back(s.pair);
    margins.push_back(s.margin);
    any_margin = any_margin || s.has_margin;
  }
  RmBatch r{data::collate_preference(pairs, pad_id).to(device, dtype)};
  if (any_margin) r.margin = torch::tensor(margins, torch::kFloat32).to(device);
  return r;
}

/// One concatenated forward: rewards [2B] float32, rows [0, B) chosen, [B, 2B) rejected. The
/// vision tower runs once per image; its features serve both rows of the pair.
torch::Tensor pair_rewards(model::RewardModel& rm, const data::PreferenceBatch& b) {
  torch::Tensor features;  // [N, P, C]
  if (b.pixel_values.defined()) features = rm->model->image_features(b.pixel_values);
  torch::Tensor row_features;
  if (features.defined()) row_features = torch::cat({features, features});
  return rm->forward_features(b.input_ids, row_features, b.attention_mask);
}

/// Pairwise accuracy and reward statistics on a preference JSONL, in file order, no grad.
struct RmEvalResult {
  int64_t n = 0, n_skipped = 0;
  double loss = 0, accuracy = 0, margin = 0, reward_chosen = 0, reward_rejected = 0;
};

RmEvalResult evaluate_rm(model::RewardModel& rm, data::SampleContext ctx, const std::string& path,
                         const data::PreferenceLimits& limits, const config::RmConfig& cfg,
                         int64_t pad_id, const torch::Device& device, torch::Dtype dtype) {
  ctx.source = path;
  ctx.base_dir = fs::path(path).parent_path();
  ctx.random_shift = 0;
  data::LoaderOptions lo;
  lo.path = path;
  lo.batch_size = cfg.train.batch_size;
  lo.num_workers = cfg.data.num_workers;
  lo.skip_bad = cfg.data.on_bad_sample == "skip";
  data::StreamingLoader<RmSample> loader(lo, [&](const nlohmann::json& rec, int64_t line) {
    return make_rm_sample(rec, line, ctx, limits);
  });
  const int64_t max_n = cfg.train.eval_max_samples;
  const bool was_training = rm->is_training();
  rm->eval();
  torch::NoGradGuard no_grad;
  RmEvalResult r;
  while (max_n <= 0 || r.n < max_n) {
    auto samples = loader.next_batch();
    if (!samples) break;
    if (max_n > 0 && r.n + static_cast<int64_t>(samples->size()) > max_n) {
      samples->resize(max_n - r.n);
    }
    auto rb = collate_rm(*samples, pad_id, device, dtype);
    const int64_t B = rb.b.batch_size;
    auto rewards = pair_rewards(rm, rb.b).to(torch::kFloat64).cpu();
    auto rc = rewards.narrow(0, 0, B), rr = rewards.narrow(0, B, B);
    auto margin = rb.margin.defined() ? rb.margin.cpu() : torch::Tensor();
    r.loss += algo::bradley_terry_loss(rc, rr, margin, cfg.rm.center_rewards_coefficient)
                  .loss.item<double>() * B;
    r.accuracy += (rc > rr).sum().item<double>();
    r.margin += (rc - rr).sum().item<double>();
    r.reward_chosen += rc.sum().item<double>();
    r.reward_rejected += rr.sum().item<double>();
    r.n += B;
  }
  if (was_training) rm->train();
  r.n_skipped = loader.n_skipped();
  if (r.n > 0) {
    for (double* v : {&r.loss, &r.accuracy, &r.margin, &r.reward_chosen, &r.reward_rejected}) {
      *v /= static_cast<double>(r.n);
    }
  }
  return r;
}

/// train::save_checkpoint for a reward model: the same folder (HF model, optimizer.pt, rng.pt,
/// state.json read by train::read_train_state) plus the score head, with DONE written last so a
/// checkpoint resume trusts always has its head.
fs::path save_rm_checkpoint(const fs::path& output_dir, const train::TrainState& state,
                            model::RewardModel& rm, const StageModel& sm,
                            torch::optim::Optimizer& optimizer, const nlohmann::json& recipe,
                            int64_t keep_last) {
  fs::path dir = io::step_dir(output_dir, state.step);
  if (fs::exists(dir)) fs::remove_all(dir);  // a stale, incomplete folder from a crash
  model::save_reward_model(dir, rm, sm.tokenizer_path, sm.image, sm.tokenizer.get());
  try {
    torch::save(optimizer, (dir / "optimizer.pt").string());
    torch::save(at::detail::getDefaultCPUGenerator().get_state(), (dir / "rng.pt").string());
  } catch (const c10::Error& e) {
    throw Error(ErrorKind::kRuntime, dir.string() + ": cannot write optimizer/RNG state: " +
                                         e.what_without_backtrace(),
                "check free disk space; the previous checkpoint is intact");
  }
  nlohmann::json j = {{"format_version", train::kStateFormatVersion},
                      {"step", state.step},
                      {"loader",
                       {{"epoch", state.loader.epoch}, {"consumed", state.loader.consumed}}},
                      {"n_skipped", state.n_skipped},
                      {"tokens_seen", state.tokens_seen},
                      {"extra", state.extra},
                      {"recipe", recipe}};
  io::write_text_atomic(dir / "state.json", j.dump(2) + "\n");
  io::mark_done(dir);
  io::prune_checkpoints(output_dir, static_cast<int>(keep_last));
  return dir;
}

/// Running means of the logged quantities between two log lines.
struct MetricWindow {
  std::map<std::string, double> sum;
  int64_t n = 0;
  void add(const std::string& k, double v) { sum[k] += v; }
};

}  // namespace

/// Trains a reward model for a validated recipe; returns the exit code (0, or 128 + signal).
int run_rm(const config::RmConfig& cfg, bool allow_resume) {
  // ---- setup -------------------------------------------------------------------------------
  install_stop_handlers();
  if (cfg.num_threads > 0) torch::set_num_threads(static_cast<int>(cfg.num_threads));
  const torch::Device device = resolve_device(cfg.device);
  const torch::Dtype dtype = resolve_dtype(cfg.dtype, device);
  seed_everything(static_cast<uint64_t>(cfg.seed));
  MMPOST_CHECK_USAGE(!cfg.model.path.empty(),
                     "model.path: a reward model starts from a trained model (an SFT output "
                     "folder, any supported HF checkpoint, or a reward model to continue)");
  MMPOST_CHECK_USAGE(cfg.data.eval.empty() || fs::is_regular_file(cfg.data.eval), "data.eval: ",
                     cfg.data.eval, ": no such file (checked before training, not after)");
  const fs::path out = cfg.output_dir;
  fs::create_directories(out);
  const nlohmann::json recipe = config::to_json(cfg);
  io::write_text_atomic(out / "recipe.json", recipe.dump(2) + "\n");
  log_info("rm: resolved recipe\n" + config::format_table(config::to_rows(cfg)));
  std::optional<fs::path> ckpt;
  if (allow_resume) ckpt = io::latest_complete_checkpoint(out);

  // ---- model + score head ------------------------------------------------------------------
  auto sm = load_stage_model(cfg.model, cfg.data.image, ckpt, device, dtype, "rm");
  data::Tokenizer& tokenizer = *sm.tokenizer;
  model::RewardModel rm(sm.model);  // score ~ N(0, 0.02^2), seeded above
  const fs::path head_src = ckpt ? *ckpt : fs::path(cfg.model.path);
  if (ckpt || model::has_reward_head(head_src)) {
    model::load_reward_head(rm, head_src);
    log_info("rm: score head from " + head_src.string());
  } else {
    log_info("rm: new score head Linear(" +
             std::to_string(sm.model->config().text_config.hidden_size) + ", 1), N(0, 0.02^2)");
  }
  rm->train();

  // ---- data --------------------------------------------------------------------------------
  const int64_t pad_id = pad_id_of(tokenizer);
  data::SampleContext ctx = make_sample_context(sm, cfg.data, cfg.data.train);
  data::SampleContext train_ctx = ctx;
  train_ctx.random_shift = cfg.data.image.random_shift;
  const data::PreferenceLimits limits{cfg.rm.max_prompt_length, cfg.rm.max_completion_length,
                                      cfg.data.max_length};
  data::LoaderOptions lo;
  lo.path = cfg.data.train;
  lo.batch_size = cfg.train.batch_size;
  lo.num_workers = cfg.data.num_workers;
  lo.shuffle_buffer = cfg.data.shuffle_buffer;
  lo.prefetch = cfg.data.prefetch;
  lo.seed = static_cast<uint64_t>(cfg.seed);
  lo.skip_bad = cfg.data.on_bad_sample == "skip";
  lo.repeat = true;
  data::StreamingLoader<RmSample> loader(
      lo, [&](const nlohmann::json& rec, int64_t line) {
        return make_rm_sample(rec, line, train_ctx, limits);
      });
  const int64_t n_records = data::count_records(cfg.data.train);
  const int64_t per_step = cfg.train.batch_size * cfg.train.gradient_accumulation_steps;
  const int64_t total_steps =
      cfg.train.max_steps > 0
          ? cfg.train.max_steps
          : std::max<int64_t>(1, static_cast<int64_t>(std::ceil(cfg.train.epochs * n_records /
                                                               static_cast<double>(per_step))));
  log_info("rm: " + std::to_string(n_records) + " preference pairs, " + std::to_string(per_step) +
           " pairs/step, " + std::to_string(total_steps) + " steps; Bradley-Terry loss" +
           (cfg.rm.center_rewards_coefficient > 0
                ? " + " + fmt(cfg.rm.center_rewards_coefficient, 3) + " * centering"
                : std::string()));

  // ---- optimizer ---------------------------------------------------------------------------
  std::vector<std::pair<std::string, torch::Tensor>> named;
  std::vector<torch::Tensor> trainable;
  auto named_items = rm->named_parameters(/*recurse=*/true);  // keep alive while iterating
  for (auto& item : named_items.items()) {
    named.emplace_back(item.key(), item.value());
    if (item.value().requires_grad()) trainable.push_back(item.value());
  }
  auto optimizer = train::make_adamw(
      named, {cfg.optim.lr, cfg.optim.betas[0], cfg.optim.betas[1], cfg.optim.eps,
              cfg.optim.weight_decay});

  // ---- resume ------------------------------------------------------------------------------
  train::TrainState state;
  if (ckpt) {
    state = train::read_train_state(*ckpt);
    train::load_optimizer_and_rng(*ckpt, *optimizer);
    loader.seek(state.loader);
    log_info("rm: resumed from " + ckpt->string() + " at step " + std::to_string(state.step));
  }
  auto save = [&]() {
    state.loader = loader.cursor();
    state.n_skipped = loader.n_skipped();
    auto dir = save_rm_checkpoint(out, state, rm, sm, *optimizer, recipe,
                                  cfg.train.keep_last_n_checkpoints);
    log_info("rm: checkpoint " + dir.string());
  };
  io::JsonlWriter metrics(out / "metrics.jsonl");
  auto run_eval = [&]() {
    if (cfg.data.eval.empty()) return;
    auto r = evaluate_rm(rm, ctx, cfg.data.eval, limits, cfg, pad_id, device, dtype);
    log_info("rm: eval step " + std::to_string(state.step) + " accuracy " + fmt(r.accuracy) +
             " loss " + fmt(r.loss) + " rewards/margins " + fmt(r.margin) + " (" +
             std::to_string(r.n) + " pairs)");
    metrics.write({{"step", state.step},
                   {"eval/loss", r.loss},
                   {"eval/accuracy", r.accuracy},
                   {"eval/rewards/margins", r.margin},
                   {"eval/rewards/chosen", r.reward_chosen},
                   {"eval/rewards/rejected", r.reward_rejected},
                   {"eval/n", r.n}});
  };

  // ---- loop --------------------------------------------------------------------------------
  Progress progress("rm", total_steps);
  progress.update(state.step);
  auto t_last = std::chrono::steady_clock::now();
  int64_t tokens_window = 0, pairs_window = 0;
  MetricWindow window;
  const int64_t n_micro = cfg.train.gradient_accumulation_steps;
  while (state.step < total_steps) {
    optimizer->zero_grad();
    double step_loss = 0.0;
    for (int64_t a = 0; a < n_micro; ++a) {
      auto samples = loader.next_batch();
      MMPOST_CHECK_DATA(samples.has_value(), cfg.data.train, ": no preference pairs");
      auto rb = collate_rm(*samples, pad_id, device, dtype);
      const int64_t B = rb.b.batch_size;
      auto rewards = pair_rewards(rm, rb.b);  // [2B] float32
      auto rc = rewards.narrow(0, 0, B), rr = rewards.narrow(0, B, B);
      auto l = algo::bradley_terry_loss(rc, rr, rb.margin, cfg.rm.center_rewards_coefficient);
      (l.loss / static_cast<double>(n_micro)).backward();
      step_loss += l.loss.item<double>() / n_micro;
      // TRL RewardTrainer's metrics (accuracy, margin) under mmpost's rewards/* names.
      auto rcd = rc.detach(), rrd = rr.detach();
      window.add("accuracy", l.accuracy.item<double>() / n_micro);
      window.add("rewards/chosen", rcd.mean().item<double>() / n_micro);
      window.add("rewards/rejected", rrd.mean().item<double>() / n_micro);
      window.add("rewards/margins", (rcd - rrd).mean().item<double>() / n_micro);
      pairs_window += B;
      tokens_window += rb.b.n_tokens;
      state.tokens_seen += rb.b.n_tokens;
    }
    MMPOST_CHECK(std::isfinite(step_loss), "step ", state.step + 1, ": loss is ", step_loss,
                 "; stopping before the update so the last checkpoint stays valid",
                 "\n  hint: lower optim.lr, keep train.clip_grad_norm > 0");
    double grad_norm = train::clip_grad_norm(trainable, cfg.train.clip_grad_norm);
    MMPOST_CHECK(std::isfinite(grad_norm), "step ", state.step + 1, ": gradient norm is ",
                 grad_norm, "; stopping before the update", "\n  hint: lower optim.lr");
    double lr = cfg.optim.lr * train::lr_multiplier(cfg.scheduler.name, state.step,
                                                     cfg.scheduler.warmup_steps, total_steps,
                                                     cfg.scheduler.min_lr_ratio);
    train::set_lr(*optimizer, lr);
    optimizer->step();
    ++state.step;
    window.add("loss", step_loss);
    window.add("grad_norm", grad_norm);
    ++window.n;

    if (state.step % cfg.train.log_every_n_steps == 0 || state.step == total_steps) {
      auto now = std::chrono::steady_clock::now();
      double dt = std::chrono::duration<double>(now - t_last).count();
      nlohmann::json m = {{"step", state.step}, {"lr", lr}};
      for (const auto& [k, v] : window.sum) m[k] = v / window.n;
      m["tokens_per_s"] = tokens_window / dt;
      m["pairs_per_s"] = pairs_window / dt;
      m["epoch"] = loader.cursor().epoch;
      m["skipped"] = loader.n_skipped();
      metrics.write(m);
      progress.clear();
      log_info("step " + std::to_string(state.step) + "/" + std::to_string(total_steps) +
               " loss " + fmt(m["loss"].get<double>()) + " accuracy " +
               fmt(m["accuracy"].get<double>(), 3) + " rewards/margins " +
               fmt(m["rewards/margins"].get<double>()) + " lr " + fmt(lr, 3) + " grad_norm " +
               fmt(grad_norm, 3) + " tokens/s " + fmt(tokens_window / dt, 4) +
               (stderr_is_tty() ? "" : " eta " + format_duration(progress.eta_s())));
      t_last = now;
      tokens_window = pairs_window = 0;
      window = MetricWindow{};
    }
    progress.update(state.step);
    if (cfg.train.eval_every_n_steps > 0 && state.step % cfg.train.eval_every_n_steps == 0 &&
        state.step < total_steps) {
      run_eval();
    }
    if (cfg.train.save_every_n_steps > 0 && state.step % cfg.train.save_every_n_steps == 0 &&
        state.step < total_steps) {
      save();
    }
    if (int sig = stop_requested()) {
      progress.finish();
      log_warn("rm: signal " + std::to_string(sig) + " received; saving a checkpoint");
      save();
      return 128 + sig;
    }
  }
  progress.finish();

  // ---- final save --------------------------------------------------------------------------
  save();
  model::save_reward_model(out, rm, sm.tokenizer_path, sm.image, &tokenizer);
  log_info("rm: final reward model written to " + out.string() + " (" +
           std::to_string(loader.n_skipped()) + " bad pairs skipped)");
  run_eval();
  return 0;
}

Stage setup_rm(CLI::App& app) {
  return training_stage<config::RmConfig>(
      app, "rm", "reward model (Bradley-Terry, scalar head) on preference JSONL",
      config::load_rm_config, run_rm);
}

}  // namespace mmpost::cli
