// Shared transformer blocks for the Llama text model: RMSNorm, rotary position embedding, attention
// with grouped-query heads and a KV cache, the SwiGLU MLP, and the activations HF configs name.
// Numerics follow transformers' LlamaRMSNorm / LlamaRotaryEmbedding / LlamaAttention / LlamaMLP.
#pragma once

#include <torch/torch.h>

#include "mmpost/model/fused_ops.h"
#include "mmpost/model/lora.h"

#include <string>
#include <vector>

namespace mmpost::model {

/// Activations by their HF `hidden_act` name.
enum class Activation { kSilu, kGelu, kGeluTanh, kQuickGelu };

/// "silu", "gelu" (exact erf), "gelu_pytorch_tanh", "quick_gelu" (x * sigmoid(1.702 x)).
/// Throws mmpost::Error (kUsage) for other names, listing the supported ones.
Activation activation_from_name(const std::string& name);

/// Applies `act` elementwise (HF ACT2FN); any shape and floating dtype.
torch::Tensor apply_activation(const torch::Tensor& x, Activation act);

/// Root-mean-square norm (HF LlamaRMSNorm): x / sqrt(mean(x^2) + eps) computed in float32, cast
/// back to the input dtype, then scaled by `weight` [C].
class RmsNormImpl : public torch::nn::Module {
 public:
  RmsNormImpl(int64_t hidden_size, double eps);
  /// x: [..., C] -> [..., C], same dtype as x (times weight's promotion, as in HF).
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RmsNorm);

/// Rotary tables for `position_ids` [B, T] (int64): returns {cos, sin}, each [B, T, D] in `dtype`,
/// angles position * theta^(-2i/D) computed in float32, duplicated over both halves
/// (HF LlamaRotaryEmbedding, rope_type "default").
std::pair<torch::Tensor, torch::Tensor> rope_cos_sin(const torch::Tensor& position_ids,
                                                      int64_t head_dim, double theta,
                                                      torch::ScalarType dtype);

/// Multimodal rotary tables (M-RoPE, Qwen2-VL; HF Qwen2VLRotaryEmbedding): position_ids [3, B, T]
/// int64 (temporal, height, width). The D/2 frequencies theta^(-2i/D) are split into consecutive
/// chunks of `mrope_section` (sum = D/2); chunk j takes its angles from axis j % 3; the result is
/// duplicated over both halves. Returns {cos, sin}, each [B, T, D] in `dtype`, angles in float32.
/// Equal positions on the three axes give exactly rope_cos_sin's tables.
/// Throws c10::Error when the sections do not sum to D/2.
std::pair<torch::Tensor, torch::Tensor> mrope_cos_sin(const torch::Tensor& position_ids,
                                                       int64_t head_dim, double theta,
                                                       const std::vector<int64_t>& mrope_section,
                                                       torch::ScalarType dtype);

/// Keys and values of past tokens, one entry per decoder layer, each [B, H_kv, S, D].
/// Grows by concatenation; `reset()` empties it. The caller passes the attention mask of all
/// S + T tokens to the model (HF convention).
struct KVCache {
  std::vector<torch::Tensor> keys;
  std::vector<torch::Tensor> values;
  /// M-RoPE models (Qwen2-VL): max position + 1 - tokens of each prompt row, [B] int64, set by
  /// the prompt's forward; later tokens sit at their 1-D position + this delta.
  torch::Tensor rope_deltas;
  /// Tokens cached so far (S), 0 when empty.
  int64_t seq_len() const { return keys.empty() || !keys[0].defined() ? 0 : keys[0].size(2); }
  void reset() {
    keys.clear();
    values.clear();
    rope_deltas = torch::Tensor();
  }
};

/// Causal self-attention with grouped-query heads (HF LlamaAttention, no biases; with `qkv_bias`
/// q_proj, k_proj and v_proj carry a bias and o_proj none, as HF Qwen2Attention):
/// q_proj, k_proj, v_proj, o_proj.
class AttentionImpl : public torch::nn::Module {
 public:
  AttentionImpl(int64_t hidden_size, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                bool qkv_bias = false);
  /// x: [B, T, C]; cos, sin: [B, T, D]; bias: additive mask [B, 1, T, S + T] in x's dtype
  /// (0 = attend, large negative = masked). With `cache`, appends this call's keys/values to
  /// `cache->keys[layer]` / `values[layer]` and attends over all of them. Returns [B, T, C].
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        const torch::Tensor& bias, KVCache* cache, int64_t layer);
  LoraLinear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};

 private:
  int64_t n_heads_, n_kv_heads_, head_dim_;
};
TORCH_MODULE(Attention);

/// down_proj(act(gate_proj(x)) * up_proj(x)) (HF LlamaMLP, no biases). x: [B, T, C] -> [B, T, C].
class SwiGluMlpImpl : public torch::nn::Module {
 public:
  SwiGluMlpImpl(int64_t hidden_size, int64_t intermediate_size, Activation act);
  torch::Tensor forward(const torch::Tensor& x);
  LoraLinear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};

 private:
  Activation act_;
};
TORCH_MODULE(SwiGluMlp);

/// Additive attention bias [B, 1, T, S + T] in `dtype` for T new queries after S cached tokens:
/// query t sees key s iff s <= S + t, attention_mask[b, s] != 0 and, for a query that is a token
/// (mask != 0), the key carries the same mask value. With a 0/1 mask that is HF's causal +
/// padding mask; a packed row (data::collate_packed: samples numbered 1, 2, ...) gets a
/// block-diagonal causal mask, so no sample attends to another. Masked entries hold -inf on the
/// CPU (the CPU flash kernel's fast path; a fully masked query row, a left-padding token, gets a
/// zero output, NaN-free in the kernel and in ATen's math path) and the dtype's lowest value on
/// other devices (finite, so fully padded rows stay NaN-free there, as in HF).
/// attention_mask: [B, S + T] (int or bool; 0 = padding).
torch::Tensor causal_bias(const torch::Tensor& attention_mask, int64_t n_new,
                          torch::ScalarType dtype);

}  // namespace mmpost::model
