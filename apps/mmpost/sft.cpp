// mmpost sft: supervised fine-tuning of a LLaVA-style VLM on conversational image-text JSONL.
// The stage is the loop: setup -> model -> data -> optimizer -> resume -> loop -> final save,
// top to bottom (STYLE.md 1). Loss: next-token cross-entropy on assistant turns, averaged over all
// supervised tokens of the optimizer step (so gradient accumulation equals one big batch).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <sstream>

#include "mmpost/algo/chunked_logps.h"
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
#include "mmpost/hub/hf_folder.h"
#include "mmpost/io/jsonl.h"
#include "mmpost/train/checkpointing.h"
#include "mmpost/train/evaluate.h"
#include "mmpost/train/optimizer.h"
#include "mmpost/train/run.h"
#include "mmpost/train/shards.h"

namespace mmpost::cli {
namespace fs = std::filesystem;

/// Runs SFT for a validated recipe; returns the exit code (0, or 128 + signal after a stop).
int run_sft(const config::SftConfig& cfg, bool allow_resume) {
  // ---- setup: lock OUTPUT, find the checkpoint to resume from, signals, device, seed --------
  train::Run run("sft", cfg, allow_resume);
  const torch::Device device = run.device();
  const torch::Dtype dtype = run.dtype();
  log_info("sft: resolved recipe\n" + config::format_table(config::to_rows(cfg)));

  // ---- model -------------------------------------------------------------------------------
  auto sm = load_stage_model(cfg.model, cfg.data.image, run.checkpoint(), device, dtype, "sft",
                             cfg.lora);
  model::Vlm model = sm.model;

  // ---- data --------------------------------------------------------------------------------
  const int64_t pad_id = pad_id_of(*sm.tokenizer);
  data::SampleContext ctx = make_sample_context(sm, cfg.data, cfg.data.train);
  data::SampleContext train_ctx = ctx;  // eval (ctx) never augments
  train_ctx.random_shift = cfg.data.image.random_shift;
  data::StreamingLoader<data::SftSample> loader(
      train_loader_options(cfg, run.world()), [&train_ctx](const nlohmann::json& rec, int64_t line, uint64_t seed) {
        return data::make_sft_sample(rec, line, train_ctx, /*prompt_only=*/false, seed);
      });
  // Every record checked before step 1 (schema, placeholders, lengths, image files), all bad
  // ones reported at once; under on_bad_sample=skip the count is known up front.
  data::SampleContext check_ctx = train_ctx;
  check_ctx.load_images = false;
  check_ctx.check_image_files = true;
  const int64_t n_records =
      data::validate_before_training(
          cfg.data.train, [&](const nlohmann::json& rec, int64_t line) { data::make_sft_sample(rec, line, check_ctx); },
          cfg.data.on_bad_sample == "skip", cfg.data.num_workers, "sft")
          .n_records;
  const int64_t world = run.world().world_size;
  const int64_t per_step = cfg.train.batch_size * cfg.train.gradient_accumulation_steps * world;
  const int64_t total_steps = train::total_steps_of(cfg.train, n_records, per_step);
  log_info("sft: " + std::to_string(n_records) + " training records, " +
           std::to_string(per_step) + " samples/step" +
           (world > 1 ? " (" + std::to_string(world) + " ranks)" : std::string()) + ", " +
           std::to_string(total_steps) + " steps");
  if (run.finished(total_steps)) return run.report_already_finished();

  // ---- optimizer, checkpoints, resume ------------------------------------------------------
  train::Optimizer optimizer(trainable_named(sm), cfg.optim, cfg.scheduler,
                             cfg.train.clip_grad_norm, total_steps,
                             run.process_group(), cfg.dist);
  train::Checkpointer checkpointer(cfg.output_dir, cfg.train.keep_last_n_checkpoints,
                                   {.vlm = model, .tokenizer = sm.tokenizer.get(), .image = sm.image,
                                    .lora = sm.lora.get(),
                                    .lora_modules_to_save = cfg.lora.modules_to_save,
                                    .lora_base_model = cfg.model.path,
                                    .lora_merge_on_save = cfg.lora.merge_on_save},
                                   optimizer, run.checkpoint() ? run.state.step : -1, run.is_main());
  if (run.checkpoint()) {
    train::load_optimizer_and_rng(*run.checkpoint(), optimizer);
    loader.seek(run.state.loader);
  }
  // data.preload makes ahead only what the run will still take.
  loader.set_remaining_windows((total_steps - run.state.step) *
                              cfg.train.gradient_accumulation_steps);
  const nlohmann::json recipe = config::to_json(cfg);
  auto save = [&] {
    run.state.loader = loader.cursor();
    run.state.n_skipped = loader.n_skipped();
    log_info("sft: checkpoint " + checkpointer.save(run.state, recipe).string());
  };
  auto run_eval = [&] {
    if (cfg.data.eval.empty()) return;
    train::ExactMatchOptions eo;
    eo.max_samples = cfg.train.eval_max_samples;
    eo.skip_bad = cfg.data.on_bad_sample == "skip";
    eo.num_workers = cfg.data.num_workers;
    eo.show_progress = false;
    eo.pg = run.process_group();  // each rank evaluates its share
    auto r = train::evaluate_exact_match(model, ctx, cfg.data.eval, eo, device, dtype, nullptr);
    run.log_eval({{"eval/accuracy", r.accuracy}, {"eval/n", r.n}},
                 "sft: eval step " + std::to_string(run.state.step) + " accuracy " +
                     fmt(r.accuracy) + " (" + std::to_string(r.n_correct) + "/" +
                     std::to_string(r.n) + ")");
  };

  // train.cpu_shards: each micro-batch as row shards whose forward + backward run at once.
  const std::vector<torch::Tensor> shard_params = trainable_tensors(trainable_named(sm));
  const int64_t n_shards = stage_cpu_shards(cfg.train.cpu_shards, shard_params, run,
                                            cfg.lora.dropout, "", "sft");

  // ---- loop --------------------------------------------------------------------------------
  run.start(total_steps, recipe);
  auto& state = run.state;
  train::MetricWindow window;
  while (state.step < total_steps) {
    // Fetch the step's micro-batches first: the loss is normalized by all their targets, summed
    // over ranks (a rank may hold fewer samples, or none, in an epoch's last window).
    std::vector<std::vector<data::Batch>> micro;  // [micro-batch][shard]
    int64_t n_targets = 0;
    for (int64_t a = 0; a < cfg.train.gradient_accumulation_steps; ++a) {
      auto samples = loader.next_batch();
      MMPOST_CHECK_DATA(samples.has_value(), cfg.data.train, ": no training samples");
      if (samples->empty()) continue;
      const auto n_samples = static_cast<int64_t>(samples->size());
      const int64_t n = std::min(n_shards, n_samples);
      std::vector<data::Batch> shards;
      int64_t cells = 0, tokens = 0;
      for (int64_t s = 0; s < n; ++s) {
        const auto [begin, end] = train::shard_range(n_samples, n, s);
        const std::vector<data::SftSample> part(samples->begin() + begin, samples->begin() + end);
        auto cpu_batch = cfg.data.packing ? data::collate_packed(part, pad_id, cfg.data.max_length)
                                          : data::collate(part, pad_id);
        if (cfg.data.packing) {
          cpu_batch.position_ids = model::packed_position_ids(
              *model, cpu_batch.input_ids, cpu_batch.attention_mask, cpu_batch.image_grid_thw);
        }
        cells += cpu_batch.input_ids.numel();
        tokens += cpu_batch.n_tokens;
        n_targets += algo::n_supervised_targets(cpu_batch.labels);  // on the CPU: no device sync
        shards.push_back(cpu_batch.to(device, dtype));
      }
      // Padded cells: what packing saves (0 = every cell a token).
      window.add("padding_fraction", 1.0 - static_cast<double>(tokens) / static_cast<double>(cells));
      window.count(tokens, n_samples);
      state.tokens_seen += tokens;
      micro.push_back(std::move(shards));
    }
    const double global_targets = run.all_sum({static_cast<double>(n_targets)})[0];
    MMPOST_CHECK_DATA(global_targets > 0, "step ", state.step + 1,
                      ": the batch has no supervised token (all labels are -100)",
                      "\n  hint: check data.max_length and that records have assistant replies");
    // One shard's loss: its summed cross-entropy over the step's supervised tokens of all ranks.
    auto loss_of = [&](const data::Batch& b) {
      if (cfg.train.logits_chunk_size == 0) {  // whole logits, as transformers' ForCausalLMLoss
        auto logits = model->forward(b.input_ids, {b.pixel_values, b.image_grid_thw},
                                     b.attention_mask, nullptr, b.position_ids);  // [B, T, V]
        return algo::sft_loss_sum(logits, b.labels) / global_targets;
      }
      // supervised tokens only, through the head a chunk at a time
      auto hidden = model->forward_hidden(b.input_ids, {b.pixel_values, b.image_grid_thw},
                                          b.attention_mask, nullptr, b.position_ids);
      auto weight = model->language_model->output_weight();
      return algo::sft_loss_sum_from_hidden(
                 hidden, weight, b.labels,
                 algo::logits_chunk_rows(cfg.train.logits_chunk_size, weight.size(0))) /
             global_targets;
    };
    optimizer.zero_grad();
    torch::Tensor step_loss = torch::zeros({}, torch::TensorOptions(device).dtype(torch::kFloat64));
    for (size_t k = 0; k < micro.size(); ++k) {
      const auto& shards = micro[k];
      if (shards.size() > 1) {  // train.cpu_shards (one process: no gradient all-reduce to arm)
        auto losses = train::backward_shards(
            static_cast<int64_t>(shards.size()),
            [&](int64_t s) { return loss_of(shards[static_cast<size_t>(s)]); }, shard_params);
        step_loss += losses.sum().to(device);
        continue;
      }
      auto loss = loss_of(shards[0]);
      if (k + 1 == micro.size()) optimizer.arm_gradient_sync();  // all-reduce during backward
      loss.backward();
      step_loss += loss.detach().to(torch::kFloat64);
    }
    // One device sync per step; the loss of the whole step over all ranks.
    const double loss = run.all_sum({step_loss.item<double>()})[0];
    auto st = optimizer.step(state.step, loss);
    ++state.step;
    window.add("loss", loss);
    train::add_step_stats(window, st);

    if (state.step % cfg.train.log_every_n_steps == 0 || state.step == total_steps) {
      auto m = run.flush(window, "samples");
      m["lr"] = st.lr;
      m["epoch"] = loader.cursor().epoch;
      m["skipped"] = loader.n_skipped();
      run.log_step(m, {"loss"});
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
  log_info("sft: final model written to " + cfg.output_dir + " (" +
           std::to_string(loader.n_skipped()) + " bad samples skipped)");
  run_eval();
  return run.completed();
}

Stage setup_sft(CLI::App& app) {
  return training_stage<config::SftConfig>(
      app, "sft", "supervised fine-tuning on conversational image-text JSONL",
      config::load_sft_config, run_sft);
}

}  // namespace mmpost::cli
