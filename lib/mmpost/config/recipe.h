// Recipe structs for the stages. Defaults live here, once; the visit() lists drive strict JSON
// parsing, --help and the resolved-recipe table (schema.h). Keys reuse torchtune/HF names.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace mmpost::config {

/// Where the model comes from and which parts train.
struct ModelSection {
  std::string path;            // HF-layout folder (config.json + safetensors + tokenizer.model)
  nlohmann::json config;       // inline HF LlavaConfig JSON (random init) when path is empty
  std::string tokenizer;       // sentencepiece model; defaults to PATH/tokenizer.model
  std::vector<std::string> freeze;  // parts to freeze: vision_tower, projector, language_model
  double max_memory_gb = 0;    // cap on the training-state estimate (0: available host memory)
  bool enable_activation_checkpointing = false;  // recompute each layer in backward
  template <class V>
  void visit(V& v) {
    v("path", path, "HF-layout model folder to start from (empty: random init from config)");
    v("config", config, "inline HF LlavaConfig (vision_config, text_config, ...) for random init");
    v("tokenizer", tokenizer, "sentencepiece tokenizer.model (default: <path>/tokenizer.model)");
    v("freeze", freeze, "parts to freeze: vision_tower | projector | language_model");
    v("max_memory_gb", max_memory_gb,
      "refuse before allocating when weights + gradients + AdamW moments exceed this many GB "
      "(0: the host memory available, on CPU)");
    v("enable_activation_checkpointing", enable_activation_checkpointing,
      "keep only each vision / decoder layer's input during the forward and recompute the layer "
      "in backward (torchtune's enable_activation_checkpointing, HF gradient_checkpointing): "
      "less activation memory for about one more forward of compute; same gradients");
  }
};

/// Image preprocessing (OpenCV): resize, crop/pad, rescale, normalize.
struct ImageSection {
  std::string resize_mode = "shortest_edge_center_crop";  // or pad_to_square
  std::string interpolation = "pil_bicubic";  // Pillow-exact (HF CLIPImageProcessor) or OpenCV
  std::vector<double> image_mean = {0.48145466, 0.4578275, 0.40821073};  // CLIP
  std::vector<double> image_std = {0.26862954, 0.26130258, 0.27577711};
  int64_t random_shift = 0;  // training-only augmentation
  int64_t max_pixels = 2 * 89478485;  // data::kDefaultMaxPixels (config sits below data)
  template <class V>
  void visit(V& v) {
    v("resize_mode", resize_mode, "shortest_edge_center_crop | pad_to_square");
    v("interpolation", interpolation,
      "pil_bicubic | pil_bilinear | pil_lanczos (Pillow-exact, as HF) | bicubic | bilinear | "
      "area | nearest (OpenCV)");
    v("image_mean", image_mean, "per-channel mean (RGB, after rescale to [0,1])");
    v("image_std", image_std, "per-channel std (RGB)");
    v("random_shift", random_shift,
      "training augmentation: random translation up to N pixels at model resolution (0: off)");
    v("max_pixels", max_pixels,
      "largest width x height an image may have, checked from the JPEG/PNG header before "
      "decoding (0: no limit; default Pillow's decompression-bomb threshold 178956970)");
  }
};

/// Training/eval data and the text side of preprocessing.
struct DataSection {
  std::string train;                      // JSONL (TRL conversational form)
  std::string eval;                       // JSONL for periodic evaluation (optional)
  std::string chat_template = "auto";     // the model's template, else llava; or a name
  int64_t max_length = 512;               // tokens after image expansion
  std::string on_bad_sample = "error";    // error | skip
  int64_t num_workers = 2;                // preprocessing threads
  int64_t shuffle_buffer = 1024;          // samples; 0 or 1 disables shuffling
  int64_t prefetch = 8;                   // batches queued ahead
  double cache_gb = 2.0;                  // preprocessed training samples kept across epochs
  bool packing = false;                   // sft: pack each batch's samples into shared rows
  bool preload = true;                    // make each epoch's samples before its first step
  ImageSection image;
  template <class V>
  void visit(V& v) {
    v("train", train, "training JSONL");
    v("eval", eval, "evaluation JSONL (optional)");
    v("chat_template", chat_template,
      "prompt format: auto (the model folder's chat template, else llava) | llava | smollm2 | "
      "qwen2_vl | llama3");
    v("max_length", max_length, "max tokens per sample (image tokens included)");
    v("on_bad_sample", on_bad_sample, "error | skip (skips are counted and reported)");
    v("num_workers", num_workers, "preprocessing threads");
    v("shuffle_buffer", shuffle_buffer, "streaming shuffle buffer size (samples)");
    v("prefetch", prefetch, "batches prepared ahead of the loop");
    v("cache_gb", cache_gb,
      "training samples (decoded, resized, tokenized) kept in memory after their first epoch "
      "and reused, up to this many GB (0: off); off while augmenting (image.random_shift, mDPO)");
    v("preload", preload,
      "make the samples each epoch will use before its first step (within cache_gb; the rest "
      "streams) rather than during training, where the data workers compete with the step for "
      "the cores; same samples, same order (off: always stream)");
    v("packing", packing,
      "sft: pack each micro-batch's samples into as few rows of up to max_length tokens as fit "
      "(best-fit decreasing; a sample and its images are never split), with positions restarting "
      "per sample and attention that never crosses samples: the same samples, targets and loss "
      "per step as unpacked, with less padding");
    v("image", image, "image preprocessing");
  }
};

/// AdamW (decoupled weight decay, Loshchilov & Hutter 2019); torch::optim::AdamW semantics.
struct OptimSection {
  double lr = 1e-4;
  std::vector<double> betas = {0.9, 0.999};
  double weight_decay = 0.0;
  double eps = 1e-8;
  bool fused = true;  // ATen's _fused_adamw_ (torch.optim.AdamW(fused=True), TRL's default)
  template <class V>
  void visit(V& v) {
    v("lr", lr, "peak learning rate");
    v("betas", betas, "AdamW betas");
    v("weight_decay", weight_decay, "decoupled weight decay (not applied to norms/biases)");
    v("eps", eps, "AdamW epsilon");
    v("fused", fused,
      "one fused ATen kernel per parameter group, as torch.optim.AdamW(fused=True) / HF "
      "adamw_torch_fused (false: torch::optim::AdamW, ~9 kernels and 2 temporaries per tensor)");
  }
};

/// Learning-rate schedule: linear warmup then cosine / linear decay or constant.
struct SchedulerSection {
  std::string name = "cosine";  // cosine | linear | constant
  int64_t warmup_steps = 0;
  double min_lr_ratio = 0.0;    // final lr = lr * min_lr_ratio
  template <class V>
  void visit(V& v) {
    v("name", name, "cosine | linear | constant");
    v("warmup_steps", warmup_steps, "linear warmup steps from 0");
    v("min_lr_ratio", min_lr_ratio, "final lr as a fraction of the peak");
  }
};

/// Loop sizes, logging, checkpointing.
struct TrainSection {
  int64_t batch_size = 8;
  int64_t gradient_accumulation_steps = 1;
  int64_t max_steps = 0;          // optimizer steps; 0 = derive from epochs
  double epochs = 1.0;            // used when max_steps == 0 (needs a countable dataset)
  double clip_grad_norm = 1.0;    // 0 disables
  int64_t log_every_n_steps = 10;
  int64_t save_every_n_steps = 0;  // 0 = only at the end
  int64_t eval_every_n_steps = 0;  // 0 = only at the end (when data.eval is set)
  int64_t eval_max_samples = 0;    // 0 = all
  int64_t keep_last_n_checkpoints = 2;
  int64_t logits_chunk_size = -1;  // -1 auto (128 MiB of float32 logits), 0 off, N tokens
  int64_t cpu_shards = 0;          // 0 auto, 1 off, N row shards run at once (train/shards.h)
  template <class V>
  void visit(V& v) {
    v("batch_size", batch_size, "samples per micro-batch");
    v("gradient_accumulation_steps", gradient_accumulation_steps, "micro-batches per step");
    v("max_steps", max_steps, "optimizer steps (0: from epochs)");
    v("epochs", epochs, "passes over data.train when max_steps is 0");
    v("clip_grad_norm", clip_grad_norm, "max global grad norm (0: off)");
    v("log_every_n_steps", log_every_n_steps, "stderr + metrics.jsonl interval");
    v("save_every_n_steps", save_every_n_steps, "checkpoint interval (0: end only)");
    v("eval_every_n_steps", eval_every_n_steps, "eval interval (0: end only)");
    v("eval_max_samples", eval_max_samples, "cap on eval samples (0: all)");
    v("keep_last_n_checkpoints", keep_last_n_checkpoints, "step folders kept");
    v("logits_chunk_size", logits_chunk_size,
      "sft loss, dpo and rlhf log-probs: only supervised tokens go through the LM head, this "
      "many at a time, so the "
      "[B, T, V] float32 logits never exist whole (-1: auto, a chunk's logits within 128 MiB; "
      "0: off, whole logits as transformers; N: N tokens per chunk)");
    v("cpu_shards", cpu_shards,
      "sft, dpo, rm on the CPU: each micro-batch split into this many row shards whose forward "
      "and backward run at once, one per thread (0: auto, the intra-op threads when the model "
      "is small; 1: off)");
  }
};

/// Data-parallel training over torch.distributed (c10d) when launched by torchrun or srun with
/// more than one process (dist/process_group.h reads the launcher's environment).
struct DistSection {
  double timeout_s = 300;       // store rendezvous and every collective; a dead peer -> error
  double bucket_mb = 25;        // gradient all-reduce bucket size (MiB), as DDP's bucket_cap_mb
  bool shard_optimizer = false; // ZeRO-1: AdamW state partitioned across ranks
  std::string backend = "auto"; // auto (nccl on CUDA, gloo on CPU) | gloo | nccl
  template <class V>
  void visit(V& v) {
    v("timeout_s", timeout_s, "seconds a rank waits for its peers before failing (store, collectives)");
    v("bucket_mb", bucket_mb, "gradient all-reduce bucket size in MiB");
    v("shard_optimizer", shard_optimizer, "ZeRO-1: partition AdamW state across ranks");
    v("backend", backend, "auto | gloo | nccl");
  }
};

/// LoRA adapters (PEFT's LoraConfig names): the base weights are frozen and low-rank adapters
/// train on the targeted linear layers; modules_to_save parts train fully.
struct LoraSection {
  int64_t r = 0;        // rank; 0: LoRA off (full fine-tuning)
  double alpha = 16;    // lora_alpha; scaling = alpha / r
  double dropout = 0;   // lora_dropout on the adapter input
  bool use_rslora = false;  // scaling = alpha / sqrt(r)
  nlohmann::json target_modules = {"q_proj", "k_proj", "v_proj", "o_proj"};  // list or regex
  std::vector<std::string> modules_to_save;  // vision_tower | multi_modal_projector | language_model
  bool merge_on_save = false;  // final folder: merged full model instead of base + adapter
  template <class V>
  void visit(V& v) {
    v("r", r, "LoRA rank (0: off, full fine-tuning)");
    v("alpha", alpha, "lora_alpha: the adapter output is scaled by alpha / r");
    v("dropout", dropout, "lora_dropout: dropout on the adapter's input while training");
    v("use_rslora", use_rslora, "rank-stabilised scaling alpha / sqrt(r) (Kalajdzievski 2023)");
    v("target_modules", target_modules,
      "PEFT target_modules: a list of module names matched as name suffixes (q_proj, k_proj, "
      "v_proj, o_proj, gate_proj, up_proj, down_proj; vision tower: out_proj, fc1, fc2; "
      "projector: linear_1, linear_2; or paths like language_model.layers.0.mlp.up_proj), or one "
      "regular expression string matched against whole transformers module paths (e.g. "
      "\".*language_model.*\\.(q_proj|v_proj)\")");
    v("modules_to_save", modules_to_save,
      "parts trained fully beside the adapters and saved in the adapter file: vision_tower | "
      "multi_modal_projector | language_model");
    v("merge_on_save", merge_on_save,
      "final folder holds the merged model (PEFT merge_and_unload) instead of the base weights + "
      "adapter_config.json + adapter_model.safetensors");
  }
};

/// A recipe key that takes one of a fixed set of strings (the algo-owned ones, e.g.
/// rlhf.loss_type, are parsed by their own name tables in algo/).
struct Choice {
  std::string key;                  // JSON path, e.g. "scheduler.name"
  std::vector<std::string> values;  // the accepted strings
};
/// The one list of each string choice: validation reads it, and a unit test requires each key's
/// --print-defaults description to list exactly these values.
const std::vector<Choice>& recipe_choices();

/// The fields every training stage's recipe shares (sft, dpo, rm, rlhf): one place for their
/// defaults, descriptions and validation (validate_common).
struct CommonConfig {
  std::string output_dir;        // set by each stage's constructor (runs/<stage>)
  int64_t seed = 42;
  std::string device = "auto";   // auto | cpu | cuda | cuda:N
  std::string dtype = "float32"; // float32 | bfloat16
  std::string mixed_precision = "no";  // no | bf16 (autocast over float32 master weights)
  int64_t num_threads = 0;       // torch intra-op threads (0: torch default)
  std::string cpu_gemm = "auto"; // auto | blas | onednn (float32 CPU linear layers)
  ModelSection model;
  DataSection data;
  OptimSection optim;
  SchedulerSection scheduler;
  TrainSection train;
  DistSection dist;
  LoraSection lora;
  template <class V>
  void visit_common(V& v) {
    v("output_dir", output_dir, "where checkpoints, metrics and the final model go");
    v("seed", seed, "seed for init, shuffling, sampling and augmentation");
    v("device", device, "auto | cpu | cuda | cuda:N");
    v("dtype", dtype, "auto | float32 | bfloat16 (parameters and compute; auto: bfloat16 on CUDA, float32 on CPU)");
    v("mixed_precision", mixed_precision,
      "no | bf16: matmuls and attention in bf16 under autocast while weights, gradients and "
      "AdamW state stay float32 (HF Trainer bf16=True, accelerate mixed_precision=bf16); needs "
      "dtype float32 (auto resolves to it). dtype bfloat16 is pure bf16 instead: weights, "
      "gradients and AdamW state all in bf16");
    v("num_threads", num_threads, "CPU threads for torch (0: default)");
    v("cpu_gemm", cpu_gemm,
      "auto | blas | onednn: the library for float32 CPU linear layers, both exact float32. blas "
      "is at::linear (MKL in LibTorch's wheel); onednn runs forward and backward GEMMs in "
      "LibTorch's oneDNN, whose AVX-512 kernels MKL does not take on AMD CPUs. auto: onednn on "
      "x86-64 CPUs not made by Intel, blas otherwise");
    v("model", model, "model source (a folder, or an inline config for random init)");
    v("data", data, "data and preprocessing");
    v("optim", optim, "AdamW");
    v("scheduler", scheduler, "learning-rate schedule");
    v("train", train, "loop sizes, logging, evaluation and checkpoints");
    v("dist", dist, "data-parallel training (torchrun / srun launches)");
    v("lora", lora, "LoRA adapters instead of full fine-tuning (PEFT format)");
  }
  /// The rules every stage shares; throws Error(kUsage) naming the field.
  void validate_common() const;
};

/// `mmpost sft` recipe.
struct SftConfig : CommonConfig {
  SftConfig() { output_dir = "runs/sft"; }
  template <class V>
  void visit(V& v) { visit_common(v); }
  /// Cross-field rules; throws Error(kUsage) naming the fields.
  void validate() const;
};

/// Loads a recipe file, applies --set overrides, parses strictly and validates.
SftConfig load_sft_config(const std::string& recipe_path, const std::vector<std::string>& sets);

/// mDPO (Wang et al. 2024, arXiv:2406.11839): conditional preference + anchor terms.
struct MdpoSection {
  bool enabled = false;
  std::string corruption = "crop";   // crop | mask | noise
  double corruption_strength = 0.8;  // crop: area removed; mask: area masked; noise: std
  double conditional_weight = 1.0;
  bool anchor = true;
  double anchor_weight = 1.0;
  double anchor_delta = 0.0;         // reward floor delta of the anchor (paper: 0)
  template <class V>
  void visit(V& v) {
    v("enabled", enabled, "add mDPO's conditional term (true vs corrupted image) and anchor");
    v("corruption", corruption, "crop | mask | noise (how the conditional image is corrupted)");
    v("corruption_strength", corruption_strength,
      "crop: fraction of area removed; mask: fraction masked; noise: std (normalized units)");
    v("conditional_weight", conditional_weight, "weight of the conditional preference term");
    v("anchor", anchor, "add the anchor term -log sigmoid(beta * chosen ratio - delta)");
    v("anchor_weight", anchor_weight, "weight of the anchor term");
    v("anchor_delta", anchor_delta, "anchor reward floor delta");
  }
};

/// Preference optimization settings; names follow TRL's DPOConfig.
struct DpoSection {
  double beta = 0.1;
  std::vector<std::string> loss_type = {"sigmoid"};
  std::vector<double> loss_weights;
  double label_smoothing = 0.0;
  double rpo_alpha = 0.0;            // adds rpo_alpha * NLL(chosen) (TRL < 1.0's RPO)
  double simpo_gamma = 0.5;
  double discopop_tau = 0.05;
  bool use_weighting = false;
  nlohmann::json ld_alpha;           // null = off, else in [0, 1]
  int64_t max_prompt_length = 0;     // 0 = no limit
  int64_t max_completion_length = 0; // 0 = no limit
  std::string ref_model;             // empty: frozen copy of the starting policy
  std::string ref_dtype;             // empty: same as dtype; float32 | bfloat16
  bool precompute_ref_log_probs = false;
  bool padding_free = false;         // rows run alone, unpadded (on with precompute_ref_log_probs)
  MdpoSection mdpo;
  template <class V>
  void visit(V& v) {
    v("beta", beta, "DPO temperature (IPO tau, SimPO beta, ORPO lambda)");
    v("loss_type", loss_type,
      "one or a list of: sigmoid, hinge, ipo, exo_pair, nca_pair, robust, bco_pair, sppo_hard, "
      "aot, aot_unpaired, apo_zero, apo_down, discopop, sft, sigmoid_norm, simpo, orpo");
    v("loss_weights", loss_weights, "one weight per loss_type (empty: all 1)");
    v("label_smoothing", label_smoothing,
      "robust/exo_pair/aot label noise; on sigmoid = conservative DPO");
    v("rpo_alpha", rpo_alpha, "RPO: adds rpo_alpha * NLL of the chosen completion (0: off)");
    v("simpo_gamma", simpo_gamma, "SimPO target reward margin");
    v("discopop_tau", discopop_tau, "DiscoPOP temperature");
    v("use_weighting", use_weighting, "WPO pair weighting");
    v("ld_alpha", ld_alpha, "LD-DPO weight of tokens past the shorter completion (null: off)");
    v("max_prompt_length", max_prompt_length, "prompt tokens kept (from the end; 0: all)");
    v("max_completion_length", max_completion_length, "completion tokens kept (0: all)");
    v("ref_model", ref_model, "reference model folder (empty: frozen copy of the start policy)");
    v("ref_dtype", ref_dtype, "reference dtype: float32 | bfloat16 (empty: as dtype)");
    v("precompute_ref_log_probs", precompute_ref_log_probs,
      "score the reference once before training, cache next to the run, drop the model "
      "(implies padding_free, so the cached values equal the live ones exactly)");
    v("padding_free", padding_free,
      "each sequence runs alone at its own length: log-probs independent of batching and "
      "padding (slower: rows are not batched)");
    v("mdpo", mdpo, "multimodal DPO terms");
  }
};

/// `mmpost dpo` recipe: the SFT sections plus `dpo`. data.train / data.eval are preference JSONL.
struct DpoConfig : CommonConfig {
  DpoConfig() { output_dir = "runs/dpo"; }
  DpoSection dpo;
  template <class V>
  void visit(V& v) {
    visit_common(v);
    v("dpo", dpo, "preference loss and reference model");
  }
  /// Cross-field rules; throws Error(kUsage) naming the fields.
  void validate() const;
};

/// Loads a DPO recipe file, applies --set overrides, parses strictly and validates.
DpoConfig load_dpo_config(const std::string& recipe_path, const std::vector<std::string>& sets);

/// Reward-model settings; names follow TRL's RewardConfig. A record's optional "margin" (a number)
/// is subtracted inside the Bradley-Terry sigmoid (TRL; Llama 2 Sec. 3.2.2).
struct RmSection {
  double center_rewards_coefficient = 0.0;  // 0 = off (TRL: None)
  int64_t max_prompt_length = 0;             // 0 = no limit
  int64_t max_completion_length = 0;         // 0 = no limit
  template <class V>
  void visit(V& v) {
    v("center_rewards_coefficient", center_rewards_coefficient,
      "weight of mean((r_chosen + r_rejected)^2), Eisenstein et al. 2023 (0: off)");
    v("max_prompt_length", max_prompt_length, "prompt tokens kept (from the end; 0: all)");
    v("max_completion_length", max_completion_length, "completion tokens kept (0: all)");
  }
};

/// `mmpost rm` recipe: the SFT sections plus `rm`. data.train / data.eval are preference JSONL.
struct RmConfig : CommonConfig {
  RmConfig() { output_dir = "runs/rm"; }
  RmSection rm;
  template <class V>
  void visit(V& v) {
    visit_common(v);
    v("rm", rm, "reward-model loss and lengths");
  }
  /// Cross-field rules; throws Error(kUsage) naming the fields.
  void validate() const;
};

/// Loads a reward-model recipe file, applies --set overrides, parses strictly and validates.
RmConfig load_rm_config(const std::string& recipe_path, const std::vector<std::string>& sets);

/// Online RL settings; names follow TRL's GRPOConfig where it has one.
struct RlhfSection {
  std::string algorithm = "grpo";   // grpo | rloo | reinforce_pp | reinforce_pp_baseline | ppo
  int64_t num_generations = 8;      // completions per prompt (G)
  int64_t max_completion_length = 64;
  double temperature = 1.0;
  double top_p = 1.0;
  int64_t top_k = 0;
  std::vector<std::string> stop;    // stop strings (kept in the completion, as HF)
  nlohmann::json rewards = nlohmann::json::array({{{"name", "exact_match"}}});
  std::string reward_model;         // folder written by `mmpost rm` (empty: none)
  double reward_model_weight = 1.0;
  std::string scale_rewards = "group";  // group | batch | none
  std::string loss_type = "dapo";   // grpo | bnpo | dr_grpo | dapo | cispo | sapo | luspo
  std::string importance_sampling_level = "token";  // token | sequence (GSPO)
  double epsilon = 0.2;
  nlohmann::json epsilon_high;      // null = epsilon (DAPO clip-higher: e.g. 0.28)
  int64_t num_iterations = 1;       // mu: updates per generation batch
  double beta = 0.0;                // KL coefficient; 0 loads no reference model
  std::string kl_estimator = "k3";  // k1 | k2 | k3 | low_var_kl | abs | full
  bool kl_in_reward = false;        // fold -beta * KL into the reward instead of the loss
  bool mask_truncated_completions = false;
  bool filter_zero_std_groups = false;  // DAPO dynamic sampling: drop all-equal groups
  std::string pass_reward;          // reward deciding "passed" for curriculum/pass rate (default first)
  double pass_threshold = 0.5;      // passed = that reward >= threshold
  double gamma = 1.0;               // ppo / reinforce_pp discount
  double lam = 0.95;                // ppo GAE lambda
  double cliprange_value = 0.2;     // ppo value clipping
  double vf_coef = 0.1;             // ppo value-loss weight
  bool whiten_advantages = true;    // ppo
  nlohmann::json curriculum = nlohmann::json::object();  // see data/curriculum.h
  template <class V>
  void visit(V& v) {
    v("algorithm", algorithm, "grpo | rloo | reinforce_pp | reinforce_pp_baseline | ppo");
    v("num_generations", num_generations, "completions sampled per prompt (G)");
    v("max_completion_length", max_completion_length, "max new tokens per completion");
    v("temperature", temperature, "sampling temperature");
    v("top_p", top_p, "nucleus sampling mass (1: off)");
    v("top_k", top_k, "top-k sampling (0: off)");
    v("stop", stop, "stop strings (the completion keeps them)");
    v("rewards", rewards,
      "reward functions: [{\"name\": exact_match|numeric_match|choice_match|format|"
      "length_penalty|external, \"weight\": w, \"params\": {...}}]");
    v("reward_model", reward_model, "reward model folder from `mmpost rm` (empty: none)");
    v("reward_model_weight", reward_model_weight, "weight of the reward model's score");
    v("scale_rewards", scale_rewards, "group | batch | none (GRPO advantage scaling)");
    v("loss_type", loss_type, "grpo | bnpo | dr_grpo | dapo | cispo | sapo | luspo");
    v("importance_sampling_level", importance_sampling_level, "token | sequence (GSPO)");
    v("epsilon", epsilon, "lower clip range");
    v("epsilon_high", epsilon_high, "upper clip range (null: epsilon)");
    v("num_iterations", num_iterations, "policy updates per generation batch (mu)");
    v("beta", beta, "KL coefficient (0: no reference model)");
    v("kl_estimator", kl_estimator, "k1 | k2 | k3 | low_var_kl | abs | full");
    v("kl_in_reward", kl_in_reward, "subtract beta * KL from the reward instead of the loss");
    v("mask_truncated_completions", mask_truncated_completions,
      "exclude completions that hit max_completion_length from the loss");
    v("filter_zero_std_groups", filter_zero_std_groups,
      "drop groups whose rewards are all equal (DAPO dynamic sampling)");
    v("pass_reward", pass_reward, "reward that decides pass/fail (default: the first)");
    v("pass_threshold", pass_threshold, "a completion passes when pass_reward >= this");
    v("gamma", gamma, "discount (ppo, reinforce_pp)");
    v("lam", lam, "GAE lambda (ppo)");
    v("cliprange_value", cliprange_value, "value clipping (ppo)");
    v("vf_coef", vf_coef, "value loss weight (ppo)");
    v("whiten_advantages", whiten_advantages, "whiten GAE advantages (ppo)");
    v("curriculum", curriculum,
      "{mode: none|staged|adaptive, stages: [...], target_pass_rate, ...} over `difficulty`");
  }
};

/// `mmpost rlhf` recipe: the SFT sections plus `rlhf`. data.train / data.eval are prompt JSONL
/// (TRL conversational; the final assistant turn or an "answer" field is the reference).
/// train.batch_size counts prompts per step (each sampled num_generations times).
struct RlhfConfig : CommonConfig {
  RlhfConfig() { output_dir = "runs/rlhf"; }
  RlhfSection rlhf;
  template <class V>
  void visit(V& v) {
    visit_common(v);
    v("rlhf", rlhf, "rollouts, rewards, advantages and the policy loss");
  }
  /// Cross-field rules; throws Error(kUsage) naming the fields.
  void validate() const;
};

/// Loads an RLHF recipe file, applies --set overrides, parses strictly and validates.
RlhfConfig load_rlhf_config(const std::string& recipe_path, const std::vector<std::string>& sets);

}  // namespace mmpost::config
