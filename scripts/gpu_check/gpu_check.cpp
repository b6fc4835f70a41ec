// GPU check for mmpost's core CUDA code paths, built from the pure-LibTorch sources only
// (core, model, algo). Every check runs the same computation, from the same weights and inputs,
// on each environment (cpu/cuda x float32/bfloat16) and compares against the CPU:
//   fwd_bwd   VLM forward (left-padded rows with 0, 1, 2 images) + SFT loss + backward
//   generate  greedy with KV cache == without; seeded sampling repeats; CPU vs CUDA tokens
//   dpo       the concatenated preference forward (as train::preference_forward) for policy and
//             reference + algo::dpo_loss (sigmoid + ipo, WPO weighting, LD-DPO) + backward
//   grpo      completion log-probs (as rlhf's completion_forward) + algo::policy_loss (grpo, k3
//             KL term, off-policy old log-probs so the clip is active) + backward
//   full_kl   algo::full_kl (custom autograd function) + backward
//   bench     (cuda) bf16 fwd+bwd and cached generation of a ~0.5B model, timings only
// Prints a table and a final JSON line {"ok": ...}; exits 1 when a check fails.
// Usage: gpu_check [--device auto|cpu|cuda] [--no-bench] [--bench-only]
#include <torch/torch.h>
#include <torch/version.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <tuple>
#include <string>
#include <vector>

#include "mmpost/algo/dpo_loss.h"
#include "mmpost/algo/kl.h"
#include "mmpost/algo/logprobs.h"
#include "mmpost/algo/policy_gradient.h"
#include "mmpost/algo/sft_loss.h"
#include "mmpost/model/generation.h"
#include "mmpost/model/vlm.h"

using namespace mmpost;
using model::Vlm;
using torch::Tensor;

namespace {

constexpr int64_t kVocab = 256;
constexpr int64_t kImage = 255;  // image_token_index
constexpr int64_t kPad = 0, kBos = 1, kEos = 2;
constexpr int64_t kImageSize = 32, kPatch = 8;  // 16 image tokens per image

model::VlmConfig small_config() {
  model::VlmConfig c;
  c.vision_config.hidden_size = 64;
  c.vision_config.intermediate_size = 128;
  c.vision_config.num_hidden_layers = 2;
  c.vision_config.num_attention_heads = 4;
  c.vision_config.image_size = kImageSize;
  c.vision_config.patch_size = kPatch;
  c.text_config.vocab_size = kVocab;
  c.text_config.hidden_size = 128;
  c.text_config.intermediate_size = 256;
  c.text_config.num_hidden_layers = 3;
  c.text_config.num_attention_heads = 4;
  c.text_config.num_key_value_heads = 2;
  c.text_config.head_dim = 32;
  c.text_config.max_position_embeddings = 256;
  c.text_config.eos_token_id = {kEos};
  c.image_token_index = kImage;
  c.image_seq_length = (kImageSize / kPatch) * (kImageSize / kPatch);
  return c;
}

// ---- environments, timing -------------------------------------------------------------------

struct Env {
  torch::Device device;
  torch::Dtype dtype;
  std::string name() const {
    return std::string(device.is_cuda() ? "cuda" : "cpu") + (dtype == torch::kBFloat16 ? "-bf16" : "-fp32");
  }
  bool bf16() const { return dtype == torch::kBFloat16; }
};

void sync(const Env& e) {
  if (e.device.is_cuda()) torch::cuda::synchronize();
}

double now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

/// The same weights on every environment: initialized on the CPU in float32 from `seed`, then
/// converted.
Vlm make_model(const model::VlmConfig& cfg, uint64_t seed, const Env& e) {
  torch::manual_seed(seed);
  Vlm m = model::build_vlm(cfg);
  m->to(e.device, e.dtype);
  return m;
}

// ---- results --------------------------------------------------------------------------------

/// Named tensors one check produced on one environment (on the CPU, float64 for comparing).
struct Out {
  std::vector<std::pair<std::string, Tensor>> values;
  std::vector<std::pair<std::string, Tensor>> grads;
  double ms = 0;
  void add(const std::string& k, const Tensor& t) {
    values.emplace_back(k, t.detach().to(torch::kCPU).to(torch::kFloat64));
  }
};

void collect_grads(Vlm& m, Out& o) {
  for (const auto& kv : m->named_parameters()) {
    const auto& p = kv.value();
    Tensor g = p.grad().defined() ? p.grad() : torch::zeros_like(p);
    o.grads.emplace_back(kv.key(), g.detach().to(torch::kCPU).to(torch::kFloat64));
  }
}

struct Row {
  std::string check, compare, quantity;
  double max_abs = 0, scale = 0, tol = 0;
  std::string status;  // "ok" | "FAIL" | "info"
  std::string note;
};
std::vector<Row> g_rows;
std::vector<nlohmann::json> g_timings;
bool g_failed = false;

void add_row(Row r) {
  if (r.status == "FAIL") g_failed = true;
  g_rows.push_back(std::move(r));
}

struct Diff {
  double max_abs = 0, scale = 0;
  bool finite = true;
  std::string where;
};

Diff diff(const Tensor& a, const Tensor& ref) {
  Diff d;
  TORCH_CHECK(a.sizes() == ref.sizes(), "shape mismatch ", a.sizes(), " vs ", ref.sizes());
  if (a.numel() == 0) return d;
  d.finite = torch::isfinite(a).all().item<bool>() && torch::isfinite(ref).all().item<bool>();
  d.max_abs = (a - ref).abs().max().item<double>();
  d.scale = ref.abs().max().item<double>();
  return d;
}

/// Tolerance classes: "strict" (fp32 vs fp32): 1e-4 * max(1, |ref|max);
/// "loose" (anything bf16): rel * max(1, |ref|max).
double tolerance(const Env& a, const Env& b, double scale, double loose_rel) {
  const bool strict = !a.bf16() && !b.bf16();
  return (strict ? 1e-4 : loose_rel) * std::max(1.0, scale);
}

void compare_outs(const std::string& check, const Env& ea, const Out& a, const Env& eb,
                  const Out& b, double loose_rel, bool info_only = false) {
  const std::string cmp = ea.name() + " vs " + eb.name();
  for (size_t i = 0; i < a.values.size(); ++i) {
    auto d = diff(a.values[i].second, b.values[i].second);
    Row r{check, cmp, a.values[i].first, d.max_abs, d.scale, tolerance(ea, eb, d.scale, loose_rel)};
    bool ok = d.finite && d.max_abs <= r.tol;
    r.status = ok ? "ok" : (info_only ? "info" : "FAIL");
    if (!d.finite) r.note = "non-finite";
    add_row(r);
  }
  if (!a.grads.empty()) {
    Diff worst;
    double scale = 0;
    bool finite = true;
    for (size_t i = 0; i < a.grads.size(); ++i) {
      auto d = diff(a.grads[i].second, b.grads[i].second);
      finite &= d.finite;
      scale = std::max(scale, d.scale);
      if (d.max_abs > worst.max_abs || worst.where.empty()) {
        worst = d;
        worst.where = a.grads[i].first;
      }
    }
    Row r{check, cmp, "grads(" + std::to_string(a.grads.size()) + " params)", worst.max_abs, scale,
          tolerance(ea, eb, scale, loose_rel)};
    bool ok = finite && worst.max_abs <= r.tol;
    r.status = ok ? "ok" : (info_only ? "info" : "FAIL");
    r.note = "worst: " + worst.where + (finite ? "" : " non-finite");
    add_row(r);
  }
}

void exact_row(const std::string& check, const std::string& cmp, const std::string& quantity,
               bool equal, bool info_only, const std::string& note = "") {
  add_row({check, cmp, quantity, equal ? 0.0 : 1.0, 0, 0,
           equal ? "ok" : (info_only ? "info" : "FAIL"), note});
}

// ---- inputs ---------------------------------------------------------------------------------

/// Three LEFT-padded prompts with 1, 0 and 2 images; labels supervise the text after the images.
struct Prompts {
  Tensor ids, mask, labels, pixels;  // CPU; pixels float32 [3, 3, 32, 32]
  std::vector<int64_t> image_counts = {1, 0, 2};
};

Prompts make_prompts() {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  const int64_t P = (kImageSize / kPatch) * (kImageSize / kPatch);
  auto text = [&](int64_t n) {
    auto t = torch::randint(3, kImage, {n}, gen, torch::kInt64);
    return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + n);
  };
  std::vector<std::vector<int64_t>> rows;
  std::vector<int64_t> n_prefix;  // unsupervised tokens at the start of each row
  for (int64_t imgs : {1, 0, 2}) {
    std::vector<int64_t> r = {kBos};
    auto a = text(3);
    r.insert(r.end(), a.begin(), a.end());
    for (int64_t i = 0; i < imgs; ++i) {
      r.insert(r.end(), P, kImage);
      auto b = text(2);
      r.insert(r.end(), b.begin(), b.end());
    }
    n_prefix.push_back(static_cast<int64_t>(r.size()));
    auto c = text(imgs == 0 ? 9 : 7);
    r.insert(r.end(), c.begin(), c.end());
    rows.push_back(r);
  }
  int64_t T = 0;
  for (auto& r : rows) T = std::max<int64_t>(T, r.size());
  Prompts p;
  p.ids = torch::full({3, T}, kPad, torch::kInt64);
  p.mask = torch::zeros({3, T}, torch::kInt64);
  p.labels = torch::full({3, T}, -100, torch::kInt64);
  for (int64_t i = 0; i < 3; ++i) {
    const int64_t n = rows[i].size(), off = T - n;
    for (int64_t j = 0; j < n; ++j) {
      p.ids[i][off + j] = rows[i][j];
      p.mask[i][off + j] = 1;
      if (j >= n_prefix[i]) p.labels[i][off + j] = rows[i][j];
    }
  }
  p.pixels = torch::randn({3, 3, kImageSize, kImageSize}, gen);
  return p;
}

/// B = 2 preference pairs, one image each: rows [chosen 0, chosen 1, rejected 0, rejected 1],
/// RIGHT-padded like data::collate_preference, labels -100 on prompt and padding.
struct PrefBatch {
  Tensor ids, mask, labels, pixels;
  int64_t B = 2;
};

PrefBatch make_pref_batch() {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  const int64_t P = (kImageSize / kPatch) * (kImageSize / kPatch);
  auto text = [&](int64_t n) {
    auto t = torch::randint(3, kImage, {n}, gen, torch::kInt64);
    return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + n);
  };
  const std::vector<int64_t> chosen_len = {4, 6}, rejected_len = {7, 3};
  std::vector<std::vector<int64_t>> prompts;
  for (int i = 0; i < 2; ++i) {
    std::vector<int64_t> r = {kBos};
    auto a = text(2 + i);
    r.insert(r.end(), a.begin(), a.end());
    r.insert(r.end(), P, kImage);
    auto b = text(4);
    r.insert(r.end(), b.begin(), b.end());
    prompts.push_back(r);
  }
  std::vector<std::vector<int64_t>> rows, labels;
  for (int kind = 0; kind < 2; ++kind) {
    for (int i = 0; i < 2; ++i) {
      auto comp = text((kind == 0 ? chosen_len : rejected_len)[i]);
      comp.push_back(kEos);
      auto r = prompts[i];
      std::vector<int64_t> l(r.size(), -100);
      r.insert(r.end(), comp.begin(), comp.end());
      l.insert(l.end(), comp.begin(), comp.end());
      rows.push_back(r);
      labels.push_back(l);
    }
  }
  int64_t T = 0;
  for (auto& r : rows) T = std::max<int64_t>(T, r.size());
  PrefBatch b;
  b.ids = torch::full({4, T}, kPad, torch::kInt64);
  b.mask = torch::zeros({4, T}, torch::kInt64);
  b.labels = torch::full({4, T}, -100, torch::kInt64);
  for (int64_t i = 0; i < 4; ++i) {
    for (size_t j = 0; j < rows[i].size(); ++j) {
      b.ids[i][j] = rows[i][j];
      b.mask[i][j] = 1;
      b.labels[i][j] = labels[i][j];
    }
  }
  b.pixels = torch::randn({2, 3, kImageSize, kImageSize}, gen);
  return b;
}

// ---- checks ---------------------------------------------------------------------------------

Out run_fwd_bwd(const model::VlmConfig& cfg, const Prompts& p, const Env& e) {
  Vlm m = make_model(cfg, 1, e);
  auto ids = p.ids.to(e.device), mask = p.mask.to(e.device), labels = p.labels.to(e.device);
  auto pix = p.pixels.to(e.device, e.dtype);
  sync(e);
  Out o;
  const double t0 = now_ms();
  auto logits = m->forward(ids, pix, mask);  // [B, T, V] float32
  auto loss = algo::sft_loss_mean(logits, labels);
  loss.backward();
  sync(e);
  o.ms = now_ms() - t0;
  auto valid = mask.to(torch::kBool);  // compare real positions only
  o.add("logits[real]", logits.index({valid}));
  o.add("sft_loss", loss);
  collect_grads(m, o);
  return o;
}

struct GenOut {
  Tensor greedy_cache, greedy_nocache, logps_cache, logps_nocache;
  Tensor sample_a, sample_b, sample_logps;
  double ms_cache = 0, ms_nocache = 0, ms_sample = 0;
};

GenOut run_generate(const model::VlmConfig& cfg, const Prompts& p, const Env& e) {
  Vlm m = make_model(cfg, 1, e);
  m->eval();
  torch::NoGradGuard no_grad;
  auto ids = p.ids.to(e.device), mask = p.mask.to(e.device);
  auto pix = p.pixels.to(e.device, e.dtype);
  model::GenerationConfig g;
  g.max_new_tokens = 12;
  g.eos_token_ids = {kEos};
  g.pad_token_id = kPad;
  GenOut o;
  sync(e);
  double t0 = now_ms();
  auto a = model::generate(m, ids, mask, pix, g, /*use_cache=*/true);
  sync(e);
  o.ms_cache = now_ms() - t0;
  t0 = now_ms();
  auto b = model::generate(m, ids, mask, pix, g, /*use_cache=*/false);
  sync(e);
  o.ms_nocache = now_ms() - t0;
  o.greedy_cache = a.sequences.cpu();
  o.greedy_nocache = b.sequences.cpu();
  o.logps_cache = a.logps.cpu().to(torch::kFloat64);
  o.logps_nocache = b.logps.cpu().to(torch::kFloat64);
  model::GenerationConfig s = g;
  s.temperature = 0.9;
  s.top_k = 40;
  s.top_p = 0.95;
  s.seed = 1234;
  auto rep = model::repeat_interleave_batch(ids, mask, pix, p.image_counts, 2);
  t0 = now_ms();
  auto s1 = model::generate(m, rep.input_ids, rep.attention_mask, rep.pixel_values, s);
  sync(e);
  o.ms_sample = now_ms() - t0;
  auto s2 = model::generate(m, rep.input_ids, rep.attention_mask, rep.pixel_values, s);
  o.sample_a = s1.sequences.cpu();
  o.sample_b = s2.sequences.cpu();
  o.sample_logps = s1.logps.cpu().to(torch::kFloat64);
  return o;
}

/// train::preference_forward's body (lib/mmpost/train/preference.cpp; that file pulls the
/// OpenCV data layer, so it is not built here): one vision pass, features reused for the
/// chosen and rejected rows, token_stats + preference_logps.
algo::PreferenceLogps preference_forward(Vlm& m, const Tensor& ids, const Tensor& mask,
                                         const Tensor& labels, const Tensor& pix, int64_t B,
                                         bool with_log_sum_sq) {
  auto features = m->image_features(pix);
  auto row_features = torch::cat({features, features});
  auto logits = m->forward_features(ids, row_features, mask);
  auto stats = algo::token_stats(logits, labels, with_log_sum_sq);
  return algo::preference_logps(stats, B);
}

Out run_dpo(const model::VlmConfig& cfg, const PrefBatch& b, const Env& e) {
  Vlm policy = make_model(cfg, 1, e);
  Vlm reference = make_model(cfg, 2, e);
  reference->eval();
  auto ids = b.ids.to(e.device), mask = b.mask.to(e.device), labels = b.labels.to(e.device);
  auto pix = b.pixels.to(e.device, e.dtype);
  algo::DpoLossConfig dc;
  dc.beta = 0.1;
  dc.loss_types = {algo::DpoLossType::kSigmoid, algo::DpoLossType::kIpo};
  dc.loss_weights = {1.0, 0.5};
  dc.use_weighting = true;
  dc.ld_alpha = 0.5;
  sync(e);
  Out o;
  const double t0 = now_ms();
  auto pol = preference_forward(policy, ids, mask, labels, pix, b.B, /*with_log_sum_sq=*/true);
  algo::PreferenceLogps ref;
  {
    torch::NoGradGuard no_grad;
    ref = preference_forward(reference, ids, mask, labels, pix, b.B, false);
  }
  auto out = algo::dpo_loss(pol, &ref, dc);
  auto loss = out.losses.mean();
  loss.backward();
  sync(e);
  o.ms = now_ms() - t0;
  o.add("policy_chosen_logps", pol.chosen);
  o.add("policy_rejected_logps", pol.rejected);
  o.add("policy_chosen_tail", pol.chosen_tail);
  o.add("wpo_log_sum_sq", pol.chosen_log_sum_sq);
  o.add("ref_chosen_logps", ref.chosen);
  o.add("losses", out.losses);
  o.add("rewards_chosen", out.rewards_chosen);
  o.add("rewards_rejected", out.rewards_rejected);
  collect_grads(policy, o);
  return o;
}

/// GRPO rollouts: generated ONCE on the CPU (fp32 policy, seeded sampling) so every
/// environment scores the same tokens.
struct Rollout {
  Tensor prompt_ids, prompt_mask, pixels, completion, cmask, rewards;
  int64_t G = 4;
};

Rollout make_rollout(const model::VlmConfig& cfg, const Prompts& p) {
  Rollout r;
  Env cpu{torch::kCPU, torch::kFloat32};
  Vlm m = make_model(cfg, 1, cpu);
  m->eval();
  torch::NoGradGuard no_grad;
  // prompts 0 and 2 (1 and 2 images) and 1 (no image): all three, G = 4 -> 12 rows.
  auto rep = model::repeat_interleave_batch(p.ids, p.mask, p.pixels, p.image_counts, r.G);
  model::GenerationConfig s;
  s.max_new_tokens = 10;
  s.temperature = 1.0;
  s.eos_token_ids = {kEos};
  s.pad_token_id = kPad;
  s.seed = 99;
  auto out = model::generate(m, rep.input_ids, rep.attention_mask, rep.pixel_values, s);
  r.prompt_ids = rep.input_ids;
  r.prompt_mask = rep.attention_mask;
  r.pixels = rep.pixel_values;
  r.completion = out.sequences;
  const int64_t Tc = out.sequences.size(1);
  r.cmask = (torch::arange(Tc).unsqueeze(0) < out.lengths.unsqueeze(1)).to(torch::kFloat32);
  r.rewards = torch::tensor({1.0, 0.0, 0.5, 1.0, 0.2, 0.2, 0.9, 0.1, 0.0, 1.0, 1.0, 0.3},
                            torch::kFloat32);
  return r;
}

/// rlhf's completion_forward (apps/mmpost/rlhf.cpp): per-token log-probs of the completions.
std::pair<Tensor, Tensor> completion_logps(Vlm& m, const Rollout& r, const Env& e) {
  auto comp = r.completion.to(e.device);
  auto cmask = r.cmask.to(e.device);
  auto ids = torch::cat({r.prompt_ids.to(e.device), comp}, 1);
  auto mask = torch::cat({r.prompt_mask.to(e.device), cmask.to(torch::kInt64)}, 1);
  auto features = m->image_features(r.pixels.to(e.device, e.dtype));
  auto h = m->forward_hidden_features(ids, features, mask);
  const int64_t Tp = r.prompt_ids.size(1), Tc = comp.size(1);
  auto logits = m->logits(h.narrow(1, Tp - 1, Tc));  // [rows, Tc, V] float32
  auto labels = comp.masked_fill(cmask.eq(0), -100);
  return {algo::selective_log_softmax(logits, labels), logits};
}

Out run_grpo(const model::VlmConfig& cfg, const Rollout& r, const Env& e) {
  Vlm policy = make_model(cfg, 1, e);
  Vlm reference = make_model(cfg, 2, e);
  reference->eval();
  algo::PolicyLossConfig pc;
  pc.loss_type = algo::PolicyLossType::kGrpo;
  pc.beta = 0.04;
  pc.epsilon = 0.2;
  pc.epsilon_high = 0.28;
  auto noise = torch::randn(r.completion.sizes(),
                            at::make_generator<at::CPUGeneratorImpl>(5), torch::kFloat32) * 0.3;
  sync(e);
  Out o;
  const double t0 = now_ms();
  auto [logps, logits] = completion_logps(policy, r, e);
  Tensor ref_logps;
  {
    torch::NoGradGuard no_grad;
    ref_logps = completion_logps(reference, r, e).first;
  }
  auto cmask = r.cmask.to(e.device);
  auto old_logps = logps.detach() + noise.to(e.device);  // off-policy: ratios != 1, clip active
  auto adv = algo::grpo_advantages(r.rewards.to(e.device), r.G).advantages;
  auto out = algo::policy_loss(logps, old_logps, adv, cmask, pc, ref_logps);
  out.loss.backward();
  sync(e);
  o.ms = now_ms() - t0;
  o.add("completion_logps", logps * cmask);
  o.add("ref_logps", ref_logps * cmask);
  o.add("advantages", adv);
  o.add("loss", out.loss);
  o.add("kl", out.kl);
  o.add("clip_ratio_region", out.clip_ratio_region);
  o.add("ratio_mean", out.ratio_mean);
  collect_grads(policy, o);
  return o;
}

Out run_full_kl(const model::VlmConfig& cfg, const Rollout& r, const Env& e) {
  Vlm policy = make_model(cfg, 1, e);
  Vlm reference = make_model(cfg, 2, e);
  sync(e);
  Out o;
  const double t0 = now_ms();
  auto logits = completion_logps(policy, r, e).second;
  Tensor ref_logits;
  {
    torch::NoGradGuard no_grad;
    ref_logits = completion_logps(reference, r, e).second;
  }
  auto cmask = r.cmask.to(e.device);
  auto kl = algo::full_kl(logits, ref_logits, /*chunk_rows=*/7);  // [rows, Tc] float32
  auto loss = (kl * cmask).sum() / cmask.sum();
  loss.backward();
  sync(e);
  o.ms = now_ms() - t0;
  o.add("full_kl", kl * cmask);
  o.add("mean_kl", loss);
  collect_grads(policy, o);
  return o;
}

// ---- bench (CUDA, bf16) ---------------------------------------------------------------------

nlohmann::json run_bench(const Env& e) {
  model::VlmConfig c;
  c.vision_config.hidden_size = 1024;
  c.vision_config.intermediate_size = 4096;
  c.vision_config.num_hidden_layers = 4;
  c.vision_config.num_attention_heads = 16;
  c.vision_config.image_size = 336;
  c.vision_config.patch_size = 14;
  c.text_config.vocab_size = 32064;
  c.text_config.hidden_size = 2048;
  c.text_config.intermediate_size = 5504;
  c.text_config.num_hidden_layers = 6;
  c.text_config.num_attention_heads = 16;
  c.text_config.num_key_value_heads = 16;
  c.text_config.head_dim = 128;
  c.text_config.max_position_embeddings = 4096;
  c.image_token_index = 32000;
  c.image_seq_length = 576;
  const double t_init = now_ms();
  Vlm m = make_model(c, 3, e);
  sync(e);
  const double init_ms = now_ms() - t_init;
  int64_t n_params = 0;
  for (const auto& p : m->parameters()) n_params += p.numel();
  const int64_t B = 4, T = 1024, P = 576;
  auto ids = torch::randint(3, 32000, {B, T}, torch::kInt64);
  ids.narrow(1, 1, P).fill_(32000);
  ids = ids.to(e.device);
  auto mask = torch::ones({B, T}, torch::kInt64).to(e.device);
  auto pix = torch::randn({B, 3, 336, 336}).to(e.device, e.dtype);
  auto labels = ids.clone();
  labels.narrow(1, 0, 1 + P).fill_(-100);
  auto step = [&] {
    auto logits = m->forward(ids, pix, mask);
    auto loss = algo::sft_loss_mean(logits, labels);
    loss.backward();
    return loss;
  };
  for (int i = 0; i < 2; ++i) step();
  sync(e);
  const int iters = 5;
  double t0 = now_ms();
  Tensor loss;
  for (int i = 0; i < iters; ++i) loss = step();
  sync(e);
  const double step_ms = (now_ms() - t0) / iters;
  const double tokens = static_cast<double>(B * T);
  const double tflops = 6.0 * static_cast<double>(n_params) * tokens / (step_ms * 1e-3) / 1e12;
  m->zero_grad();
  // Cached generation: 8 rows, prompt 1 image + 32 text tokens, 64 new tokens (no EOS).
  torch::NoGradGuard no_grad;
  m->eval();
  const int64_t Bg = 8, Tp = 1 + P + 32;
  auto gids = torch::randint(3, 32000, {Bg, Tp}, torch::kInt64);
  gids.narrow(1, 1, P).fill_(32000);
  gids = gids.to(e.device);
  auto gmask = torch::ones({Bg, Tp}, torch::kInt64).to(e.device);
  auto gpix = torch::randn({Bg, 3, 336, 336}).to(e.device, e.dtype);
  model::GenerationConfig g;
  g.max_new_tokens = 64;
  g.eos_token_ids = {};
  g.pad_token_id = 0;
  model::generate(m, gids, gmask, gpix, g);  // warm-up
  sync(e);
  t0 = now_ms();
  auto out = model::generate(m, gids, gmask, gpix, g);
  sync(e);
  const double gen_ms = now_ms() - t0;
  nlohmann::json j = {{"params_M", n_params / 1e6},
                      {"init_ms", init_ms},
                      {"fwd_bwd_batch", std::to_string(B) + "x" + std::to_string(T)},
                      {"fwd_bwd_ms", step_ms},
                      {"fwd_bwd_tokens_per_s", tokens / (step_ms * 1e-3)},
                      {"fwd_bwd_model_tflops_6N", tflops},
                      {"loss", loss.item<double>()},
                      {"gen_rows", Bg},
                      {"gen_new_tokens", out.sequences.size(1)},
                      {"gen_ms", gen_ms},
                      {"gen_tokens_per_s", Bg * out.sequences.size(1) / (gen_ms * 1e-3)},
                      {"gen_ms_per_step", gen_ms / std::max<int64_t>(1, out.sequences.size(1))}};
  return j;
}

// ---- main -----------------------------------------------------------------------------------

void print_table() {
  std::printf("\n%-9s %-26s %-28s %12s %11s %10s  %-6s %s\n", "check", "compare", "quantity",
              "max_abs_diff", "ref_absmax", "tol", "status", "note");
  for (const auto& r : g_rows) {
    std::printf("%-9s %-26s %-28s %12.3e %11.3e %10.2e  %-6s %s\n", r.check.c_str(),
                r.compare.c_str(), r.quantity.c_str(), r.max_abs, r.scale, r.tol,
                r.status.c_str(), r.note.c_str());
  }
  std::printf("\n%-9s %-10s %s\n", "timing", "env", "ms");
  for (const auto& t : g_timings) {
    std::printf("%-9s %-10s %s\n", t["check"].get<std::string>().c_str(),
                t["env"].get<std::string>().c_str(), t["ms"].dump().c_str());
  }
}

double round1(double ms) { return std::round(ms * 10.0) / 10.0; }

void timing(const std::string& check, const Env& e, nlohmann::json ms) {
  if (ms.is_number()) ms = round1(ms.get<double>());
  if (ms.is_object()) for (auto& [k, v] : ms.items()) v = round1(v.get<double>());
  g_timings.push_back({{"check", check}, {"env", e.name()}, {"ms", std::move(ms)}});
}

}  // namespace

int main(int argc, char** argv) {
  std::string device = "auto";
  bool bench = true, bench_only = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--device" && i + 1 < argc) device = argv[++i];
    else if (a == "--no-bench") bench = false;
    else if (a == "--bench-only") bench_only = true;
    else {
      std::cerr << "usage: gpu_check [--device auto|cpu|cuda] [--no-bench] [--bench-only]\n";
      return 2;
    }
  }
  const bool have_cuda = torch::cuda::is_available();
  if (device == "cuda" && !have_cuda) {
    std::cerr << "gpu_check: --device cuda but this LibTorch sees no CUDA device\n";
    std::cout << nlohmann::json{{"ok", false}, {"error", "no cuda"}}.dump() << "\n";
    return 1;
  }
  const bool use_cuda = device == "cuda" || (device == "auto" && have_cuda);
  // fp32 comparisons must not use TF32 (cuDNN convolutions default to it: the patch embedding).
  at::globalContext().setAllowTF32CuDNN(false);
  at::globalContext().setAllowTF32CuBLAS(false);
  std::printf("gpu_check: torch %s, cuda available %d (%d devices), mode %s\n", TORCH_VERSION,
              have_cuda ? 1 : 0, have_cuda ? static_cast<int>(torch::cuda::device_count()) : 0,
              use_cuda ? "cpu+cuda" : "cpu only");

  const Env cpu32{torch::kCPU, torch::kFloat32}, cpu16{torch::kCPU, torch::kBFloat16};
  const Env gpu32{torch::Device(torch::kCUDA, 0), torch::kFloat32};
  const Env gpu16{torch::Device(torch::kCUDA, 0), torch::kBFloat16};
  std::vector<Env> envs = {cpu32, cpu16};
  if (use_cuda) envs = {cpu32, cpu16, gpu32, gpu16};

  nlohmann::json bench_json;
  try {
    if (use_cuda) {  // warm-up: context creation, cuBLAS/cuDNN handles
      auto x = torch::randn({64, 64}, torch::Device(torch::kCUDA, 0));
      (x.matmul(x)).sum().item<double>();
    }
    const auto cfg = small_config();
    if (!bench_only) {
      const auto prompts = make_prompts();
      const auto pref = make_pref_batch();
      const auto rollout = make_rollout(cfg, prompts);
      std::printf("inputs: prompts %ldx%ld, preference rows %ldx%ld, rollout %ldx(%ld+%ld) "
                  "(%.0f completion tokens)\n",
                  prompts.ids.size(0), prompts.ids.size(1), pref.ids.size(0), pref.ids.size(1),
                  rollout.prompt_ids.size(0), rollout.prompt_ids.size(1),
                  rollout.completion.size(1), rollout.cmask.sum().item<double>());

      // Comparisons: cuda-fp32 vs cpu-fp32 (strict), cuda-bf16 vs cpu-bf16 and vs cpu-fp32
      // (loose), cpu-bf16 vs cpu-fp32 (loose).
      auto compare_all = [&](const std::string& name, std::map<std::string, Out>& outs,
                             double loose) {
        for (const auto& e : envs) timing(name, e, outs[e.name()].ms);
        compare_outs(name, cpu16, outs["cpu-bf16"], cpu32, outs["cpu-fp32"], loose);
        if (use_cuda) {
          compare_outs(name, gpu32, outs["cuda-fp32"], cpu32, outs["cpu-fp32"], loose);
          compare_outs(name, gpu16, outs["cuda-bf16"], cpu16, outs["cpu-bf16"], loose);
          compare_outs(name, gpu16, outs["cuda-bf16"], cpu32, outs["cpu-fp32"], loose);
        }
      };
      using Runner = std::function<Out(const Env&)>;
      std::vector<std::tuple<std::string, Runner, double>> checks = {
          {"fwd_bwd", [&](const Env& e) { return run_fwd_bwd(cfg, prompts, e); }, 0.1},
          {"dpo", [&](const Env& e) { return run_dpo(cfg, pref, e); }, 0.1},
          {"grpo", [&](const Env& e) { return run_grpo(cfg, rollout, e); }, 0.1},
          {"full_kl", [&](const Env& e) { return run_full_kl(cfg, rollout, e); }, 0.1},
      };
      for (auto& [name, run, loose] : checks) {
        std::map<std::string, Out> outs;
        for (const auto& e : envs) {
          std::printf("running %s on %s\n", name.c_str(), e.name().c_str());
          std::fflush(stdout);
          outs[e.name()] = run(e);
        }
        compare_all(name, outs, loose);
      }

      // Generation: exact token checks within each environment, then across devices.
      std::map<std::string, GenOut> gens;
      for (const auto& e : envs) {
        std::printf("running generate on %s\n", e.name().c_str());
        std::fflush(stdout);
        gens[e.name()] = run_generate(cfg, prompts, e);
        const auto& g = gens[e.name()];
        timing("generate", e, {{"greedy_cache", g.ms_cache}, {"greedy_nocache", g.ms_nocache},
                               {"sample_cache", g.ms_sample}});
        const bool bf = e.bf16();
        // bf16: the cached and recomputed paths round differently; a flip is not a bug.
        exact_row("generate", e.name() + " cache vs nocache", "greedy tokens equal",
                  torch::equal(g.greedy_cache, g.greedy_nocache), bf);
        auto d = diff(g.logps_cache, g.logps_nocache);
        const double tol = bf ? 0.1 * std::max(1.0, d.scale) : 1e-4 * std::max(1.0, d.scale);
        const bool same_tokens = torch::equal(g.greedy_cache, g.greedy_nocache);
        add_row({"generate", e.name() + " cache vs nocache", "greedy logps", d.max_abs, d.scale,
                 tol, (d.finite && d.max_abs <= tol) ? "ok" : (bf || !same_tokens ? "info" : "FAIL"),
                 d.finite ? "" : "non-finite"});
        exact_row("generate", e.name() + " run vs rerun", "seeded sample tokens equal",
                  torch::equal(g.sample_a, g.sample_b), false);
      }
      auto cross = [&](const Env& a, const Env& b, bool strict) {
        const auto &ga = gens[a.name()], &gb = gens[b.name()];
        const std::string cmp = a.name() + " vs " + b.name();
        const bool same = torch::equal(ga.greedy_cache, gb.greedy_cache);
        exact_row("generate", cmp, "greedy tokens equal", same, !strict);
        auto d = diff(ga.logps_cache, gb.logps_cache);
        const double tol = strict ? 1e-4 * std::max(1.0, d.scale) : 0.1 * std::max(1.0, d.scale);
        add_row({"generate", cmp, "greedy logps", d.max_abs, d.scale, tol,
                 d.finite && d.max_abs <= tol ? "ok" : (strict && same ? "FAIL" : "info"),
                 same ? "" : "tokens differ: logps not comparable"});
        // Sampling draws from a CPU generator, so equal logits give equal tokens on any device;
        // a last-bit difference can still move a draw across a bucket edge (info only).
        const bool same_s = torch::equal(ga.sample_a, gb.sample_a);
        int64_t n_diff = (ga.sample_a != gb.sample_a).sum().item<int64_t>();
        exact_row("generate", cmp, "seeded sample tokens equal", same_s, true,
                  same_s ? "" : std::to_string(n_diff) + " of " +
                                    std::to_string(ga.sample_a.numel()) + " tokens differ");
      };
      cross(cpu16, cpu32, false);
      if (use_cuda) {
        cross(gpu32, cpu32, true);
        cross(gpu16, cpu16, false);
      }
    }
    if (use_cuda && bench) {
      std::printf("running bench on %s\n", gpu16.name().c_str());
      std::fflush(stdout);
      bench_json = run_bench(gpu16);
      std::printf("bench (cuda-bf16): %s\n", bench_json.dump().c_str());
    }
  } catch (const std::exception& ex) {
    print_table();
    std::cerr << "gpu_check: exception: " << ex.what() << "\n";
    std::cout << nlohmann::json{{"ok", false}, {"error", ex.what()}}.dump() << "\n";
    return 1;
  }

  print_table();
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  std::vector<std::string> failed;
  for (const auto& r : g_rows) {
    rows.push_back({{"check", r.check}, {"compare", r.compare}, {"quantity", r.quantity},
                    {"max_abs_diff", r.max_abs}, {"status", r.status}});
    if (r.status == "FAIL") failed.push_back(r.check + ": " + r.compare + ": " + r.quantity);
  }
  nlohmann::ordered_json summary = {{"ok", !g_failed},
                            {"torch", TORCH_VERSION},
                            {"cuda", use_cuda},
                            {"n_rows", g_rows.size()},
                            {"failed", failed},
                            {"timings_ms", g_timings},
                            {"bench", bench_json},
                            {"rows", rows}};
  std::cout << summary.dump() << std::endl;
  return g_failed ? 1 : 0;
}
