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
  template <class V>
  void visit(V& v) {
    v("path", path, "HF-layout model folder to start from (empty: random init from config)");
    v("config", config, "inline HF LlavaConfig (vision_config, text_config, ...) for random init");
    v("tokenizer", tokenizer, "sentencepiece tokenizer.model (default: <path>/tokenizer.model)");
    v("freeze", freeze, "parts to freeze: vision_tower | projector | language_model");
  }
};

/// Image preprocessing (OpenCV): resize, crop/pad, rescale, normalize.
struct ImageSection {
  std::string resize_mode = "shortest_edge_center_crop";  // or pad_to_square
  std::string interpolation = "pil_bicubic";  // Pillow-exact (HF CLIPImageProcessor) or OpenCV
  std::vector<double> image_mean = {0.48145466, 0.4578275, 0.40821073};  // CLIP
  std::vector<double> image_std = {0.26862954, 0.26130258, 0.27577711};
  int64_t random_shift = 0;  // training-only augmentation
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
  }
};

/// Training/eval data and the text side of preprocessing.
struct DataSection {
  std::string train;                      // JSONL (TRL conversational form)
  std::string eval;                       // JSONL for periodic evaluation (optional)
  std::string chat_template = "llava";    // llava (USER: ... ASSISTANT: ...</s>)
  std::string system_prompt;              // prepended as a system turn when non-empty
  int64_t max_length = 512;               // tokens after image expansion
  std::string on_bad_sample = "error";    // error | skip
  int64_t num_workers = 2;                // preprocessing threads
  int64_t shuffle_buffer = 1024;          // samples; 0 or 1 disables shuffling
  int64_t prefetch = 8;                   // batches queued ahead
  ImageSection image;
  template <class V>
  void visit(V& v) {
    v("train", train, "training JSONL");
    v("eval", eval, "evaluation JSONL (optional)");
    v("chat_template", chat_template, "prompt format: llava");
    v("system_prompt", system_prompt, "optional system turn");
    v("max_length", max_length, "max tokens per sample (image tokens included)");
    v("on_bad_sample", on_bad_sample, "error | skip (skips are counted and reported)");
    v("num_workers", num_workers, "preprocessing threads");
    v("shuffle_buffer", shuffle_buffer, "streaming shuffle buffer size (samples)");
    v("prefetch", prefetch, "batches prepared ahead of the loop");
    v("image", image, "image preprocessing");
  }
};

/// AdamW (decoupled weight decay, Loshchilov & Hutter 2019); torch::optim::AdamW semantics.
struct OptimSection {
  double lr = 1e-4;
  std::vector<double> betas = {0.9, 0.999};
  double weight_decay = 0.0;
  double eps = 1e-8;
  template <class V>
  void visit(V& v) {
    v("lr", lr, "peak learning rate");
    v("betas", betas, "AdamW betas");
    v("weight_decay", weight_decay, "decoupled weight decay (not applied to norms/biases)");
    v("eps", eps, "AdamW epsilon");
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
  }
};

/// `mmpost sft` recipe.
struct SftConfig {
  std::string output_dir = "runs/sft";
  int64_t seed = 42;
  std::string device = "auto";   // auto | cpu | cuda | cuda:N
  std::string dtype = "float32"; // float32 | bfloat16
  int64_t num_threads = 0;       // torch intra-op threads (0: torch default)
  ModelSection model;
  DataSection data;
  OptimSection optim;
  SchedulerSection scheduler;
  TrainSection train;
  template <class V>
  void visit(V& v) {
    v("output_dir", output_dir, "where checkpoints, metrics and the final model go");
    v("seed", seed, "seed for init, shuffling and dropout");
    v("device", device, "auto | cpu | cuda | cuda:N");
    v("dtype", dtype, "float32 | bfloat16 (parameters and compute)");
    v("num_threads", num_threads, "CPU threads for torch (0: default)");
    v("model", model, "model source");
    v("data", data, "data and preprocessing");
    v("optim", optim, "AdamW");
    v("scheduler", scheduler, "learning-rate schedule");
    v("train", train, "loop");
  }
  /// Cross-field rules; throws Error(kUsage) naming the fields.
  void validate() const;
};

/// Loads a recipe file, applies --set overrides, parses strictly and validates.
SftConfig load_sft_config(const std::string& recipe_path, const std::vector<std::string>& sets);

}  // namespace mmpost::config
