// mmpost sft: supervised fine-tuning of a LLaVA-style VLM on conversational image-text JSONL.
// The stage is the loop: setup -> model -> data -> optimizer -> resume -> loop -> final save,
// top to bottom (STYLE.md 1). Loss: next-token cross-entropy on assistant turns, averaged over all
// supervised tokens of the optimizer step (so gradient accumulation equals one big batch).
#include <chrono>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <sstream>

#include "mmpost/algo/sft_loss.h"
#include "mmpost/cli_common.h"
#include "mmpost/stage_common.h"
#include "mmpost/config/recipe.h"
#include "mmpost/config/schema.h"
#include "mmpost/core/check.h"
#include "mmpost/core/device.h"
#include "mmpost/core/log.h"
#include "mmpost/core/signals.h"
#include "mmpost/data/collate.h"
#include "mmpost/data/loader.h"
#include "mmpost/io/checkpoint.h"
#include "mmpost/io/hf_folder.h"
#include "mmpost/io/jsonl.h"
#include "mmpost/train/checkpointing.h"
#include "mmpost/train/evaluate.h"
#include "mmpost/train/optimizer.h"

namespace mmpost::cli {
namespace fs = std::filesystem;

/// Runs SFT for a validated recipe; returns the exit code (0, or 128 + signal after a stop).
int run_sft(const config::SftConfig& cfg, bool allow_resume) {
  // ---- setup -------------------------------------------------------------------------------
  install_stop_handlers();
  if (cfg.num_threads > 0) torch::set_num_threads(static_cast<int>(cfg.num_threads));
  const torch::Device device = resolve_device(cfg.device);
  const torch::Dtype dtype = resolve_dtype(cfg.dtype, device);
  seed_everything(static_cast<uint64_t>(cfg.seed));
  const fs::path out = cfg.output_dir;
  fs::create_directories(out);
  const nlohmann::json recipe = config::to_json(cfg);
  io::write_text_atomic(out / "recipe.json", recipe.dump(2) + "\n");
  log_info("sft: resolved recipe\n" + config::format_table(config::to_rows(cfg)));
  std::optional<fs::path> ckpt;
  if (allow_resume) ckpt = io::latest_complete_checkpoint(out);

  // ---- model -------------------------------------------------------------------------------
  auto sm = load_stage_model(cfg.model, cfg.data.image, ckpt, device, dtype, "sft");
  model::Vlm model = sm.model;
  data::Tokenizer& tokenizer = *sm.tokenizer;
  const fs::path tokenizer_path = sm.tokenizer_path;
  const data::ImageProcessorConfig image = sm.image;

  // ---- data --------------------------------------------------------------------------------
  const int64_t pad_id = pad_id_of(tokenizer);
  data::SampleContext ctx = make_sample_context(sm, cfg.data, cfg.data.train);
  data::SampleContext train_ctx = ctx;  // eval (ctx) never augments
  train_ctx.random_shift = cfg.data.image.random_shift;
  data::LoaderOptions lo;
  lo.path = cfg.data.train;
  lo.batch_size = cfg.train.batch_size;
  lo.num_workers = cfg.data.num_workers;
  lo.shuffle_buffer = cfg.data.shuffle_buffer;
  lo.prefetch = cfg.data.prefetch;
  lo.seed = static_cast<uint64_t>(cfg.seed);
  lo.skip_bad = cfg.data.on_bad_sample == "skip";
  lo.repeat = true;
  data::StreamingLoader<data::SftSample> loader(
      lo, [&train_ctx](const nlohmann::json& rec, int64_t line, uint64_t seed) {
        return data::make_sft_sample(rec, line, train_ctx, /*prompt_only=*/false, seed);
      });
  const int64_t n_records = data::count_records(cfg.data.train);
  const int64_t per_step = cfg.train.batch_size * cfg.train.gradient_accumulation_steps;
  const int64_t total_steps =
      cfg.train.max_steps > 0
          ? cfg.train.max_steps
          : std::max<int64_t>(1, static_cast<int64_t>(std::ceil(cfg.train.epochs * n_records /
                                                               static_cast<double>(per_step))));
  log_info("sft: " + std::to_string(n_records) + " training records, " +
           std::to_string(per_step) + " samples/step, " + std::to_string(total_steps) + " steps");

  // ---- optimizer ---------------------------------------------------------------------------
  auto named_items = model->named_parameters(/*recurse=*/true).items();
  std::vector<std::pair<std::string, torch::Tensor>> named;
  std::vector<torch::Tensor> trainable;
  for (auto& item : named_items) {
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
    log_info("sft: resumed from " + ckpt->string() + " at step " + std::to_string(state.step));
  }
  auto save = [&]() {
    state.loader = loader.cursor();
    state.n_skipped = loader.n_skipped();
    auto dir = train::save_checkpoint(out, state, model, tokenizer_path, image, *optimizer, recipe,
                                      cfg.train.keep_last_n_checkpoints, &tokenizer);
    log_info("sft: checkpoint " + dir.string());
  };
  io::JsonlWriter metrics(out / "metrics.jsonl");
  auto run_eval = [&]() {
    if (cfg.data.eval.empty()) return;
    train::ExactMatchOptions eo;
    eo.max_samples = cfg.train.eval_max_samples;
    eo.skip_bad = lo.skip_bad;
    eo.num_workers = cfg.data.num_workers;
    eo.show_progress = false;
    auto r = train::evaluate_exact_match(model, ctx, cfg.data.eval, eo, device, dtype, nullptr);
    log_info("sft: eval step " + std::to_string(state.step) + " accuracy " + fmt(r.accuracy) +
             " (" + std::to_string(r.n_correct) + "/" + std::to_string(r.n) + ")");
    metrics.write({{"step", state.step}, {"eval/accuracy", r.accuracy}, {"eval/n", r.n}});
  };

  // ---- loop --------------------------------------------------------------------------------
  Progress progress("sft", total_steps);
  progress.update(state.step);
  auto t_last = std::chrono::steady_clock::now();
  int64_t tokens_window = 0, samples_window = 0;
  double loss_window = 0.0;
  int64_t steps_window = 0;
  while (state.step < total_steps) {
    // Fetch the step's micro-batches first: the loss is normalized by all their targets.
    std::vector<data::Batch> micro;
    int64_t n_targets = 0, step_tokens = 0;
    for (int64_t a = 0; a < cfg.train.gradient_accumulation_steps; ++a) {
      auto samples = loader.next_batch();
      MMPOST_CHECK_DATA(samples.has_value(), cfg.data.train, ": no training samples");
      auto cpu_batch = data::collate(*samples, pad_id);
      n_targets += algo::n_supervised_targets(cpu_batch.labels);  // on the CPU: no device sync
      micro.push_back(cpu_batch.to(device, dtype));
      samples_window += static_cast<int64_t>(samples->size());
      step_tokens += micro.back().n_tokens;
    }
    MMPOST_CHECK_DATA(n_targets > 0, "step ", state.step + 1,
                      ": the batch has no supervised token (all labels are -100)",
                      "\n  hint: check data.max_length and that records have assistant replies");
    optimizer->zero_grad();
    double step_loss = 0.0;
    for (const auto& b : micro) {
      auto logits = model->forward(b.input_ids, b.pixel_values, b.attention_mask);  // [B, T, V]
      auto loss = algo::sft_loss_sum(logits, b.labels) / static_cast<double>(n_targets);
      loss.backward();
      step_loss += loss.item<double>();
    }
    MMPOST_CHECK(std::isfinite(step_loss), "step ", state.step + 1, ": loss is ", step_loss,
                 "; stopping before the update so the last checkpoint stays valid",
                 "\n  hint: lower optim.lr, keep train.clip_grad_norm > 0, or use dtype float32");
    double grad_norm = train::clip_grad_norm(trainable, cfg.train.clip_grad_norm);
    MMPOST_CHECK(std::isfinite(grad_norm), "step ", state.step + 1, ": gradient norm is ",
                 grad_norm, "; stopping before the update",
                 "\n  hint: lower optim.lr or use dtype float32");
    double lr = cfg.optim.lr * train::lr_multiplier(cfg.scheduler.name, state.step,
                                                     cfg.scheduler.warmup_steps, total_steps,
                                                     cfg.scheduler.min_lr_ratio);
    train::set_lr(*optimizer, lr);
    optimizer->step();
    ++state.step;
    state.tokens_seen += step_tokens;
    tokens_window += step_tokens;
    loss_window += step_loss;
    ++steps_window;

    if (state.step % cfg.train.log_every_n_steps == 0 || state.step == total_steps) {
      auto now = std::chrono::steady_clock::now();
      double dt = std::chrono::duration<double>(now - t_last).count();
      double loss = loss_window / steps_window;
      nlohmann::json m = {{"step", state.step},     {"loss", loss},
                          {"lr", lr},               {"grad_norm", grad_norm},
                          {"tokens_per_s", tokens_window / dt},
                          {"samples_per_s", samples_window / dt},
                          {"epoch", loader.cursor().epoch}, {"skipped", loader.n_skipped()}};
      metrics.write(m);
      progress.clear();
      log_info("step " + std::to_string(state.step) + "/" + std::to_string(total_steps) +
               " loss " + fmt(loss) + " lr " + fmt(lr, 3) + " grad_norm " + fmt(grad_norm, 3) +
               " tokens/s " + fmt(tokens_window / dt, 4) + " samples/s " +
               fmt(samples_window / dt, 4) +
               (stderr_is_tty() ? "" : " eta " + format_duration(progress.eta_s())));
      t_last = now;
      tokens_window = samples_window = steps_window = 0;
      loss_window = 0.0;
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
      log_warn("sft: signal " + std::to_string(sig) + " received; saving a checkpoint");
      save();
      return 128 + sig;
    }
  }
  progress.finish();

  // ---- final save --------------------------------------------------------------------------
  save();
  io::save_pretrained(out, model, tokenizer_path, image, torch::kFloat32, int64_t{5} << 30,
                      &tokenizer);
  log_info("sft: final model written to " + out.string() + " (" +
           std::to_string(loader.n_skipped()) + " bad samples skipped)");
  run_eval();
  return 0;
}

Stage setup_sft(CLI::App& app) {
  return training_stage<config::SftConfig>(
      app, "sft", "supervised fine-tuning on conversational image-text JSONL",
      config::load_sft_config, run_sft);
}

}  // namespace mmpost::cli
