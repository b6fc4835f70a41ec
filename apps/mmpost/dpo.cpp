// mmpost dpo: preference optimization of a VLM on TRL preference JSONL (prompt, chosen,
// rejected + images). The stage is the loop: setup -> policy + reference -> data -> optimizer ->
// resume -> loop -> final save. Each micro-batch is one concatenated forward (chosen rows on
// rejected rows, one vision pass per image); the loss is algo::dpo_loss (TRL's loss types) plus
// optional mDPO terms, averaged over pairs and over the micro-batches of a step.
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "mmpost/algo/dpo_loss.h"
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
#include "mmpost/io/hf_folder.h"
#include "mmpost/io/jsonl.h"
#include "mmpost/stage_common.h"
#include "mmpost/train/checkpointing.h"
#include "mmpost/train/optimizer.h"
#include "mmpost/train/preference.h"

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

/// Running means of the logged quantities between two log lines.
struct MetricWindow {
  std::map<std::string, double> sum;
  int64_t n = 0;
  void add(const std::string& k, double v) { sum[k] += v; }
};

}  // namespace

/// Runs DPO for a validated recipe; returns the exit code (0, or 128 + signal after a stop).
int run_dpo(const config::DpoConfig& cfg, bool allow_resume) {
  // ---- setup -------------------------------------------------------------------------------
  install_stop_handlers();
  if (cfg.num_threads > 0) torch::set_num_threads(static_cast<int>(cfg.num_threads));
  const torch::Device device = resolve_device(cfg.device);
  const torch::Dtype dtype = resolve_dtype(cfg.dtype, device);
  const torch::Dtype ref_dtype = cfg.dpo.ref_dtype.empty() ? dtype
                                                           : resolve_dtype(cfg.dpo.ref_dtype, device);
  seed_everything(static_cast<uint64_t>(cfg.seed));
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
  fs::create_directories(out);
  const nlohmann::json recipe = config::to_json(cfg);
  io::write_text_atomic(out / "recipe.json", recipe.dump(2) + "\n");
  log_info("dpo: resolved recipe\n" + config::format_table(config::to_rows(cfg)));
  std::optional<fs::path> ckpt;
  if (allow_resume) ckpt = io::latest_complete_checkpoint(out);

  // ---- policy + reference ------------------------------------------------------------------
  auto sm = load_stage_model(cfg.model, cfg.data.image, ckpt, device, dtype, "dpo");
  model::Vlm model = sm.model;
  data::Tokenizer& tokenizer = *sm.tokenizer;
  model::Vlm reference{nullptr};
  const fs::path ref_src = cfg.dpo.ref_model.empty() ? fs::path(cfg.model.path)
                                                     : fs::path(cfg.dpo.ref_model);
  if (!ref_free) {  // the starting policy, never the resumed checkpoint
    log_info("dpo: reference model from " + ref_src.string() + " (" + dtype_name(ref_dtype) + ")");
    reference = io::load_pretrained(ref_src).model;
    MMPOST_CHECK_USAGE(reference->config().text_config.vocab_size ==
                           model->config().text_config.vocab_size,
                       "dpo.ref_model: vocabulary size differs from the policy's");
    reference->to(device, ref_dtype);
    reference->eval();
    for (auto& p : reference->parameters()) p.set_requires_grad(false);
  }

  // ---- data --------------------------------------------------------------------------------
  const int64_t pad_id = pad_id_of(tokenizer);
  data::SampleContext ctx = make_sample_context(sm, cfg.data, cfg.data.train);
  data::SampleContext train_ctx = ctx;
  train_ctx.random_shift = cfg.data.image.random_shift;
  const data::PreferenceLimits limits{cfg.dpo.max_prompt_length, cfg.dpo.max_completion_length,
                                      cfg.data.max_length};
  const data::ImageCorruption corruption{cfg.dpo.mdpo.corruption,
                                         cfg.dpo.mdpo.corruption_strength};
  data::LoaderOptions lo;
  lo.path = cfg.data.train;
  lo.batch_size = cfg.train.batch_size;
  lo.num_workers = cfg.data.num_workers;
  lo.shuffle_buffer = cfg.data.shuffle_buffer;
  lo.prefetch = cfg.data.prefetch;
  lo.seed = static_cast<uint64_t>(cfg.seed);
  lo.skip_bad = cfg.data.on_bad_sample == "skip";
  lo.repeat = true;
  data::StreamingLoader<data::PreferenceSample> loader(
      lo, [&](const nlohmann::json& rec, int64_t line, uint64_t seed) {
        return data::make_preference_sample(rec, line, train_ctx, limits,
                                            mdpo ? &corruption : nullptr, seed);
      });
  const int64_t n_records = data::count_records(cfg.data.train);
  const int64_t per_step = cfg.train.batch_size * cfg.train.gradient_accumulation_steps;
  const int64_t total_steps =
      cfg.train.max_steps > 0
          ? cfg.train.max_steps
          : std::max<int64_t>(1, static_cast<int64_t>(std::ceil(cfg.train.epochs * n_records /
                                                               static_cast<double>(per_step))));
  log_info("dpo: " + std::to_string(n_records) + " preference pairs, " + std::to_string(per_step) +
           " pairs/step, " + std::to_string(total_steps) + " steps; loss " +
           [&] {
             std::string s;
             for (size_t k = 0; k < loss_cfg.loss_types.size(); ++k) {
               s += (k ? " + " : "") +
                    (loss_cfg.loss_weights.empty() ? std::string()
                                                   : fmt(loss_cfg.loss_weights[k], 3) + "*") +
                    algo::to_string(loss_cfg.loss_types[k]);
             }
             return s;
           }() + (mdpo ? " + mDPO" : ""));
  train::PreferenceEvalOptions eval_opts;
  eval_opts.beta = cfg.dpo.beta;
  eval_opts.batch_size = cfg.train.batch_size;
  eval_opts.num_workers = cfg.data.num_workers;
  eval_opts.skip_bad = lo.skip_bad;
  eval_opts.limits = limits;
  std::optional<train::ReferenceLogpsCache> ref_cache, eval_ref_cache;
  if (!ref_free && cfg.dpo.precompute_ref_log_probs) {
    // Keyed by everything the values depend on, so a resumed run reuses them and a changed
    // setting recomputes them.
    auto precompute = [&](const std::string& path, const std::string& file) {
      if (!allow_resume) fs::remove(out / file);  // --no-resume recomputes
      const std::string key = fs::absolute(ref_src).string() + "|" + fingerprint(ref_src) + "|" +
                              fs::absolute(path).string() + "|" + content_hash(path) + "|" +
                              std::to_string(limits.max_prompt_length) + "|" +
                              std::to_string(limits.max_completion_length) + "|" +
                              std::to_string(limits.max_length) + "|" + dtype_name(ref_dtype);
      return train::precompute_reference_logps(reference, ctx, path, eval_opts, device,
                                               ref_dtype, out / file, key);
    };
    ref_cache = precompute(cfg.data.train, "ref_logps.safetensors");
    if (!cfg.data.eval.empty()) eval_ref_cache = precompute(cfg.data.eval, "ref_logps_eval.safetensors");
    reference = model::Vlm{nullptr};  // no longer needed: free its memory
  }

  // ---- optimizer ---------------------------------------------------------------------------
  std::vector<std::pair<std::string, torch::Tensor>> named;
  std::vector<torch::Tensor> trainable;
  auto named_items = model->named_parameters(/*recurse=*/true);  // keep alive while iterating
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
    log_info("dpo: resumed from " + ckpt->string() + " at step " + std::to_string(state.step));
  }
  auto save = [&]() {
    state.loader = loader.cursor();
    state.n_skipped = loader.n_skipped();
    auto dir = train::save_checkpoint(out, state, model, sm.tokenizer_path, sm.image, *optimizer,
                                      recipe, cfg.train.keep_last_n_checkpoints, &tokenizer);
    log_info("dpo: checkpoint " + dir.string());
  };
  io::JsonlWriter metrics(out / "metrics.jsonl");
  auto run_eval = [&]() {
    if (cfg.data.eval.empty()) return;
    auto o = eval_opts;
    o.max_samples = cfg.train.eval_max_samples;
    o.show_progress = false;
    model::Vlm* ref = reference ? &reference : nullptr;
    const train::ReferenceLogpsCache* cache = eval_ref_cache ? &*eval_ref_cache : nullptr;
    auto r = train::evaluate_preferences(model, ref, ctx, cfg.data.eval, o, device, dtype, cache);
    log_info("dpo: eval step " + std::to_string(state.step) + " rewards/accuracies " +
             fmt(r.accuracy) + " rewards/margins " + fmt(r.margin) + " (" + std::to_string(r.n) +
             " pairs" + (ref || cache || !ref_free ? ")" : ", reference-free)"));
    metrics.write({{"step", state.step},
                   {"eval/rewards/accuracies", r.accuracy},
                   {"eval/rewards/margins", r.margin},
                   {"eval/rewards/chosen", r.reward_chosen},
                   {"eval/rewards/rejected", r.reward_rejected},
                   {"eval/logps/chosen", r.logps_chosen},
                   {"eval/logps/rejected", r.logps_rejected},
                   {"eval/n", r.n}});
  };

  // ---- loop --------------------------------------------------------------------------------
  Progress progress("dpo", total_steps);
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
      auto b = data::collate_preference(*samples, pad_id).to(device, dtype);
      const int64_t B = b.batch_size;
      auto pol = train::preference_forward(model, b, loss_cfg.use_weighting, mdpo);
      algo::PreferenceLogps ref;
      torch::Tensor ref_chosen_corrupted;
      if (ref_cache) {
        ref = ref_cache->lookup(b, device);
      } else if (!ref_free) {
        torch::NoGradGuard no_grad;
        auto rb = ref_dtype == dtype ? b : b.to(device, ref_dtype);
        auto r = train::preference_forward(reference, rb, false, mdpo);
        ref = r.logps;
        ref_chosen_corrupted = r.chosen_corrupted;
      }
      if (!ref_free) {  // counts come from the policy's masks (same tokens)
        ref.n_chosen = pol.logps.n_chosen;
        ref.n_rejected = pol.logps.n_rejected;
        for (auto* t : {&ref.chosen, &ref.rejected, &ref.chosen_tail, &ref.rejected_tail}) {
          *t = t->to(torch::kFloat32);
        }
      }
      auto out_l = algo::dpo_loss(pol.logps, ref_free ? nullptr : &ref, loss_cfg);
      auto loss = out_l.losses.mean();
      if (mdpo) {
        auto m = algo::mdpo_loss(pol.logps.chosen, ref.chosen, pol.chosen_corrupted,
                                 ref_chosen_corrupted.to(torch::kFloat32), cfg.dpo.beta,
                                 cfg.dpo.mdpo.anchor_delta);
        loss = loss + cfg.dpo.mdpo.conditional_weight * m.conditional.mean();
        window.add("mdpo/conditional", m.conditional.mean().item<double>() / n_micro);
        if (cfg.dpo.mdpo.anchor) {
          loss = loss + cfg.dpo.mdpo.anchor_weight * m.anchor.mean();
          window.add("mdpo/anchor", m.anchor.mean().item<double>() / n_micro);
        }
      }
      (loss / static_cast<double>(n_micro)).backward();
      step_loss += loss.item<double>() / n_micro;
      // TRL's metric names, means over the pairs of the step: one device-to-host copy for all.
      auto rc = out_l.rewards_chosen, rr = out_l.rewards_rejected;
      static const char* kNames[] = {"rewards/chosen", "rewards/rejected", "rewards/accuracies",
                                     "rewards/margins", "logps/chosen", "logps/rejected",
                                     "logits/chosen", "logits/rejected"};
      auto stats = torch::stack({rc.mean(), rr.mean(), (rc > rr).to(rc.scalar_type()).mean(),
                                 (rc - rr).mean(), pol.logps.chosen.mean(),
                                 pol.logps.rejected.mean(), pol.logits_mean_chosen.mean(),
                                 pol.logits_mean_rejected.mean()})
                       .detach()
                       .to(torch::kCPU, torch::kFloat64);
      auto sa = stats.accessor<double, 1>();
      for (int k = 0; k < 8; ++k) window.add(kNames[k], sa[k] / n_micro);
      pairs_window += B;
      tokens_window += b.n_tokens;
      state.tokens_seen += b.n_tokens;
    }
    MMPOST_CHECK(std::isfinite(step_loss), "step ", state.step + 1, ": loss is ", step_loss,
                 "; stopping before the update so the last checkpoint stays valid",
                 "\n  hint: lower optim.lr or dpo.beta, keep train.clip_grad_norm > 0");
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
               " loss " + fmt(m["loss"].get<double>()) + " rewards/accuracies " +
               fmt(m["rewards/accuracies"].get<double>(), 3) + " rewards/margins " +
               fmt(m["rewards/margins"].get<double>()) + " logps/chosen " +
               fmt(m["logps/chosen"].get<double>()) + " lr " + fmt(lr, 3) + " grad_norm " +
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
      log_warn("dpo: signal " + std::to_string(sig) + " received; saving a checkpoint");
      save();
      return 128 + sig;
    }
  }
  progress.finish();

  // ---- final save --------------------------------------------------------------------------
  save();
  io::save_pretrained(out, model, sm.tokenizer_path, sm.image, torch::kFloat32, int64_t{5} << 30,
                      &tokenizer);
  log_info("dpo: final model written to " + out.string() + " (" +
           std::to_string(loader.n_skipped()) + " bad pairs skipped)");
  run_eval();
  return 0;
}

Stage setup_dpo(CLI::App& app) {
  return training_stage<config::DpoConfig>(
      app, "dpo", "preference optimization (DPO family, mDPO) on preference JSONL",
      config::load_dpo_config, run_dpo);
}

}  // namespace mmpost::cli
