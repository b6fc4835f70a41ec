// mmpost rm: trains a Bradley-Terry reward model (the VLM + a scalar `score` head read at the last
// real token, as HF *ForSequenceClassification) on TRL preference JSONL, optionally with a
// per-record "margin". The stage is the loop: setup -> model + head -> data -> optimizer ->
// resume -> loop -> final save. Each micro-batch is one concatenated forward (chosen rows on
// rejected rows, one vision pass per image); the loss is algo::bradley_terry_loss (TRL
// RewardTrainer). The output folder is a reward-model folder (hub/reward_model_folder.h) that
// `mmpost rlhf` loads with hub::load_reward_model.
#include <algorithm>
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
#include "mmpost/dist/process_group.h"
#include "mmpost/hub/reward_model_folder.h"
#include "mmpost/io/checkpoint.h"
#include "mmpost/io/jsonl.h"
#include "mmpost/model/reward_model.h"
#include "mmpost/stage_common.h"
#include "mmpost/train/checkpointing.h"
#include "mmpost/train/optimizer.h"
#include "mmpost/train/run.h"
#include "mmpost/train/shards.h"

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
  torch::Tensor row_features, row_grids;  // each image's features (and grid) twice
  if (b.pixel_values.defined()) {
    auto features = rm->model->image_features(model::Images(b.pixel_values, b.image_grid_thw));
    row_features = torch::cat({features, features});
    if (b.image_grid_thw.defined()) row_grids = torch::cat({b.image_grid_thw, b.image_grid_thw});
  }
  return rm->forward_features(b.input_ids, row_features, b.attention_mask, row_grids);
}

/// Pairwise accuracy and reward statistics on a preference JSONL, in file order, no grad: the
/// first train.eval_max_samples records (0: all). With `pg` each rank scores its share and the
/// sums are all-reduced (every rank returns the one-process numbers; throws dist::DistError).
struct RmEvalResult {
  int64_t n = 0, n_skipped = 0;
  double loss = 0, accuracy = 0, margin = 0, reward_chosen = 0, reward_rejected = 0;
};

RmEvalResult evaluate_rm(model::RewardModel& rm, data::SampleContext ctx, const std::string& path,
                         const data::PreferenceLimits& limits, const config::RmConfig& cfg,
                         int64_t pad_id, const torch::Device& device, torch::Dtype dtype,
                         dist::ProcessGroup* pg) {
  ctx.source = path;
  ctx.base_dir = fs::path(path).parent_path();
  ctx.random_shift = 0;
  data::LoaderOptions lo;
  lo.path = path;
  lo.batch_size = cfg.train.batch_size;
  lo.num_workers = cfg.data.num_workers;
  lo.skip_bad = cfg.data.on_bad_sample == "skip";
  lo.max_records = cfg.train.eval_max_samples;  // the first N records (0: all)
  if (pg != nullptr) {  // each rank scores positions p % world == rank; the sums are all-reduced
    lo.rank = pg->rank();
    lo.world_size = pg->world_size();
  }
  data::StreamingLoader<RmSample> loader(lo, [&](const nlohmann::json& rec, int64_t line) {
    return make_rm_sample(rec, line, ctx, limits);
  });
  const bool was_training = rm->is_training();
  rm->eval();
  torch::NoGradGuard no_grad;
  std::vector<double> sums(6, 0.0);  // n, loss * B, correct, margin, rewards chosen, rejected
  while (auto samples = loader.next_batch()) {
    if (samples->empty()) continue;  // a window whose records were all skipped (or another rank's)
    auto rb = collate_rm(*samples, pad_id, device, dtype);
    const int64_t B = rb.b.batch_size;
    auto rewards = pair_rewards(rm, rb.b).to(torch::kFloat64).cpu();
    auto rc = rewards.narrow(0, 0, B), rr = rewards.narrow(0, B, B);
    auto margin = rb.margin.defined() ? rb.margin.cpu() : torch::Tensor();
    sums[0] += static_cast<double>(B);
    sums[1] += algo::bradley_terry_loss(rc, rr, margin, cfg.rm.center_rewards_coefficient)
                   .loss.item<double>() * B;
    sums[2] += (rc > rr).sum().item<double>();
    sums[3] += (rc - rr).sum().item<double>();
    sums[4] += rc.sum().item<double>();
    sums[5] += rr.sum().item<double>();
  }
  if (was_training) rm->train();
  sums.push_back(static_cast<double>(loader.n_skipped()));
  sums = dist::sum_over_ranks(pg, std::move(sums));
  RmEvalResult r;
  r.n = static_cast<int64_t>(sums[0]);
  r.n_skipped = static_cast<int64_t>(sums[6]);
  if (r.n > 0) {
    r.loss = sums[1] / sums[0];
    r.accuracy = sums[2] / sums[0];
    r.margin = sums[3] / sums[0];
    r.reward_chosen = sums[4] / sums[0];
    r.reward_rejected = sums[5] / sums[0];
  }
  return r;
}

}  // namespace

/// Trains a reward model for a validated recipe; returns the exit code (0, or 128 + signal).
int run_rm(const config::RmConfig& cfg, bool allow_resume) {
  // ---- setup: lock OUTPUT, find the checkpoint to resume from, signals, device, seed --------
  train::Run run("rm", cfg, allow_resume);
  const torch::Device device = run.device();
  const torch::Dtype dtype = run.dtype();
  MMPOST_CHECK_USAGE(!cfg.model.path.empty(),
                     "model.path: a reward model starts from a trained model (an SFT output "
                     "folder, any supported HF checkpoint, or a reward model to continue)");
  MMPOST_CHECK_USAGE(cfg.data.eval.empty() || fs::is_regular_file(cfg.data.eval), "data.eval: ",
                     cfg.data.eval, ": no such file (checked before training, not after)");
  log_info("rm: resolved recipe\n" + config::format_table(config::to_rows(cfg)));
  const auto& ckpt = run.checkpoint();

  // ---- model + score head ------------------------------------------------------------------
  MMPOST_CHECK_USAGE(!cfg.data.packing, "data.packing: only sft packs its batches; rm does not",
                     "\n  hint: remove data.packing from the recipe");
  auto sm = load_stage_model(cfg.model, cfg.data.image, ckpt, device, dtype, "rm", cfg.lora);
  model::RewardModel rm(sm.model);  // score ~ N(0, 0.02^2), seeded by Run
  const fs::path head_src = ckpt ? *ckpt : fs::path(cfg.model.path);
  if (ckpt || hub::has_reward_head(head_src)) {
    hub::load_reward_head(rm, head_src);
    log_info("rm: score head from " + head_src.string());
  } else {
    log_info("rm: new score head Linear(" +
             std::to_string(sm.model->config().text_config.hidden_size) + ", 1), N(0, 0.02^2)");
  }
  rm->train();

  // ---- data --------------------------------------------------------------------------------
  const int64_t pad_id = pad_id_of(*sm.tokenizer);
  data::SampleContext ctx = make_sample_context(sm, cfg.data, cfg.data.train);
  data::SampleContext train_ctx = ctx;
  train_ctx.random_shift = cfg.data.image.random_shift;
  const data::PreferenceLimits limits{cfg.rm.max_prompt_length, cfg.rm.max_completion_length,
                                      cfg.data.max_length};
  data::StreamingLoader<RmSample> loader(
      train_loader_options(cfg, run.world()), [&](const nlohmann::json& rec, int64_t line) {
        return make_rm_sample(rec, line, train_ctx, limits);
      });
  // Every record checked before step 1 (schema, placeholders, lengths, image files), all bad
  // ones reported at once; under on_bad_sample=skip the count is known up front.
  data::SampleContext check_ctx = train_ctx;
  check_ctx.load_images = false;
  check_ctx.check_image_files = true;
  const int64_t n_records =
      data::validate_before_training(
          cfg.data.train, [&](const nlohmann::json& rec, int64_t line) { make_rm_sample(rec, line, check_ctx, limits); },
          cfg.data.on_bad_sample == "skip", cfg.data.num_workers, "rm")
          .n_records;
  const int64_t per_step =
      cfg.train.batch_size * cfg.train.gradient_accumulation_steps * run.world().world_size;
  const int64_t total_steps = train::total_steps_of(cfg.train, n_records, per_step);
  log_info("rm: " + std::to_string(n_records) + " preference pairs, " + std::to_string(per_step) +
           " pairs/step, " + std::to_string(total_steps) + " steps; Bradley-Terry loss" +
           (cfg.rm.center_rewards_coefficient > 0
                ? " + " + fmt(cfg.rm.center_rewards_coefficient, 3) + " * centering"
                : std::string()));
  if (run.finished(total_steps)) return run.report_already_finished();

  // ---- optimizer, checkpoints, resume ------------------------------------------------------
  // The score head is always trained (PEFT's SEQ_CLS task saves it beside the adapters).
  auto named = train::named_parameters_of(*rm);
  if (sm.lora) {
    for (auto& kv : sm.lora->named_parameters()) named.push_back(kv);
  }
  train::Optimizer optimizer(named, cfg.optim, cfg.scheduler,
                             cfg.train.clip_grad_norm, total_steps,
                             run.process_group(), cfg.dist);
  train::Checkpointer checkpointer(
      cfg.output_dir, cfg.train.keep_last_n_checkpoints,
      {.vlm = sm.model, .reward_model = rm, .tokenizer = sm.tokenizer.get(), .image = sm.image,
       .lora = sm.lora.get(),
       .lora_modules_to_save = cfg.lora.modules_to_save,
       .lora_base_model = cfg.model.path,
       .lora_merge_on_save = cfg.lora.merge_on_save},
      optimizer, ckpt ? run.state.step : -1, run.is_main());
  if (ckpt) {
    train::load_optimizer_and_rng(*ckpt, optimizer);
    loader.seek(run.state.loader);
  }
  // data.preload makes ahead only what the run will still take.
  loader.set_remaining_windows((total_steps - run.state.step) *
                              cfg.train.gradient_accumulation_steps);
  const nlohmann::json recipe = config::to_json(cfg);
  auto save = [&] {
    run.state.loader = loader.cursor();
    run.state.n_skipped = loader.n_skipped();
    log_info("rm: checkpoint " + checkpointer.save(run.state, recipe).string());
  };
  auto run_eval = [&] {
    if (cfg.data.eval.empty()) return;
    auto r = evaluate_rm(rm, ctx, cfg.data.eval, limits, cfg, pad_id, device, dtype,
                         run.process_group());
    run.log_eval({{"eval/loss", r.loss},
                  {"eval/accuracy", r.accuracy},
                  {"eval/rewards/margins", r.margin},
                  {"eval/rewards/chosen", r.reward_chosen},
                  {"eval/rewards/rejected", r.reward_rejected},
                  {"eval/n", r.n}},
                 "rm: eval step " + std::to_string(run.state.step) + " accuracy " +
                     fmt(r.accuracy) + " loss " + fmt(r.loss) + " rewards/margins " +
                     fmt(r.margin) + " (" + std::to_string(r.n) + " pairs)");
  };

  // train.cpu_shards: a micro-batch as row shards whose forward + backward run at once (the
  // Bradley-Terry terms are means over pairs: weighted by each shard's pairs they add up exactly).
  const std::vector<torch::Tensor> shard_params = trainable_tensors(named);
  const int64_t n_shards =
      stage_cpu_shards(cfg.train.cpu_shards, shard_params, run, cfg.lora.dropout, "", "rm");

  // ---- loop --------------------------------------------------------------------------------
  run.start(total_steps, recipe);
  auto& state = run.state;
  train::MetricWindow window;
  const int64_t n_micro = cfg.train.gradient_accumulation_steps;
  while (state.step < total_steps) {
    // The step's micro-batches first: each one's loss is a mean over its pairs on all ranks.
    auto step = next_step_batches(loader, n_micro, run, cfg.data.train);
    auto& micro = step.micro;
    const auto& pairs = step.global_counts;
    optimizer.zero_grad();
    double step_loss = 0.0;
    for (int64_t a = 0; a < n_micro; ++a) {
      if (micro[a].empty()) continue;  // this rank's share of the window is empty
      // A batch's loss (its pairs' mean weighted to a mean over the micro-batch's pairs on all
      // ranks) and its metrics [loss, accuracy, rewards/chosen, rewards/rejected,
      // rewards/margins], means over its own pairs, detached.
      auto loss_of = [&](const RmBatch& rb) {
        const int64_t B = rb.b.batch_size;
        auto rewards = pair_rewards(rm, rb.b);  // [2B] float32
        auto rc = rewards.narrow(0, 0, B), rr = rewards.narrow(0, B, B);
        auto l = algo::bradley_terry_loss(rc, rr, rb.margin, cfg.rm.center_rewards_coefficient);
        auto loss = l.loss * (static_cast<double>(B) / pairs[a]);
        auto rcd = rc.detach(), rrd = rr.detach();
        auto stats = torch::stack({loss.detach(), l.accuracy.to(torch::kFloat32), rcd.mean(),
                                   rrd.mean(), (rcd - rrd).mean()})
                         .to(torch::kCPU, torch::kFloat64);
        return std::make_pair(loss, stats);
      };
      const auto B = static_cast<int64_t>(micro[a].size());
      const int64_t n = std::min(n_shards, B);
      torch::Tensor stats;
      int64_t n_tokens = 0;
      if (n == 1) {
        auto rb = collate_rm(micro[a], pad_id, device, dtype);
        auto [loss, st] = loss_of(rb);
        if (a + 1 == n_micro) optimizer.arm_gradient_sync();  // all-reduce during backward
        (loss / static_cast<double>(n_micro)).backward();
        stats = st;
        n_tokens = rb.b.n_tokens;
      } else {  // train.cpu_shards (one process: no gradient all-reduce to arm)
        std::vector<RmBatch> parts;
        for (int64_t s = 0; s < n; ++s) {
          const auto [begin, end] = train::shard_range(B, n, s);
          parts.push_back(collate_rm(
              std::vector<RmSample>(micro[a].begin() + begin, micro[a].begin() + end), pad_id,
              device, dtype));
          n_tokens += parts.back().b.n_tokens;
        }
        std::vector<torch::Tensor> shard_stats(static_cast<size_t>(n));
        train::backward_shards(
            n,
            [&](int64_t s) {
              auto [loss, st] = loss_of(parts[s]);
              // loss: already a share of the micro-batch's; the means weighted by pairs
              auto w = torch::full({5}, static_cast<double>(parts[s].b.batch_size) /
                                            static_cast<double>(B), torch::kFloat64);
              w[0] = 1.0;
              shard_stats[s] = st * w;
              return loss / static_cast<double>(n_micro);
            },
            shard_params);
        stats = torch::stack(shard_stats).sum(0);
      }
      auto sa = stats.accessor<double, 1>();
      step_loss += sa[0] / static_cast<double>(n_micro);
      window.add("accuracy", sa[1]);
      window.add("rewards/chosen", sa[2]);
      window.add("rewards/rejected", sa[3]);
      window.add("rewards/margins", sa[4]);
      window.count(n_tokens, B);
      state.tokens_seen += n_tokens;
    }
    step_loss = run.all_sum({step_loss})[0];  // the step's loss over all ranks
    auto st = optimizer.step(state.step, step_loss);
    ++state.step;
    window.add("loss", step_loss);
    train::add_step_stats(window, st);

    if (state.step % cfg.train.log_every_n_steps == 0 || state.step == total_steps) {
      auto m = run.flush(window, "pairs");
      m["lr"] = st.lr;
      m["epoch"] = loader.cursor().epoch;
      m["skipped"] = loader.n_skipped();
      run.log_step(m, {"loss", "accuracy", "rewards/margins"});
    }
    run.progress();
    if (run.due(cfg.train.eval_every_n_steps)) run_eval();
    if (run.due(cfg.train.save_every_n_steps)) save();
    if (int sig = run.stop_requested()) {
      save();
      return run.stopped(sig);
    }
  }

  // ---- final save --------------------------------------------------------------------------
  save();
  checkpointer.export_final();
  log_info("rm: final reward model written to " + cfg.output_dir + " (" +
           std::to_string(loader.n_skipped()) + " bad pairs skipped)");
  run_eval();
  return run.completed();
}

Stage setup_rm(CLI::App& app) {
  return training_stage<config::RmConfig>(
      app, "rm", "reward model (Bradley-Terry, scalar head) on preference JSONL",
      config::load_rm_config, run_rm);
}

}  // namespace mmpost::cli
