// Recipe loading and cross-field validation (see recipe.h).
#include "mmpost/config/recipe.h"

#include <algorithm>

#include "mmpost/config/schema.h"

namespace mmpost::config {
namespace {
/// Throws Error(kUsage) naming `path` unless `value` is one of recipe_choices()'s values for it.
void check_one_of(const std::string& path, const std::string& value) {
  for (const auto& c : recipe_choices()) {
    if (c.key != path) continue;
    if (std::find(c.values.begin(), c.values.end(), value) != c.values.end()) return;
    std::string list;
    for (const auto& v : c.values) list += (list.empty() ? "" : ", ") + v;
    throw Error(ErrorKind::kUsage, path + ": \"" + value + "\" is not valid", "valid values: " + list);
  }
  throw Error(ErrorKind::kRuntime, path + ": not in recipe_choices()");
}

}  // namespace

const std::vector<Choice>& recipe_choices() {
  static const std::vector<Choice> kChoices = {
      {"model.freeze", {"vision_tower", "projector", "language_model"}},
      {"data.chat_template", {"auto", "llava", "smollm2", "qwen2_vl", "llama3"}},
      {"data.on_bad_sample", {"error", "skip"}},
      {"data.image.resize_mode", {"shortest_edge_center_crop", "pad_to_square"}},
      {"data.image.interpolation",
       {"pil_bicubic", "pil_bilinear", "pil_lanczos", "bicubic", "bilinear", "area", "nearest"}},
      {"scheduler.name", {"cosine", "linear", "constant"}},
      {"dtype", {"auto", "float32", "bfloat16"}},
      {"mixed_precision", {"no", "bf16"}},
      {"cpu_gemm", {"auto", "blas", "onednn"}},
      {"lora.modules_to_save", {"vision_tower", "multi_modal_projector", "language_model"}},
      {"dist.backend", {"auto", "gloo", "nccl"}},
      {"dpo.ref_dtype", {"float32", "bfloat16"}},
      {"dpo.mdpo.corruption", {"crop", "mask", "noise"}},
  };
  return kChoices;
}

void CommonConfig::validate_common() const {
  MMPOST_CHECK_USAGE(!model.path.empty() || model.config.is_object(),
                     "model: set model.path (an HF-layout folder) or model.config (an inline HF "
                     "LlavaConfig for random init)");
  MMPOST_CHECK_USAGE(!model.path.empty() || !model.tokenizer.empty(),
                     "model.tokenizer: required when model.path is empty");
  for (const auto& part : model.freeze) {
    check_one_of("model.freeze", part);
  }
  MMPOST_CHECK_USAGE(!data.train.empty(), "data.train: required (a JSONL file)");
  check_one_of("data.chat_template", data.chat_template);
  check_one_of("data.on_bad_sample", data.on_bad_sample);
  check_one_of("data.image.resize_mode", data.image.resize_mode);
  check_one_of("data.image.interpolation", data.image.interpolation);
  MMPOST_CHECK_USAGE(data.image.image_mean.size() == 3, "data.image.image_mean: expected 3 values");
  MMPOST_CHECK_USAGE(data.image.image_std.size() == 3, "data.image.image_std: expected 3 values");
  for (double s : data.image.image_std) {
    MMPOST_CHECK_USAGE(s > 0, "data.image.image_std: values must be > 0");
  }
  MMPOST_CHECK_USAGE(data.image.random_shift >= 0, "data.image.random_shift: must be >= 0");
  MMPOST_CHECK_USAGE(data.image.max_pixels >= 0, "data.image.max_pixels: must be >= 0 (0: no limit)");
  MMPOST_CHECK_USAGE(data.max_length > 0, "data.max_length: must be > 0");
  MMPOST_CHECK_USAGE(data.num_workers >= 1, "data.num_workers: must be >= 1");
  MMPOST_CHECK_USAGE(data.prefetch >= 1, "data.prefetch: must be >= 1");
  MMPOST_CHECK_USAGE(data.cache_gb >= 0, "data.cache_gb: must be >= 0 (0: off)");
  MMPOST_CHECK_USAGE(optim.lr > 0, "optim.lr: must be > 0");
  MMPOST_CHECK_USAGE(optim.betas.size() == 2 && optim.betas[0] >= 0 && optim.betas[0] < 1 &&
                         optim.betas[1] >= 0 && optim.betas[1] < 1,
                     "optim.betas: expected two values in [0, 1)");
  MMPOST_CHECK_USAGE(optim.weight_decay >= 0, "optim.weight_decay: must be >= 0");
  MMPOST_CHECK_USAGE(optim.eps > 0, "optim.eps: must be > 0");
  check_one_of("scheduler.name", scheduler.name);
  MMPOST_CHECK_USAGE(scheduler.warmup_steps >= 0, "scheduler.warmup_steps: must be >= 0");
  MMPOST_CHECK_USAGE(scheduler.min_lr_ratio >= 0 && scheduler.min_lr_ratio <= 1,
                     "scheduler.min_lr_ratio: must be in [0, 1]");
  MMPOST_CHECK_USAGE(train.batch_size > 0, "train.batch_size: must be > 0");
  MMPOST_CHECK_USAGE(train.gradient_accumulation_steps > 0,
                     "train.gradient_accumulation_steps: must be > 0");
  MMPOST_CHECK_USAGE(train.max_steps >= 0, "train.max_steps: must be >= 0");
  MMPOST_CHECK_USAGE(train.max_steps > 0 || train.epochs > 0,
                     "train: set train.max_steps or train.epochs to a positive value");
  MMPOST_CHECK_USAGE(train.clip_grad_norm >= 0, "train.clip_grad_norm: must be >= 0");
  MMPOST_CHECK_USAGE(train.log_every_n_steps > 0, "train.log_every_n_steps: must be > 0");
  MMPOST_CHECK_USAGE(train.save_every_n_steps >= 0, "train.save_every_n_steps: must be >= 0");
  MMPOST_CHECK_USAGE(train.eval_every_n_steps >= 0, "train.eval_every_n_steps: must be >= 0");
  MMPOST_CHECK_USAGE(train.logits_chunk_size >= -1,
                     "train.logits_chunk_size: must be -1 (auto), 0 (off) or a token count");
  MMPOST_CHECK_USAGE(train.cpu_shards >= 0,
                     "train.cpu_shards: must be 0 (auto), 1 (off) or a shard count");
  MMPOST_CHECK_USAGE(train.keep_last_n_checkpoints >= 1,
                     "train.keep_last_n_checkpoints: must be >= 1");
  MMPOST_CHECK_USAGE(num_threads >= 0, "num_threads: must be >= 0");
  check_one_of("dtype", dtype);
  check_one_of("mixed_precision", mixed_precision);
  check_one_of("cpu_gemm", cpu_gemm);
  MMPOST_CHECK_USAGE(lora.r >= 0, "lora.r: must be >= 0 (0: off)");
  MMPOST_CHECK_USAGE(lora.alpha > 0, "lora.alpha: must be > 0");
  MMPOST_CHECK_USAGE(lora.dropout >= 0 && lora.dropout < 1, "lora.dropout: must be in [0, 1)");
  MMPOST_CHECK_USAGE(lora.target_modules.is_string() ||
                         (lora.target_modules.is_array() && !lora.target_modules.empty() &&
                          std::all_of(lora.target_modules.begin(), lora.target_modules.end(),
                                      [](const nlohmann::json& t) { return t.is_string(); })),
                     "lora.target_modules: a non-empty list of module names or one regular "
                     "expression string");
  for (const auto& part : lora.modules_to_save) check_one_of("lora.modules_to_save", part);
  MMPOST_CHECK_USAGE(mixed_precision == "no" || dtype != "bfloat16",
                     "mixed_precision: bf16 keeps float32 master weights and needs dtype float32 "
                     "(or auto), got dtype bfloat16",
                     "\n  hint: dtype bfloat16 alone is pure bf16; pick one of the two");
  check_one_of("dist.backend", dist.backend);
  MMPOST_CHECK_USAGE(dist.timeout_s > 0, "dist.timeout_s: must be > 0");
  MMPOST_CHECK_USAGE(dist.bucket_mb > 0, "dist.bucket_mb: must be > 0");
}

namespace {

template <class Config>
Config load_config(const std::string& recipe_path, const std::vector<std::string>& sets) {
  nlohmann::json j;
  try {
    j = recipe_path.empty() ? nlohmann::json::object() : read_json_file(recipe_path);
    MMPOST_CHECK_USAGE(j.is_object(), recipe_path, ": a recipe must be a JSON object");
    for (const auto& s : sets) apply_override(j, s);
  } catch (const nlohmann::json::exception& e) {  // e.g. a number out of range in --set
    throw Error(ErrorKind::kUsage, (recipe_path.empty() ? "recipe" : recipe_path) + ": " + e.what());
  }
  std::string source = recipe_path.empty() ? "recipe" : recipe_path;
  if (!sets.empty()) source += " (with --set)";
  Config cfg = from_json<Config>(j, source);
  cfg.validate();
  return cfg;
}
}  // namespace

void SftConfig::validate() const { validate_common(); }

SftConfig load_sft_config(const std::string& recipe_path, const std::vector<std::string>& sets) {
  return load_config<SftConfig>(recipe_path, sets);
}

void DpoConfig::validate() const {
  validate_common();
  MMPOST_CHECK_USAGE(dpo.beta > 0, "dpo.beta: must be > 0");
  MMPOST_CHECK_USAGE(!dpo.loss_type.empty(), "dpo.loss_type: at least one loss type");
  MMPOST_CHECK_USAGE(dpo.loss_weights.empty() || dpo.loss_weights.size() == dpo.loss_type.size(),
                     "dpo.loss_weights: ", dpo.loss_weights.size(), " weight(s) for ",
                     dpo.loss_type.size(), " loss type(s)");
  MMPOST_CHECK_USAGE(dpo.rpo_alpha >= 0, "dpo.rpo_alpha: must be >= 0");
  MMPOST_CHECK_USAGE(dpo.label_smoothing >= 0 && dpo.label_smoothing < 0.5,
                     "dpo.label_smoothing: must be in [0, 0.5)");
  MMPOST_CHECK_USAGE(dpo.ld_alpha.is_null() || dpo.ld_alpha.is_number(),
                     "dpo.ld_alpha: expected null or a number in [0, 1]");
  MMPOST_CHECK_USAGE(dpo.max_prompt_length >= 0 && dpo.max_completion_length >= 0,
                     "dpo.max_prompt_length / dpo.max_completion_length: must be >= 0");
  if (!dpo.ref_dtype.empty()) check_one_of("dpo.ref_dtype", dpo.ref_dtype);
  check_one_of("dpo.mdpo.corruption", dpo.mdpo.corruption);
  MMPOST_CHECK_USAGE(dpo.mdpo.corruption_strength >= 0 &&
                         (dpo.mdpo.corruption == "noise" || dpo.mdpo.corruption_strength < 1),
                     "dpo.mdpo.corruption_strength: must be in [0, 1) for crop/mask, >= 0 for noise");
}

DpoConfig load_dpo_config(const std::string& recipe_path, const std::vector<std::string>& sets) {
  return load_config<DpoConfig>(recipe_path, sets);
}

void RmConfig::validate() const {
  validate_common();
  MMPOST_CHECK_USAGE(rm.center_rewards_coefficient >= 0,
                     "rm.center_rewards_coefficient: must be >= 0");
  MMPOST_CHECK_USAGE(rm.max_prompt_length >= 0 && rm.max_completion_length >= 0,
                     "rm.max_prompt_length / rm.max_completion_length: must be >= 0");
}

RmConfig load_rm_config(const std::string& recipe_path, const std::vector<std::string>& sets) {
  return load_config<RmConfig>(recipe_path, sets);
}

void RlhfConfig::validate() const {
  validate_common();
  // rlhf.algorithm, scale_rewards, loss_type, importance_sampling_level and kl_estimator are
  // checked by the rlhf stage against the algo layer's name tables (the only lists of them).
  MMPOST_CHECK_USAGE(!model.path.empty(), "model.path: RL starts from a trained policy "
                     "(an SFT output folder or any supported HF checkpoint)");
  MMPOST_CHECK_USAGE(rlhf.num_generations >= 1, "rlhf.num_generations: must be >= 1");
  MMPOST_CHECK_USAGE(rlhf.max_completion_length >= 1, "rlhf.max_completion_length: must be >= 1");
  MMPOST_CHECK_USAGE(rlhf.temperature >= 0, "rlhf.temperature: must be >= 0");
  MMPOST_CHECK_USAGE(rlhf.top_p > 0 && rlhf.top_p <= 1, "rlhf.top_p: must be in (0, 1]");
  MMPOST_CHECK_USAGE(rlhf.epsilon >= 0, "rlhf.epsilon: must be >= 0");
  MMPOST_CHECK_USAGE(rlhf.epsilon_high.is_null() || rlhf.epsilon_high.is_number(),
                     "rlhf.epsilon_high: expected null or a number");
  MMPOST_CHECK_USAGE(rlhf.num_iterations >= 1, "rlhf.num_iterations: must be >= 1");
  MMPOST_CHECK_USAGE(rlhf.beta >= 0, "rlhf.beta: must be >= 0");
  MMPOST_CHECK_USAGE(rlhf.reward_model_weight >= 0, "rlhf.reward_model_weight: must be >= 0");
  MMPOST_CHECK_USAGE(rlhf.lam >= 0 && rlhf.lam <= 1 && rlhf.gamma >= 0 && rlhf.gamma <= 1,
                     "rlhf.gamma / rlhf.lam: must be in [0, 1]");
  MMPOST_CHECK_USAGE(train.batch_size % train.gradient_accumulation_steps == 0,
                     "train.batch_size (prompts per step) must be a multiple of "
                     "train.gradient_accumulation_steps");
}

RlhfConfig load_rlhf_config(const std::string& recipe_path, const std::vector<std::string>& sets) {
  return load_config<RlhfConfig>(recipe_path, sets);
}

}  // namespace mmpost::config
