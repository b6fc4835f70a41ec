// mmpost rlhf: online RL for a VLM on prompt JSONL. Each step: pick prompts (curriculum) ->
// sample num_generations completions per prompt with the KV cache (recording their log-probs) ->
// score them (rule-based verifiers, a learned reward model) -> advantages (GRPO / RLOO /
// REINFORCE++ / PPO with GAE) -> num_iterations clipped-surrogate updates (algo::policy_loss,
// TRL's loss types), with per-step diagnostics. Prompts are held in memory for random access by
// the curriculum. One vision pass per prompt image serves all G completions.
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>

#include "mmpost/algo/chunked_logps.h"
#include "mmpost/algo/kl.h"
#include "mmpost/algo/logprobs.h"
#include "mmpost/algo/policy_gradient.h"
#include "mmpost/algo/rewards.h"
#include "mmpost/cli_common.h"
#include "mmpost/config/recipe.h"
#include "mmpost/config/schema.h"
#include "mmpost/core/check.h"
#include "mmpost/core/device.h"
#include "mmpost/core/log.h"
#include "mmpost/core/signals.h"
#include "mmpost/data/collate.h"
#include "mmpost/data/curriculum.h"
#include "mmpost/data/loader.h"
#include "mmpost/data/prompt_dataset.h"
#include "mmpost/hub/hf_folder.h"
#include "mmpost/hub/reward_model_folder.h"
#include "mmpost/io/checkpoint.h"
#include "mmpost/io/jsonl.h"
#include "mmpost/io/safetensors.h"
#include "mmpost/model/generation.h"
#include "mmpost/model/reward_model.h"
#include "mmpost/stage_common.h"
#include "mmpost/train/checkpointing.h"
#include "mmpost/train/evaluate.h"
#include "mmpost/train/optimizer.h"
#include "mmpost/train/rollout.h"
#include "mmpost/train/run.h"

namespace mmpost::cli {
namespace fs = std::filesystem;
using torch::Tensor;

namespace {

/// L2 norm of the gradients of a module's parameters.
double grad_norm_of_module(torch::nn::Module& m) {
  double sq = 0;
  for (const auto& p : m.parameters()) {
    if (p.grad().defined()) sq += p.grad().to(torch::kFloat64).pow(2).sum().item<double>();
  }
  return std::sqrt(sq);
}

/// Gradient norm of a part as model.freeze names it (either family: model::model_part).
double grad_norm_of_part(model::VlmImpl& m, const std::string& part) {
  double sq = 0;
  for (auto* module : model::model_part(m, part)) sq += std::pow(grad_norm_of_module(*module), 2);
  return std::sqrt(sq);
}

/// The step's groups of every rank in global prompt order (see gather_groups).
struct GlobalGroups {
  std::vector<int64_t> pool_index;  // [P_all] prompt pool index of each global prompt
  Tensor rewards, passed;           // [P_all * G] float32 (CPU), rows grouped by prompt
  Tensor local_rows;                // [P_local * G] int64: this rank's rows in `rewards`
};

/// Gathers (global position, pool index, G rewards, G pass marks) of each local prompt from every
/// rank and orders them by global position; one process gets its own rows back. rewards and
/// passed [P_local * G] float32 CPU. Throws dist::DistError when a peer fails.
GlobalGroups gather_groups(const train::Run& run, const std::vector<int64_t>& positions,
                           const std::vector<int64_t>& pool_index, const Tensor& rewards,
                           const Tensor& passed, int64_t G) {
  std::vector<double> mine;  // per prompt: position, pool index, G rewards, G passed
  auto rw_t = rewards.to(torch::kFloat64).contiguous(), ps_t = passed.to(torch::kFloat64).contiguous();
  auto rw = rw_t.accessor<double, 1>(), ps = ps_t.accessor<double, 1>();
  for (size_t j = 0; j < positions.size(); ++j) {
    const auto row0 = static_cast<int64_t>(j) * G;
    mine.push_back(static_cast<double>(positions[j]));
    mine.push_back(static_cast<double>(pool_index[j]));
    for (int64_t g = 0; g < G; ++g) mine.push_back(rw[row0 + g]);
    for (int64_t g = 0; g < G; ++g) mine.push_back(ps[row0 + g]);
  }
  std::vector<std::vector<double>> parts{mine};
  if (auto* pg = run.process_group()) parts = pg->all_gather_object(mine);
  const size_t width = 2 + 2 * static_cast<size_t>(G);
  std::map<int64_t, std::pair<int, const double*>> by_pos;  // position -> (rank, record)
  for (size_t rk = 0; rk < parts.size(); ++rk) {
    for (size_t i = 0; i + width <= parts[rk].size(); i += width) {
      by_pos[static_cast<int64_t>(parts[rk][i])] = {static_cast<int>(rk), &parts[rk][i]};
    }
  }
  GlobalGroups out;
  std::vector<float> r_all, p_all;
  std::map<int64_t, int64_t> row_of_pos;
  for (const auto& [pos, rec] : by_pos) {
    row_of_pos[pos] = static_cast<int64_t>(out.pool_index.size()) * G;
    out.pool_index.push_back(static_cast<int64_t>(rec.second[1]));
    for (int64_t g = 0; g < G; ++g) r_all.push_back(static_cast<float>(rec.second[2 + g]));
    for (int64_t g = 0; g < G; ++g) p_all.push_back(static_cast<float>(rec.second[2 + G + g]));
  }
  out.rewards = torch::tensor(r_all, torch::kFloat32);
  out.passed = torch::tensor(p_all, torch::kFloat32);
  std::vector<int64_t> rows;
  for (int64_t pos : positions) {
    for (int64_t g = 0; g < G; ++g) rows.push_back(row_of_pos.at(pos) + g);
  }
  out.local_rows = torch::tensor(rows, torch::kInt64);
  return out;
}

/// The recipe's enum-valued rlhf keys, parsed with the algo layer's name tables (the parser, the
/// error's "valid values" and the help text all read them), plus the checks that need them.
struct RlhfChoices {
  algo::RlAlgorithm algorithm;
  algo::ScaleRewards scale_rewards;
  algo::PolicyLossType loss_type;
  algo::ImportanceSamplingLevel importance_sampling_level;
  algo::KlEstimator kl_estimator;
};

/// Throws Error(kUsage) naming the recipe key for an unknown name or an inconsistent choice.
RlhfChoices parse_choices(const config::RlhfSection& rl) {
  RlhfChoices c{algo::parse_rl_algorithm(rl.algorithm), algo::parse_scale_rewards(rl.scale_rewards),
                algo::parse_policy_loss_type(rl.loss_type),
                algo::parse_importance_sampling_level(rl.importance_sampling_level),
                algo::parse_kl_estimator(rl.kl_estimator)};
  const bool grouped = c.algorithm != algo::RlAlgorithm::kPpo &&
                       c.algorithm != algo::RlAlgorithm::kReinforcePp;
  MMPOST_CHECK_USAGE(!grouped || rl.num_generations >= 2, "rlhf.num_generations: ", rl.algorithm,
                     " needs >= 2 completions per prompt for its group baseline");
  MMPOST_CHECK_USAGE(c.kl_estimator != algo::KlEstimator::kFull || !rl.kl_in_reward,
                     "rlhf.kl_estimator: full is a loss term; it cannot be folded into the reward");
  return c;
}

/// load_rlhf_config + parse_choices: a bad name exits 2 before any file is touched.
config::RlhfConfig load_rlhf(const std::string& recipe, const std::vector<std::string>& sets) {
  auto cfg = config::load_rlhf_config(recipe, sets);
  parse_choices(cfg.rlhf);
  return cfg;
}

}  // namespace

/// Runs online RL for a validated recipe; returns the exit code (0, or 128 + signal).
int run_rlhf(const config::RlhfConfig& cfg, bool allow_resume) {
  // ---- setup: lock OUTPUT, find the checkpoint to resume from, signals, device, seed --------
  train::Run run("rlhf", cfg, allow_resume);
  const int world = run.world().world_size, rank = run.world().rank;
  const torch::Device device = run.device();
  const torch::Dtype dtype = run.dtype();
  const auto& ckpt = run.checkpoint();
  const auto& rl = cfg.rlhf;
  const RlhfChoices choices = parse_choices(rl);
  const algo::RlAlgorithm algorithm = choices.algorithm;
  const bool ppo = algorithm == algo::RlAlgorithm::kPpo;
  const algo::ScaleRewards scale_rewards = choices.scale_rewards;
  // Data parallel: rollouts are sharded by prompt (a group never straddles ranks); the
  // sequence-level advantages are computed on the gathered rewards of all ranks, and the
  // token-level estimators whiten with statistics summed over every rank's tokens (batch_sum).
  algo::BatchSum batch_sum;
  if (world > 1) batch_sum = [&run](std::vector<double> v) { return run.all_sum(std::move(v)); };
  const int64_t G = rl.num_generations;
  auto specs = algo::parse_reward_specs(rl.rewards, "rlhf.rewards");
  algo::PolicyLossConfig pcfg;
  pcfg.loss_type = choices.loss_type;
  pcfg.importance_sampling_level = choices.importance_sampling_level;
  pcfg.epsilon = rl.epsilon;
  if (rl.epsilon_high.is_number()) pcfg.epsilon_high = rl.epsilon_high.get<double>();
  const auto kl_est = choices.kl_estimator;
  const bool full_kl = kl_est == algo::KlEstimator::kFull;
  const bool kl_loss = rl.beta > 0 && !rl.kl_in_reward;
  pcfg.beta = kl_loss && !full_kl ? rl.beta : 0.0;
  if (!full_kl) pcfg.kl_estimator = kl_est;
  pcfg.max_completion_length = rl.max_completion_length;
  algo::validate(pcfg);
  auto curriculum_cfg = data::parse_curriculum_config(rl.curriculum, "rlhf.curriculum");
  log_info("rlhf: resolved recipe\n" + config::format_table(config::to_rows(cfg)));

  // ---- policy, reference, reward model, value head -------------------------------------------
  MMPOST_CHECK_USAGE(!cfg.data.packing, "data.packing: only sft packs its batches; rlhf does not",
                     "\n  hint: remove data.packing from the recipe");
  MMPOST_CHECK_USAGE(cfg.train.cpu_shards <= 1, "train.cpu_shards: ", cfg.train.cpu_shards,
                     " shards: only sft, dpo and rm split their micro-batches; rlhf does not",
                     "\n  hint: set it to 0 (auto: off here) or 1");
  auto sm = load_stage_model(cfg.model, cfg.data.image, ckpt, device, dtype, "rlhf", cfg.lora);
  model::Vlm model = sm.model;
  data::Tokenizer& tokenizer = *sm.tokenizer;
  StageReference reference;
  if (rl.beta > 0) {  // beta = 0 loads no reference model (TRL)
    reference = load_reference(sm, cfg.lora, cfg.model.path, "", device, dtype, "rlhf");
  }
  model::RewardModel reward_model{nullptr};
  if (!rl.reward_model.empty()) {
    log_info("rlhf: reward model from " + rl.reward_model);
    reward_model = hub::load_reward_model(rl.reward_model).model;
    MMPOST_CHECK_USAGE(reward_model->model->is_qwen2_vl() == sm.model->is_qwen2_vl(),
                       "rlhf.reward_model: ", rl.reward_model, " is a ",
                       reward_model->model->is_qwen2_vl() ? "Qwen2-VL family" : "LLaVA-style",
                       " model but the policy is not (it scores the policy's token ids and images)");
    reward_model->to(device, dtype);
    reward_model->eval();
    for (auto& p : reward_model->parameters()) p.set_requires_grad(false);
  }
  MMPOST_CHECK_USAGE(!specs.empty() || reward_model, "rlhf.rewards: no reward function and no "
                     "rlhf.reward_model: nothing to optimize");
  torch::nn::Linear value_head{nullptr};
  if (ppo) {  // V(s) on the policy's hidden states (shared trunk, TRL's old ValueHead)
    value_head = torch::nn::Linear(
        torch::nn::LinearOptions(model->config().text_config.hidden_size, 1).bias(true));
    torch::nn::init::normal_(value_head->weight, 0.0, 1e-3);
    torch::nn::init::zeros_(value_head->bias);
    if (ckpt) train::load_value_head(value_head, *ckpt);
    value_head->to(device, dtype);
  }

  // ---- data --------------------------------------------------------------------------------
  const int64_t pad_id = pad_id_of(tokenizer);
  data::SampleContext ctx = make_sample_context(sm, cfg.data, cfg.data.train);
  ctx.template_options.add_generation_prompt = false;
  const bool skip_bad = cfg.data.on_bad_sample == "skip";
  data::PromptPool pool = data::load_prompts(cfg.data.train, ctx, skip_bad, specs);
  data::Curriculum curriculum(curriculum_cfg, data::group_by_difficulty(pool.difficulty),
                              static_cast<uint64_t>(cfg.seed));
  const int64_t B = cfg.train.batch_size;  // prompts per step
  const int64_t total_steps =
      train::total_steps_of(cfg.train, static_cast<int64_t>(pool.records.size()), B);
  int64_t pass_index = 0;  // which reward decides pass/fail
  if (!rl.pass_reward.empty()) {
    auto it = std::find_if(specs.begin(), specs.end(),
                           [&](const algo::RewardSpec& s) { return s.name == rl.pass_reward; });
    MMPOST_CHECK_USAGE(it != specs.end(), "rlhf.pass_reward: \"", rl.pass_reward,
                       "\" is not one of rlhf.rewards");
    pass_index = it - specs.begin();
  }
  log_info("rlhf: " + std::to_string(pool.records.size()) + " prompts (" +
           std::to_string(pool.n_skipped) + " skipped), " + std::to_string(B) + " prompts x " +
           std::to_string(G) + " completions per step, " + std::to_string(total_steps) +
           " steps; " + rl.algorithm + ", loss " + rl.loss_type + ", beta " + fmt(rl.beta));

  if (run.finished(total_steps)) return run.report_already_finished();

  // ---- optimizer, checkpoints, resume ------------------------------------------------------
  auto named = trainable_named(sm);
  if (ppo) {
    named.emplace_back("value_head.weight", value_head->weight);
    named.emplace_back("value_head.bias", value_head->bias);
  }
  train::Optimizer optimizer(named, cfg.optim, cfg.scheduler, cfg.train.clip_grad_norm,
                             total_steps, run.process_group(), cfg.dist);
  train::Checkpointer checkpointer(cfg.output_dir, cfg.train.keep_last_n_checkpoints,
                                   {.vlm = model, .value_head = value_head,
                                    .tokenizer = sm.tokenizer.get(), .image = sm.image,
                                    .lora = sm.lora.get(),
                                    .lora_modules_to_save = cfg.lora.modules_to_save,
                                    .lora_base_model = cfg.model.path,
                                    .lora_merge_on_save = cfg.lora.merge_on_save},
                                   optimizer, ckpt ? run.state.step : -1, run.is_main());
  if (ckpt) {
    train::load_optimizer_and_rng(*ckpt, optimizer);
    if (run.state.extra.contains("curriculum")) curriculum.load_state(run.state.extra["curriculum"]);
  }
  const nlohmann::json recipe = config::to_json(cfg);
  auto save = [&] {
    run.state.extra["curriculum"] = curriculum.state();
    run.state.n_skipped = pool.n_skipped;
    log_info("rlhf: checkpoint " + checkpointer.save(run.state, recipe).string());
  };
  auto run_eval = [&]() {
    if (cfg.data.eval.empty()) return;
    train::ExactMatchOptions eo;
    eo.max_samples = cfg.train.eval_max_samples;
    eo.max_new_tokens = rl.max_completion_length;
    eo.skip_bad = skip_bad;
    eo.num_workers = cfg.data.num_workers;
    eo.show_progress = false;
    eo.pg = run.process_group();  // each rank evaluates its share
    eo.rewards = specs;
    data::SampleContext ectx = ctx;
    auto r = train::evaluate_exact_match(model, ectx, cfg.data.eval, eo, device, dtype, nullptr);
    nlohmann::json m = {{"eval/accuracy", r.accuracy}, {"eval/n", r.n}};
    std::string line = "rlhf: eval step " + std::to_string(run.state.step) + " (greedy, " +
                       std::to_string(r.n) + " prompts) exact match " + fmt(r.accuracy);
    for (const auto& [name, mean] : r.reward_means) {
      m["eval/rewards/" + name] = mean;
      line += " " + name + " " + fmt(mean);
    }
    run.log_eval(m, line);
  };
  model::GenerationConfig gen;
  gen.max_new_tokens = rl.max_completion_length;
  gen.temperature = rl.temperature;
  gen.top_p = rl.top_p;
  gen.top_k = rl.top_k;
  gen.eos_token_ids = {tokenizer.eos_id()};
  gen.pad_token_id = pad_id;
  if (!rl.stop.empty()) {
    gen.stop_check = [&tokenizer, &rl](const std::vector<int64_t>& ids) {
      const std::string text = tokenizer.decode(ids);
      return std::any_of(rl.stop.begin(), rl.stop.end(),
                         [&](const std::string& s) { return text.find(s) != std::string::npos; });
    };
  }

  // ---- loop --------------------------------------------------------------------------------
  run.start(total_steps, recipe);
  auto& state = run.state;
  train::MetricWindow window;
  auto t_last = std::chrono::steady_clock::now();
  // train.logits_chunk_size: completion tokens through the LM head a chunk at a time (0: whole
  // logits; the exact-KL estimator keeps whole logits, it needs every vocabulary entry).
  const int64_t chunk_rows =
      cfg.train.logits_chunk_size == 0
          ? 0
          : algo::logits_chunk_rows(cfg.train.logits_chunk_size,
                                    model->config().text_config.vocab_size);
  const bool keep_logits = (kl_loss && full_kl) || chunk_rows == 0;  // whole: entropy from them
  while (state.step < total_steps) {
    // -- rollout: prompts -> G completions each, with log-probs (no grad) --
    auto t0 = std::chrono::steady_clock::now();
    // Every rank draws the same global batch of B * world prompts; this rank takes positions
    // p % world == rank. Each completion samples from its own seed (step, p, g), so the tokens
    // do not depend on how the prompts are spread over ranks.
    const auto picked_all = curriculum.next_batch(B * world);
    std::vector<data::SftSample> samples;
    std::vector<int64_t> prompt_index, prompt_pos;
    for (size_t p = rank; p < picked_all.size(); p += world) {
      const int64_t idx = picked_all[p];
      try {
        samples.push_back(data::make_prompt_sample(pool.records[idx], pool.lines[idx], ctx));
        prompt_index.push_back(idx);
        prompt_pos.push_back(static_cast<int64_t>(p));
      } catch (const Error& e) {
        if (!skip_bad || e.kind() != ErrorKind::kData) throw;
        ++pool.n_skipped;
        log_warn(std::string("rlhf: skipping bad prompt: ") + e.what());
      }
    }
    MMPOST_CHECK_DATA(!samples.empty(), cfg.data.train, ": every prompt of step ", state.step + 1,
                      " was bad");
    gen.row_seeds.clear();
    for (int64_t p : prompt_pos) {
      for (int64_t g = 0; g < G; ++g) {
        gen.row_seeds.push_back(data::sample_seed(static_cast<uint64_t>(cfg.seed), state.step, p * G + g));
      }
    }
    train::Rollout r = train::sample_rollout(model, samples, std::move(prompt_index), G, gen,
                                             pad_id, device, dtype);
    const int64_t N = r.P * G;
    const Tensor lens = r.lengths, truncated = r.truncated;  // CPU, before any group filter
    // Decode and score.
    auto seqs = r.completion.cpu();
    std::vector<std::string> texts, refs, prompts;
    std::vector<int64_t> n_tokens;
    data::TemplateOptions prompt_opts = ctx.template_options;
    prompt_opts.add_generation_prompt = true;
    std::vector<std::string> prompt_texts;
    for (const auto& s : samples) {  // the prompt as the model saw it (no reference answer)
      auto msgs = s.messages;
      if (!msgs.empty() && msgs.back().role == "assistant") msgs.pop_back();
      prompt_texts.push_back(data::render_conversation(msgs, tokenizer, prompt_opts));
    }
    for (int64_t i = 0; i < N; ++i) {
      const int64_t p = i / G, len = lens[i].item<int64_t>();
      std::vector<int64_t> ids(seqs[i].data_ptr<int64_t>(), seqs[i].data_ptr<int64_t>() + len);
      texts.push_back(tokenizer.decode(ids));
      refs.push_back(pool.references[r.prompt_index[p]]);
      prompts.push_back(prompt_texts[p]);
      n_tokens.push_back(len);
    }
    auto scores = specs.empty() ? algo::RewardScores{} :
                  algo::score_all(specs, texts, refs, prompts, n_tokens);
    Tensor rewards = specs.empty() ? torch::zeros({N}) : scores.total.clone();
    torch::NoGradGuard rollout_no_grad;
    if (reward_model) {
      auto ids = torch::cat({r.prompt_ids, r.completion}, 1);
      auto mask = torch::cat({r.prompt_mask, r.mask.to(torch::kInt64)}, 1);
      auto rm = reward_model->forward(ids, {r.row_pixel_values, r.row_image_grid_thw}, mask).to(torch::kFloat32).cpu();
      window.add("rewards/reward_model/mean", rm.mean().item<double>());
      rewards = rewards + rl.reward_model_weight * rm;
    }
    for (size_t k = 0; k < scores.names.size(); ++k) {
      window.add("rewards/" + scores.names[k] + "/mean", scores.values[k].mean().item<double>());
      window.add("rewards/" + scores.names[k] + "/std", train::std_of(scores.values[k]));
    }
    // Pass rates per prompt (curriculum and logs).
    Tensor passed = specs.empty() ? (rewards > 0).to(torch::kFloat32)
                                  : (scores.values[pass_index] >= rl.pass_threshold).to(torch::kFloat32);
    if (reference) {
      model::AdaptersDisabled adapters_off(reference.adapters_off);
      r.ref_logps = train::completion_forward(reference.model, r, 0, r.P, false, chunk_rows).logps * r.mask;
      auto kl = algo::per_token_kl(r.old_logps, r.ref_logps,
                                   full_kl ? algo::KlEstimator::kK3 : kl_est);
      const double kl_mean = ((kl * r.mask).sum() / r.mask.sum().clamp_min(1)).item<double>();
      window.add("kl", kl_mean);
      if (rl.kl_in_reward && !ppo && algorithm != algo::RlAlgorithm::kReinforcePp) {
        rewards = rewards - rl.beta * (kl * r.mask).sum(1).cpu();  // sequence KL penalty
      }
    }
    // The step's rewards and pass marks of every rank, in global prompt order: the curriculum,
    // the logged reward and pass rate, and the group advantages see one batch, as in one process.
    const auto global = gather_groups(run, prompt_pos, r.prompt_index, rewards, passed, G);
    for (size_t p = 0; p < global.pool_index.size(); ++p) {
      curriculum.update(pool.difficulty[global.pool_index[p]],
                        global.passed.narrow(0, static_cast<int64_t>(p) * G, G).mean().item<double>());
    }
    window.add("pass_rate", global.passed.mean().item<double>());
    window.add("reward", global.rewards.mean().item<double>());
    window.add("reward_std", train::std_of(global.rewards));
    // Advantages: group statistics on the global rewards, then this rank's rows.
    auto rewards_dev = rewards.to(device);
    auto global_rewards_dev = global.rewards.to(device);
    auto local_rows = global.local_rows.to(device);
    auto token_rewards = [&] {  // per-token rewards with the KL penalty (REINFORCE++, PPO)
      auto ref = r.ref_logps.defined() ? r.ref_logps : r.old_logps;
      const double kl_coef = rl.kl_in_reward || ppo ? rl.beta : 0.0;
      return algo::kl_penalized_rewards(r.old_logps, ref, rewards_dev, r.mask, kl_coef,
                                        full_kl ? algo::KlEstimator::kK1 : kl_est);
    };
    switch (algorithm) {
      case algo::RlAlgorithm::kGrpo:
        r.advantages = algo::grpo_advantages(global_rewards_dev, G, scale_rewards)
                           .advantages.index_select(0, local_rows);
        break;
      case algo::RlAlgorithm::kRloo:
        r.advantages =
            algo::rloo_advantages(global_rewards_dev, G).advantages.index_select(0, local_rows);
        break;
      case algo::RlAlgorithm::kReinforcePpBaseline:
        r.advantages = algo::reinforce_pp_baseline_advantages(rewards_dev, G, r.mask, batch_sum);
        break;
      case algo::RlAlgorithm::kReinforcePp:
        r.advantages = algo::reinforce_pp_advantages(token_rewards(), r.mask, rl.gamma, batch_sum).first;
        break;
      case algo::RlAlgorithm::kPpo: {
        auto fwd = train::completion_forward(model, r, 0, r.P, false, chunk_rows);
        r.old_values = value_head(fwd.hidden).squeeze(-1).to(torch::kFloat32) * r.mask;
        auto [adv, returns] = algo::gae(token_rewards(), r.old_values, r.mask, rl.gamma, rl.lam);
        r.advantages = rl.whiten_advantages ? algo::masked_whiten(adv, r.mask, true, batch_sum) * r.mask : adv;
        r.returns = returns;
        break;
      }
    }
    if (G > 1) {  // groups whose rewards are exactly equal carry no signal (advantage 0)
      auto grouped = rewards.view({r.P, G});
      auto all_equal = grouped.eq(grouped.narrow(1, 0, 1)).all(1);
      window.add("frac_reward_zero_std", all_equal.to(torch::kFloat32).mean().item<double>());
    }
    auto adv_rows = r.advantages.dim() == 2
                        ? (r.advantages * r.mask).sum(1) / r.mask.sum(1).clamp_min(1)
                        : r.advantages;
    window.add("advantages/mean", adv_rows.mean().item<double>());
    window.add("advantages/std", train::std_of(adv_rows));
    window.add("advantages/min", adv_rows.min().item<double>());
    window.add("advantages/max", adv_rows.max().item<double>());
    window.add("completions/mean_length", lens.to(torch::kFloat64).mean().item<double>());
    window.add("completions/max_length", lens.max().item<double>());
    window.add("completions/clipped_ratio", truncated.to(torch::kFloat64).mean().item<double>());
    if (rl.mask_truncated_completions) {
      r.mask = r.mask * (~truncated.to(device)).to(torch::kFloat32).unsqueeze(1);
    }
    if (rl.filter_zero_std_groups && G > 1) {
      auto kept_rows = algo::filter_zero_std_groups(rewards, G);
      std::vector<int64_t> keep;
      auto kr = kept_rows.cpu();
      for (int64_t i = 0; i < kr.size(0); i += G) keep.push_back(kr[i].item<int64_t>() / G);
      window.add("filtered_groups", static_cast<double>(r.P - static_cast<int64_t>(keep.size())));
      r = train::select_prompts(r, keep);
    }
    const double rollout_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    window.add("rollout_tokens_per_s", lens.sum().item<double>() / rollout_s);

    // -- update: num_iterations passes of the clipped surrogate over the rollout --
    auto t1 = std::chrono::steady_clock::now();
    double grad_norm = 0, update_tokens = 0;
    const double lr = optimizer.lr_at(state.step);
    // Normalisers of the whole step over all ranks: completion tokens and sequences of each
    // micro-batch; every loss type is then scaled to its one-process value on the union.
    const int64_t n_micro = cfg.train.gradient_accumulation_steps;
    std::vector<double> counts;  // [tokens_k, sequences_k] per micro-batch
    for (int64_t k = 0; k < n_micro; ++k) {
      const int64_t p0 = r.P * k / n_micro, p1 = r.P * (k + 1) / n_micro;
      counts.push_back(p1 > p0 ? r.mask.narrow(0, p0 * G, (p1 - p0) * G).sum().item<double>() : 0.0);
      counts.push_back(static_cast<double>((p1 - p0) * G));
    }
    const auto local_counts = counts;
    counts = run.all_sum(counts);
    double step_tokens = 0, step_sequences = 0;
    for (int64_t k = 0; k < n_micro; ++k) step_tokens += counts[2 * k], step_sequences += counts[2 * k + 1];
    if (step_tokens == 0) {
      log_warn("rlhf: step " + std::to_string(state.step + 1) +
               ": no completion token carries a gradient (all groups filtered or masked)");
    } else {
      for (int64_t it = 0; it < rl.num_iterations; ++it) {
        optimizer.zero_grad();
        double iteration_loss = 0;
        for (int64_t k = 0; k < n_micro; ++k) {
          const int64_t p0 = r.P * k / n_micro, p1 = r.P * (k + 1) / n_micro;
          if (p1 == p0) continue;  // this rank holds no prompt of this micro-batch
          const int64_t rows0 = p0 * G, rows = (p1 - p0) * G;
          // policy_loss averages over this micro-batch's sequences (grpo, sapo, luspo, dr_grpo)
          // or tokens (bnpo); weight it by its share of the step. dapo/cispo divide by the
          // step's token count directly (TRL's num_items_in_batch).
          const double token_share = local_counts[2 * k] / step_tokens;
          const double seq_share = local_counts[2 * k + 1] / step_sequences;
          const double policy_share =
              pcfg.loss_type == algo::PolicyLossType::kDapo || pcfg.loss_type == algo::PolicyLossType::kCispo
                  ? 1.0
                  : pcfg.loss_type == algo::PolicyLossType::kBnpo ? token_share : seq_share;
          torch::AutoGradMode grad_on(true);
          auto fwd = train::completion_forward(model, r, p0, p1, keep_logits, chunk_rows);
          auto mask = r.mask.narrow(0, rows0, rows);
          auto old = rl.num_iterations == 1 ? fwd.logps.detach()
                                            : r.old_logps.narrow(0, rows0, rows);
          auto adv = r.advantages.narrow(0, rows0, rows);
          Tensor ref = r.ref_logps.defined() ? r.ref_logps.narrow(0, rows0, rows) : Tensor();
          auto po = algo::policy_loss(fwd.logps, old, adv, mask, pcfg,
                                      pcfg.beta > 0 ? ref : Tensor(), step_tokens);
          auto loss = po.loss * policy_share;
          if (kl_loss && full_kl) {  // exact KL over the vocabulary as a loss term
            torch::NoGradGuard ng;
            Tensor ref_logits;
            {
              model::AdaptersDisabled adapters_off(reference.adapters_off);
              ref_logits = train::completion_forward(reference.model, r, p0, p1, true).logits;
            }
            torch::AutoGradMode on(true);
            auto kl = algo::full_kl(fwd.logits, ref_logits);
            auto kl_mean = (kl * mask).sum() / mask.sum().clamp_min(1);
            loss = loss + rl.beta * kl_mean * token_share;
            window.add("kl_full", kl_mean.item<double>());
          }
          if (ppo) {
            auto values = value_head(fwd.hidden).squeeze(-1).to(torch::kFloat32);
            auto [vl, clipfrac] = algo::value_loss(values, r.old_values.narrow(0, rows0, rows),
                                                   r.returns.narrow(0, rows0, rows), mask,
                                                   rl.cliprange_value);
            loss = loss + rl.vf_coef * vl * token_share;
            window.add("value_loss", vl.item<double>());
            window.add("value_clipfrac", clipfrac.item<double>());
          }
          if (k + 1 == n_micro) optimizer.arm_gradient_sync();  // all-reduce during backward
          loss.backward();
          const double loss_value = loss.item<double>();
          iteration_loss += loss_value;
          if (po.clip_ratio_low.defined()) window.add("clip_ratio/low_mean", po.clip_ratio_low.item<double>());
          if (po.clip_ratio_high.defined()) window.add("clip_ratio/high_mean", po.clip_ratio_high.item<double>());
          if (po.clip_ratio_region.defined()) window.add("clip_ratio/region_mean", po.clip_ratio_region.item<double>());
          if (po.kl.defined()) window.add("kl_loss_term", po.kl.item<double>());
          auto diff = (fwd.logps.detach() - r.old_logps.narrow(0, rows0, rows)) * mask;
          window.add("approx_kl", (0.5 * diff.pow(2).sum() / mask.sum().clamp_min(1)).item<double>());
          window.add("entropy", fwd.logits.defined()
                                    ? train::mean_entropy(fwd.logits, mask)
                                    : algo::mean_entropy_from_hidden(
                                          fwd.hidden, model->language_model->output_weight(), mask,
                                          chunk_rows));
          update_tokens += mask.sum().item<double>();
        }
        window.add("grad_norm/vision_tower", grad_norm_of_part(*model, "vision_tower"));
        window.add("grad_norm/projector", grad_norm_of_part(*model, "projector"));
        window.add("grad_norm/language_model", grad_norm_of_module(*model->language_model));
        iteration_loss = run.all_sum({iteration_loss})[0];  // the step's loss over all ranks
        window.add("loss", iteration_loss);
        auto st = optimizer.step(state.step, iteration_loss);
        grad_norm = st.grad_norm;
        train::add_step_stats(window, st);
      }
    }
    const double update_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    window.add("update_tokens_per_s", update_tokens / std::max(update_s, 1e-9));
    ++state.step;
    state.tokens_seen += lens.sum().item<int64_t>();

    if (state.step % cfg.train.log_every_n_steps == 0 || state.step == total_steps) {
      auto now = std::chrono::steady_clock::now();
      auto m = run.flush(window, "prompts");
      m["lr"] = lr;
      m["curriculum/stage"] = curriculum.current_stage();
      for (const auto& [d, rate] : curriculum.pass_rates()) {
        m["curriculum/pass_rate/" + std::to_string(d)] = rate;
      }
      m["skipped"] = pool.n_skipped;
      m["step_time_s"] = std::chrono::duration<double>(now - t_last).count() /
                         std::max<int64_t>(1, cfg.train.log_every_n_steps);
      std::vector<std::string> shown = {"reward"};
      for (const auto& name : scores.names) shown.push_back("rewards/" + name + "/mean");
      for (const char* k : {"pass_rate", "frac_reward_zero_std", "kl", "entropy",
                            "completions/mean_length", "clip_ratio/region_mean"}) {
        shown.push_back(k);
      }
      run.log_step(m, shown);
      t_last = now;
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
  log_info("rlhf: final model written to " + cfg.output_dir);
  run_eval();
  return run.completed();
}

Stage setup_rlhf(CLI::App& app) {
  return training_stage<config::RlhfConfig>(
      app, "rlhf", "online RL (GRPO, RLOO, REINFORCE++, PPO) with verifiable and learned rewards",
      load_rlhf, run_rlhf);
}

}  // namespace mmpost::cli
