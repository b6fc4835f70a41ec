// mmpost dpo: preference optimization of a VLM on TRL preference JSONL (prompt, chosen,
// rejected + images). The stage is the loop: setup -> policy + reference -> data -> optimizer ->
// resume -> loop -> final save. Each micro-batch is one concatenated forward (chosen rows on
// rejected rows, one vision pass per image); the loss is algo::dpo_loss (TRL's loss types) plus
// optional mDPO terms, averaged over pairs and over the micro-batches of a step.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "mmpost/algo/chunked_logps.h"
#include "mmpost/algo/dpo_loss.h"
#include "mmpost/algo/sft_loss.h"
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
#include "mmpost/hub/hf_folder.h"
#include "mmpost/io/jsonl.h"
#include "mmpost/stage_common.h"
#include "mmpost/train/checkpointing.h"
#include "mmpost/train/optimizer.h"
#include "mmpost/train/preference.h"
#include "mmpost/train/run.h"
#include "mmpost/train/shards.h"

namespace mmpost::cli {
namespace fs = std::filesystem;

namespace {

/// The recipe's loss settings as algo::DpoLossConfig (rpo_alpha becomes an extra `sft` term).
algo::DpoLossConfig loss_config(const config::DpoSection& d) {
  algo::DpoLossConfig c;
  c.beta = d.beta;
  c.label_smoothing = d.label_smoothing;
  c.loss_types.clear();
  for (const auto& name : d.loss_type) {
    try {
      c.loss_types.push_back(algo::parse_dpo_loss_type(name));
    } catch (const Error& e) {
      throw Error(e.kind(), "dpo.loss_type: " + e.message(), e.hint());
    }
  }
  c.loss_weights = d.loss_weights;
  if (d.rpo_alpha > 0) {
    if (c.loss_weights.empty()) c.loss_weights.assign(c.loss_types.size(), 1.0);
    c.loss_types.push_back(algo::DpoLossType::kSft);
    c.loss_weights.push_back(d.rpo_alpha);
  }
  c.simpo_gamma = d.simpo_gamma;
  c.discopop_tau = d.discopop_tau;
  c.use_weighting = d.use_weighting;
  if (d.ld_alpha.is_number()) c.ld_alpha = d.ld_alpha.get<double>();
  algo::validate(c);
  return c;
}

/// FNV-1a 64 of a file's bytes, hex (the data a reference cache was computed on).
std::string content_hash(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  MMPOST_CHECK(in.good(), file.string(), ": cannot read");
  uint64_t h = 1469598103934665603ull;
  char buf[1 << 16];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    for (std::streamsize i = 0; i < in.gcount(); ++i) {
      h = (h ^ static_cast<unsigned char>(buf[i])) * 1099511628211ull;
    }
  }
  std::ostringstream os;
  os << std::hex << h;
  return os.str();
}

/// Size and modification time of every file of a model folder (cheap identity of its weights).
std::string fingerprint(const fs::path& dir) {
  std::vector<std::string> parts;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    parts.push_back(e.path().filename().string() + ":" + std::to_string(e.file_size()) + ":" +
                    std::to_string(e.last_write_time().time_since_epoch().count()));
  }
  std::sort(parts.begin(), parts.end());
  std::string s;
  for (const auto& p : parts) s += p + ";";
  return s;
}

/// "sigmoid + 1*sft" style description of the loss terms for the log.
std::string describe(const algo::DpoLossConfig& c) {
  std::string s;
  for (size_t k = 0; k < c.loss_types.size(); ++k) {
    s += (k ? " + " : "") +
         (c.loss_weights.empty() ? std::string() : fmt(c.loss_weights[k], 3) + "*") +
         algo::to_string(c.loss_types[k]);
  }
  return s;
}

}  // namespace

/// Runs DPO for a validated recipe; returns the exit code (0, or 128 + signal after a stop).
int run_dpo(const config::DpoConfig& cfg, bool allow_resume) {
  // ---- setup: lock OUTPUT, find the checkpoint to resume from, signals, device, seed --------
  train::Run run("dpo", cfg, allow_resume);
  const torch::Device device = run.device();
  const torch::Dtype dtype = run.dtype();
  const torch::Dtype ref_dtype = cfg.dpo.ref_dtype.empty() ? dtype
                                                           : resolve_dtype(cfg.dpo.ref_dtype, device);
  const algo::DpoLossConfig loss_cfg = loss_config(cfg.dpo);
  const bool ref_free = algo::is_reference_free(loss_cfg.loss_types.front());
  const bool mdpo = cfg.dpo.mdpo.enabled;
  MMPOST_CHECK_USAGE(!cfg.model.path.empty(),
                     "model.path: DPO starts from a trained model (an SFT output folder or any "
                     "supported HF checkpoint)");
  MMPOST_CHECK_USAGE(!(mdpo && ref_free), "dpo.mdpo: needs a reference model; it cannot be "
                     "combined with the reference-free loss types (simpo, orpo)");
  MMPOST_CHECK_USAGE(!(mdpo && cfg.dpo.precompute_ref_log_probs),
                     "dpo.mdpo with dpo.precompute_ref_log_probs: the corrupted images are drawn "
                     "anew each epoch, so their reference log-probs cannot be precomputed",
                     "\n  hint: set one of them to false");
  const fs::path out = cfg.output_dir;
  log_info("dpo: resolved recipe\n" + config::format_table(config::to_rows(cfg)));

  // ---- policy + reference ------------------------------------------------------------------
  MMPOST_CHECK_USAGE(!cfg.data.packing, "data.packing: only sft packs its batches; dpo does not",
                     "\n  hint: remove data.packing from the recipe");
  auto sm = load_stage_model(cfg.model, cfg.data.image, run.checkpoint(), device, dtype, "dpo",
                             cfg.lora);
  model::Vlm model = sm.model;
  MMPOST_CHECK_USAGE(!(mdpo && model->is_qwen2_vl()), "dpo.mdpo: the corrupted-image term does "
                     "not run Qwen2-VL family models yet (their images are flattened patches)",
                     "\n  hint: set dpo.mdpo.enabled to false");
  StageReference reference;
  const fs::path ref_src = cfg.dpo.ref_model.empty() ? fs::path(cfg.model.path)
                                                     : fs::path(cfg.dpo.ref_model);

  // ---- data --------------------------------------------------------------------------------
  const int64_t pad_id = pad_id_of(*sm.tokenizer);
  data::SampleContext ctx = make_sample_context(sm, cfg.data, cfg.data.train);
  data::SampleContext train_ctx = ctx;
  train_ctx.random_shift = cfg.data.image.random_shift;
  const data::PreferenceLimits limits{cfg.dpo.max_prompt_length, cfg.dpo.max_completion_length,
                                      cfg.data.max_length};
  const data::ImageCorruption corruption{cfg.dpo.mdpo.corruption,
                                         cfg.dpo.mdpo.corruption_strength};
  auto loader_opts = train_loader_options(cfg, run.world());
  if (mdpo) loader_opts.cache_bytes = 0;  // corrupted images are drawn anew each epoch
  data::StreamingLoader<data::PreferenceSample> loader(
      loader_opts, [&](const nlohmann::json& rec, int64_t line, uint64_t seed) {
        return data::make_preference_sample(rec, line, train_ctx, limits,
                                            mdpo ? &corruption : nullptr, seed);
      });
  // Every record checked before step 1 (schema, placeholders, lengths, image files), all bad
  // ones reported at once; under on_bad_sample=skip the count is known up front.
  data::SampleContext check_ctx = train_ctx;
  check_ctx.load_images = false;
  check_ctx.check_image_files = true;
  const int64_t n_records =
      data::validate_before_training(
          cfg.data.train, [&](const nlohmann::json& rec, int64_t line) { data::make_preference_sample(rec, line, check_ctx, limits, nullptr, 0); },
          cfg.data.on_bad_sample == "skip", cfg.data.num_workers, "dpo")
          .n_records;
  const int64_t per_step =
      cfg.train.batch_size * cfg.train.gradient_accumulation_steps * run.world().world_size;
  const int64_t total_steps = train::total_steps_of(cfg.train, n_records, per_step);
  log_info("dpo: " + std::to_string(n_records) + " preference pairs, " + std::to_string(per_step) +
           " pairs/step, " + std::to_string(total_steps) + " steps; loss " +
           describe(loss_cfg) + (mdpo ? " + mDPO" : ""));
  if (run.finished(total_steps)) return run.report_already_finished();
  if (!ref_free) {  // the starting policy, never the resumed checkpoint
    const std::string own_copy = !cfg.dpo.ref_model.empty() ? "dpo.ref_model"
                                 : ref_dtype != dtype        ? "dpo.ref_dtype"
                                                             : "";
    reference = load_reference(sm, cfg.lora, ref_src, own_copy, device, ref_dtype, "dpo");
  }
  train::PreferenceEvalOptions eval_opts;
  eval_opts.beta = cfg.dpo.beta;
  eval_opts.batch_size = cfg.train.batch_size;
  eval_opts.num_workers = cfg.data.num_workers;
  eval_opts.skip_bad = cfg.data.on_bad_sample == "skip";
  eval_opts.limits = limits;
  // Precomputed reference values must be what the training forward would give the same pair in
  // any batch: only the padding-free forward guarantees that (bit-identical), so it comes on.
  const bool padding_free = cfg.dpo.padding_free || cfg.dpo.precompute_ref_log_probs;
  if (padding_free && !cfg.dpo.padding_free) {
    log_info("dpo: padding_free forward (implied by precompute_ref_log_probs)");
  }
  eval_opts.padding_free = padding_free;
  std::optional<train::ReferenceLogpsCache> ref_cache, eval_ref_cache;
  if (!ref_free && cfg.dpo.precompute_ref_log_probs) {
    // Keyed by everything the values depend on, so a resumed run reuses them and a changed
    // setting recomputes them.
    auto precompute = [&](const std::string& path, const std::string& file) {
      if (!allow_resume && run.is_main()) fs::remove(out / file);  // --no-resume recomputes
      const std::string key = fs::absolute(ref_src).string() + "|" + fingerprint(ref_src) + "|" +
                              fs::absolute(path).string() + "|" + content_hash(path) + "|" +
                              std::to_string(limits.max_prompt_length) + "|" +
                              std::to_string(limits.max_completion_length) + "|" +
                              std::to_string(limits.max_length) + "|" + dtype_name(ref_dtype) +
                              // the pixels the values were scored on: processor settings and size
                              "|" + data::preprocessor_config_json(ctx.image).dump() + "|" +
                              std::to_string(ctx.image.max_pixels) + "|" +
                              (padding_free ? "padding_free" : "padded");
      auto o = eval_opts;
      o.reference_adapters_off = reference.adapters_off;
      return train::precompute_reference_logps(reference.model, ctx, path, o, device, ref_dtype,
                                               out / file, key, run.process_group());
    };
    ref_cache = precompute(cfg.data.train, "ref_logps.safetensors");
    if (!cfg.data.eval.empty()) eval_ref_cache = precompute(cfg.data.eval, "ref_logps_eval.safetensors");
    reference = StageReference{};  // no longer needed: free its memory
  }

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
    log_info("dpo: checkpoint " + checkpointer.save(run.state, recipe).string());
  };
  auto run_eval = [&] {
    if (cfg.data.eval.empty()) return;
    auto o = eval_opts;
    o.max_samples = cfg.train.eval_max_samples;
    o.show_progress = false;
    o.pg = run.process_group();  // each rank scores its share
    o.reference_adapters_off = reference.adapters_off;
    model::Vlm* ref = reference ? &reference.model : nullptr;
    const train::ReferenceLogpsCache* cache = eval_ref_cache ? &*eval_ref_cache : nullptr;
    auto r = train::evaluate_preferences(model, ref, ctx, cfg.data.eval, o, device, dtype, cache);
    run.log_eval({{"eval/rewards/accuracies", r.accuracy},
                  {"eval/rewards/margins", r.margin},
                  {"eval/rewards/chosen", r.reward_chosen},
                  {"eval/rewards/rejected", r.reward_rejected},
                  {"eval/logps/chosen", r.logps_chosen},
                  {"eval/logps/rejected", r.logps_rejected},
                  {"eval/n", r.n}},
                 "dpo: eval step " + std::to_string(run.state.step) + " rewards/accuracies " +
                     fmt(r.accuracy) + " rewards/margins " + fmt(r.margin) + " (" +
                     std::to_string(r.n) + " pairs" + (ref_free ? ", reference-free)" : ")"));
  };

  // ---- loop --------------------------------------------------------------------------------
  run.start(total_steps, recipe);
  auto& state = run.state;
  train::MetricWindow window;
  const int64_t n_micro = cfg.train.gradient_accumulation_steps;
  // train.logits_chunk_size: completion tokens through the LM head a chunk at a time (0: whole).
  const int64_t chunk_rows =
      cfg.train.logits_chunk_size == 0
          ? 0
          : algo::logits_chunk_rows(cfg.train.logits_chunk_size,
                                    model->config().text_config.vocab_size);
  // train.cpu_shards: a micro-batch as row shards whose forward + backward run at once. Per-pair
  // losses split exactly; the rpo/sft term (a mean over all chosen tokens of the micro-batch) is
  // added per shard over the micro-batch's token count; aot's batch-wide sort and mDPO's
  // corrupted images do not split.
  std::string shard_blocker;
  for (auto t : loss_cfg.loss_types) {
    if (t == algo::DpoLossType::kAot || t == algo::DpoLossType::kAotUnpaired) {
      shard_blocker = "dpo.loss_type " + algo::to_string(t) + " ranks the whole batch";
    }
  }
  const bool only_sft = std::all_of(loss_cfg.loss_types.begin(), loss_cfg.loss_types.end(),
                                    [](auto t) { return t == algo::DpoLossType::kSft; });
  if (only_sft) shard_blocker = "dpo.loss_type sft alone is a mean over the whole batch's tokens";
  if (mdpo) shard_blocker = "dpo.mdpo draws its corrupted images per batch";
  const std::vector<torch::Tensor> shard_params = trainable_tensors(trainable_named(sm));
  const int64_t n_shards = stage_cpu_shards(cfg.train.cpu_shards, shard_params, run,
                                            cfg.lora.dropout, shard_blocker, "dpo");
  // Sharded: the sft terms (rpo_alpha, or named in dpo.loss_type) leave the per-shard loss and
  // come back as one term over the micro-batch's chosen tokens, weighted by their summed weights.
  algo::DpoLossConfig shard_loss_cfg = loss_cfg;
  double sft_weight = 0;
  if (n_shards > 1) {
    shard_loss_cfg.loss_types.clear();
    shard_loss_cfg.loss_weights.clear();
    for (size_t k = 0; k < loss_cfg.loss_types.size(); ++k) {
      const double w = loss_cfg.loss_weights.empty() ? 1.0 : loss_cfg.loss_weights[k];
      if (loss_cfg.loss_types[k] == algo::DpoLossType::kSft) {
        sft_weight += w;
        continue;
      }
      shard_loss_cfg.loss_types.push_back(loss_cfg.loss_types[k]);
      if (!loss_cfg.loss_weights.empty()) shard_loss_cfg.loss_weights.push_back(w);
    }
  }

  // TRL's metric names (means over the pairs of the micro-batch), then mDPO's.
  std::vector<std::string> names = {"rewards/chosen", "rewards/rejected", "rewards/accuracies",
                                    "rewards/margins", "logps/chosen", "logps/rejected",
                                    "logits/chosen", "logits/rejected"};
  if (mdpo) names.push_back("mdpo/conditional");
  if (mdpo && cfg.dpo.mdpo.anchor) names.push_back("mdpo/anchor");
  // The reference side of a batch: precomputed, a no-grad forward, or none (reference-free).
  // Under LoRA the caller holds model::AdaptersDisabled around it.
  struct ReferenceSide {
    algo::PreferenceLogps logps;
    torch::Tensor chosen_corrupted;
  };
  auto reference_of = [&](const data::PreferenceBatch& b) {
    ReferenceSide r;
    if (ref_cache) {
      r.logps = ref_cache->lookup(b, device);
    } else if (!ref_free) {
      torch::NoGradGuard no_grad;
      auto rb = ref_dtype == dtype ? b : b.to(device, ref_dtype);
      auto f = train::preference_forward(reference.model, rb, false, mdpo, padding_free, chunk_rows);
      r.logps = f.logps;
      r.chosen_corrupted = f.chosen_corrupted;
    }
    return r;
  };
  // A batch's loss: its pairs' losses summed over `n_pairs` (the micro-batch's pairs on all
  // ranks), minus sft_per_token x its summed chosen log-probs (sharded rpo term; else 0). With it
  // the metric values [names.size()], means over the batch's pairs, detached.
  auto loss_of = [&](const data::PreferenceBatch& b, ReferenceSide ref_side,
                     const algo::DpoLossConfig& lc, double n_pairs, double sft_per_token) {
    auto pol = train::preference_forward(model, b, lc.use_weighting, mdpo, padding_free,
                                         chunk_rows);  // [2B] rows
    auto& ref = ref_side.logps;
    if (!ref_free) {  // counts come from the policy's masks (same tokens)
      ref.n_chosen = pol.logps.n_chosen;
      ref.n_rejected = pol.logps.n_rejected;
      for (auto* t : {&ref.chosen, &ref.rejected, &ref.chosen_tail, &ref.rejected_tail}) {
        *t = t->to(torch::kFloat32);
      }
    }
    auto out_l = algo::dpo_loss(pol.logps, ref_free ? nullptr : &ref, lc);
    auto loss = out_l.losses.sum() / n_pairs;  // = mean over the micro-batch of all ranks
    if (sft_per_token != 0) loss = loss - sft_per_token * pol.logps.chosen.sum();
    auto rc = out_l.rewards_chosen, rr = out_l.rewards_rejected;
    std::vector<torch::Tensor> values = {rc.mean(), rr.mean(), (rc > rr).to(rc.scalar_type()).mean(),
                                         (rc - rr).mean(), pol.logps.chosen.mean(),
                                         pol.logps.rejected.mean(), pol.logits_mean_chosen.mean(),
                                         pol.logits_mean_rejected.mean()};
    if (mdpo) {
      auto m = algo::mdpo_loss(pol.logps.chosen, ref.chosen, pol.chosen_corrupted,
                               ref_side.chosen_corrupted.to(torch::kFloat32), cfg.dpo.beta,
                               cfg.dpo.mdpo.anchor_delta);
      loss = loss + cfg.dpo.mdpo.conditional_weight * m.conditional.sum() / n_pairs;
      values.push_back(m.conditional.mean());
      if (cfg.dpo.mdpo.anchor) {
        loss = loss + cfg.dpo.mdpo.anchor_weight * m.anchor.sum() / n_pairs;
        values.push_back(m.anchor.mean());
      }
    }
    return std::make_pair(loss, torch::stack(values).detach().to(torch::kFloat64));
  };
  while (state.step < total_steps) {
    // The step's micro-batches first: each one's loss is a mean over its pairs on all ranks.
    auto step = next_step_batches(loader, n_micro, run, cfg.data.train);
    auto& micro = step.micro;
    const auto& pairs = step.global_counts;
    optimizer.zero_grad();
    double step_loss = 0.0;
    for (int64_t a = 0; a < n_micro; ++a) {
      if (micro[a].empty()) continue;  // this rank's share of the window is empty
      const double n_pairs = pairs[a];
      const auto B = static_cast<int64_t>(micro[a].size());
      const int64_t n = std::min(n_shards, B);
      torch::Tensor values, loss;  // metric values [names.size()] float64; the micro-batch's loss
      int64_t n_tokens = 0;
      if (n == 1) {
        auto b = data::collate_preference(micro[a], pad_id).to(device, dtype);
        ReferenceSide r;
        {
          model::AdaptersDisabled adapters_off(ref_cache ? nullptr : reference.adapters_off);
          r = reference_of(b);
        }
        auto [l, v] = loss_of(b, r, loss_cfg, n_pairs, 0.0);
        if (a + 1 == n_micro) optimizer.arm_gradient_sync();  // all-reduce during backward
        (l / static_cast<double>(n_micro)).backward();
        // metrics and loss: one device-to-host copy per micro-batch
        auto stats = torch::cat({v, l.detach().to(torch::kFloat64).view({1})}).to(torch::kCPU);
        values = stats.narrow(0, 0, static_cast<int64_t>(names.size()));
        loss = stats[static_cast<int64_t>(names.size())];
        n_tokens = b.n_tokens;
      } else {  // train.cpu_shards (one process: no gradient all-reduce to arm)
        std::vector<data::PreferenceBatch> parts;
        int64_t chosen_tokens = 0;  // the sft term's denominator: all chosen tokens of the batch
        for (int64_t s = 0; s < n; ++s) {
          const auto [begin, end] = train::shard_range(B, n, s);
          auto cb = data::collate_preference(
              std::vector<data::PreferenceSample>(micro[a].begin() + begin, micro[a].begin() + end),
              pad_id);
          chosen_tokens += algo::n_supervised_targets(cb.labels.narrow(0, 0, cb.batch_size));
          n_tokens += cb.n_tokens;
          parts.push_back(cb.to(device, dtype));
        }
        const double sft_per_token =
            sft_weight * static_cast<double>(B) /
            (static_cast<double>(std::max<int64_t>(chosen_tokens, 1)) * n_pairs);
        std::vector<ReferenceSide> refs(static_cast<size_t>(n));
        {  // the reference sides first (LoRA: adapters off for all shards at once)
          model::AdaptersDisabled adapters_off(ref_cache ? nullptr : reference.adapters_off);
          train::run_concurrently(n, [&](int64_t s) { refs[s] = reference_of(parts[s]); });
        }
        std::vector<torch::Tensor> shard_values(static_cast<size_t>(n));
        auto losses = train::backward_shards(
            n,
            [&](int64_t s) {
              auto [l, v] = loss_of(parts[s], refs[s], shard_loss_cfg, n_pairs, sft_per_token);
              shard_values[s] = v.to(torch::kCPU) * (static_cast<double>(parts[s].batch_size) /
                                                     static_cast<double>(B));
              return l / static_cast<double>(n_micro);
            },
            shard_params);
        loss = losses.sum() * static_cast<double>(n_micro);
        values = torch::stack(shard_values).sum(0);
      }
      auto sa = values.accessor<double, 1>();
      for (size_t k = 0; k < names.size(); ++k) window.add(names[k], sa[k]);
      step_loss += loss.item<double>() / static_cast<double>(n_micro);
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
      run.log_step(m, {"loss", "rewards/accuracies", "rewards/margins", "logps/chosen"});
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
  log_info("dpo: final model written to " + out.string() + " (" +
           std::to_string(loader.n_skipped()) + " bad pairs skipped)");
  run_eval();
  return run.completed();
}

Stage setup_dpo(CLI::App& app) {
  return training_stage<config::DpoConfig>(
      app, "dpo", "preference optimization (DPO family, mDPO) on preference JSONL",
      config::load_dpo_config, run_dpo);
}

}  // namespace mmpost::cli
