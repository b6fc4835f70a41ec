// Transformer building blocks shared by the Llama text model (see blocks.h). Attention runs through
// torch's scaled_dot_product_attention with an additive mask, so CUDA picks a fused kernel where
// one applies and the CPU path stays exact.
#include "mmpost/model/blocks.h"

#include <limits>

#include "mmpost/core/check.h"
#include "mmpost/model/fused_rms_norm.h"

namespace mmpost::model {

Activation activation_from_name(const std::string& name) {
  if (name == "silu") return Activation::kSilu;
  if (name == "gelu") return Activation::kGelu;
  if (name == "gelu_pytorch_tanh") return Activation::kGeluTanh;
  if (name == "quick_gelu") return Activation::kQuickGelu;
  throw Error(ErrorKind::kUsage, "unsupported activation \"" + name +
                                     "\" (supported: silu, gelu, gelu_pytorch_tanh, quick_gelu)");
}

torch::Tensor apply_activation(const torch::Tensor& x, Activation act) {
  switch (act) {
    case Activation::kSilu: return torch::silu(x);
    case Activation::kGelu: return torch::gelu(x, /*approximate=*/"none");
    case Activation::kGeluTanh: return torch::gelu(x, /*approximate=*/"tanh");
    case Activation::kQuickGelu: return quick_gelu(x);  // HF QuickGELUActivation
  }
  TORCH_CHECK(false, "unreachable activation");
}

RmsNormImpl::RmsNormImpl(int64_t hidden_size, double eps) : eps_(eps) {
  weight = register_parameter("weight", torch::ones({hidden_size}));
}

torch::Tensor RmsNormImpl::forward(const torch::Tensor& x) {
  return rms_norm(x, weight, eps_);
}

std::pair<torch::Tensor, torch::Tensor> rope_cos_sin(const torch::Tensor& position_ids,
                                                      int64_t head_dim, double theta,
                                                      torch::ScalarType dtype) {
  auto fopts = torch::TensorOptions().dtype(torch::kFloat32).device(position_ids.device());
  // HF: inv_freq = 1 / base^(arange(0, D, 2) / D), computed in float32.
  auto inv_freq =
      1.0 / torch::pow(theta, torch::arange(0, head_dim, 2, fopts.dtype(torch::kInt64))
                                  .to(torch::kFloat32) / static_cast<double>(head_dim));
  auto freqs = position_ids.to(torch::kFloat32).unsqueeze(-1) * inv_freq;  // [B, T, D/2]
  auto emb = torch::cat({freqs, freqs}, /*dim=*/-1);                       // [B, T, D]
  return {emb.cos().to(dtype), emb.sin().to(dtype)};
}

std::pair<torch::Tensor, torch::Tensor> mrope_cos_sin(const torch::Tensor& position_ids,
                                                       int64_t head_dim, double theta,
                                                       const std::vector<int64_t>& mrope_section,
                                                       torch::ScalarType dtype) {
  TORCH_CHECK(position_ids.dim() == 3 && position_ids.size(0) == 3,
              "M-RoPE position_ids must be [3, B, T], got ", position_ids.sizes());
  int64_t total = 0;
  for (int64_t s : mrope_section) total += s;
  TORCH_CHECK(total == head_dim / 2, "mrope_section sums to ", total, ", not head_dim / 2 = ",
              head_dim / 2);
  auto fopts = torch::TensorOptions().dtype(torch::kFloat32).device(position_ids.device());
  auto inv_freq =
      1.0 / torch::pow(theta, torch::arange(0, head_dim, 2, fopts.dtype(torch::kInt64))
                                  .to(torch::kFloat32) / static_cast<double>(head_dim));
  auto freqs = position_ids.to(torch::kFloat32).unsqueeze(-1) * inv_freq;  // [3, B, T, D/2]
  std::vector<torch::Tensor> chunks;
  int64_t start = 0;
  for (size_t j = 0; j < mrope_section.size(); ++j) {
    chunks.push_back(freqs[static_cast<int64_t>(j % 3)].narrow(-1, start, mrope_section[j]));
    start += mrope_section[j];
  }
  auto half = torch::cat(chunks, /*dim=*/-1);       // [B, T, D/2]
  auto emb = torch::cat({half, half}, /*dim=*/-1);  // [B, T, D]
  return {emb.cos().to(dtype), emb.sin().to(dtype)};
}

namespace {
// The dtype's most negative finite value (HF uses torch.finfo(dtype).min for masked logits).
double lowest_value(torch::ScalarType dtype) {
  switch (dtype) {
    case torch::kFloat64: return std::numeric_limits<double>::lowest();
    case torch::kBFloat16: return static_cast<double>(std::numeric_limits<c10::BFloat16>::lowest());
    case torch::kFloat16: return static_cast<double>(std::numeric_limits<c10::Half>::lowest());
    default: return static_cast<double>(std::numeric_limits<float>::lowest());
  }
}
}  // namespace

torch::Tensor causal_bias(const torch::Tensor& attention_mask, int64_t n_new,
                          torch::ScalarType dtype) {
  const int64_t n_total = attention_mask.size(1);
  const int64_t n_past = n_total - n_new;
  TORCH_CHECK(n_past >= 0, "attention_mask has ", n_total, " columns, fewer than the ", n_new,
              " new tokens");
  auto opts = torch::TensorOptions().dtype(torch::kInt64).device(attention_mask.device());
  auto q_pos = torch::arange(n_past, n_total, opts).unsqueeze(1);  // [T, 1]
  auto k_pos = torch::arange(0, n_total, opts).unsqueeze(0);       // [1, S + T]
  auto allowed = (k_pos <= q_pos).unsqueeze(0) & attention_mask.ne(0).unsqueeze(1);
  // Packed rows: a token sees its own sample only (padding queries keep the plain rule).
  auto q_seg = attention_mask.narrow(1, n_past, n_new).unsqueeze(2);  // [B, T, 1]
  allowed = allowed & ((attention_mask.unsqueeze(1) == q_seg) | q_seg.eq(0));
  // CPU: -inf, which the CPU flash kernel skips cheaply (a finite lowest value sends every masked
  // block through libm's underflow path: the attention forward + backward took 13 % longer at the
  // digits shapes) and which it (and ATen's math path, through _safe_softmax) turns into a zero
  // output for a fully masked query row. Other devices: the finite lowest value, as HF.
  const double masked = attention_mask.device().is_cpu()
                            ? -std::numeric_limits<double>::infinity()
                            : lowest_value(dtype);
  auto bias = torch::zeros(allowed.sizes(), opts.dtype(dtype));
  return bias.masked_fill_(allowed.logical_not(), masked).unsqueeze(1);  // [B,1,T,S+T]
}

AttentionImpl::AttentionImpl(int64_t hidden_size, int64_t n_heads, int64_t n_kv_heads,
                             int64_t head_dim, bool qkv_bias)
    : n_heads_(n_heads), n_kv_heads_(n_kv_heads), head_dim_(head_dim) {
  auto linear = [](int64_t in, int64_t out, bool bias) {
    return LoraLinear(torch::nn::LinearOptions(in, out).bias(bias));
  };
  q_proj = register_module("q_proj", linear(hidden_size, n_heads * head_dim, qkv_bias));
  k_proj = register_module("k_proj", linear(hidden_size, n_kv_heads * head_dim, qkv_bias));
  v_proj = register_module("v_proj", linear(hidden_size, n_kv_heads * head_dim, qkv_bias));
  o_proj = register_module("o_proj", linear(n_heads * head_dim, hidden_size, false));
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& cos,
                                     const torch::Tensor& sin, const torch::Tensor& bias,
                                     KVCache* cache, int64_t layer) {
  const int64_t B = x.size(0), T = x.size(1);
  auto q = q_proj(x).view({B, T, n_heads_, head_dim_}).transpose(1, 2);     // [B, H, T, D]
  auto k = k_proj(x).view({B, T, n_kv_heads_, head_dim_}).transpose(1, 2);  // [B, Hkv, T, D]
  auto v = v_proj(x).view({B, T, n_kv_heads_, head_dim_}).transpose(1, 2);
  q = apply_rope(q, cos, sin);
  k = apply_rope(k, cos, sin);
  if (cache != nullptr) {
    if (static_cast<int64_t>(cache->keys.size()) <= layer) {
      cache->keys.resize(layer + 1);
      cache->values.resize(layer + 1);
    }
    auto& ck = cache->keys[layer];
    auto& cv = cache->values[layer];
    ck = ck.defined() ? torch::cat({ck, k}, /*dim=*/2) : k;
    cv = cv.defined() ? torch::cat({cv, v}, /*dim=*/2) : v;
    k = ck;
    v = cv;
  }
  // Grouped-query attention inside the kernel (kv head h serves query heads h*n_rep ..
  // h*n_rep+n_rep-1, as HF repeat_kv) instead of materialising the repeated keys and values.
  auto out = at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/bias, /*dropout_p=*/0.0,
                                              /*is_causal=*/false, /*scale=*/std::nullopt,
                                              /*enable_gqa=*/n_heads_ != n_kv_heads_);  // [B, H, T, D]
  out = out.transpose(1, 2).reshape({B, T, n_heads_ * head_dim_});
  return o_proj(out);
}

SwiGluMlpImpl::SwiGluMlpImpl(int64_t hidden_size, int64_t intermediate_size, Activation act)
    : act_(act) {
  auto linear = [](int64_t in, int64_t out) {
    return LoraLinear(torch::nn::LinearOptions(in, out).bias(false));
  };
  gate_proj = register_module("gate_proj", linear(hidden_size, intermediate_size));
  up_proj = register_module("up_proj", linear(hidden_size, intermediate_size));
  down_proj = register_module("down_proj", linear(intermediate_size, hidden_size));
}

torch::Tensor SwiGluMlpImpl::forward(const torch::Tensor& x) {
  if (act_ == Activation::kSilu) return down_proj(swiglu(gate_proj(x), up_proj(x)));
  return down_proj(apply_activation(gate_proj(x), act_) * up_proj(x));
}

}  // namespace mmpost::model
