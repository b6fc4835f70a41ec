// Qwen2-VL / Qwen2.5-VL forward (see qwen2_vl.h). Matches transformers 5.24's
// modeling_qwen2_vl.py / modeling_qwen2_5_vl.py (sdpa path) and vision_utils.py.
#include "mmpost/model/qwen2_vl.h"

#include "mmpost/core/check.h"
#include "mmpost/model/activation_checkpoint.h"
#include "mmpost/core/cpu_gemm.h"
#include "mmpost/model/hf.h"

#include <algorithm>
#include <numeric>

namespace mmpost::model {
namespace {

torch::Tensor rotate_half(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, /*dim=*/-1);
}

std::vector<std::array<int64_t, 3>> grids_of(const torch::Tensor& image_grid_thw) {
  std::vector<std::array<int64_t, 3>> grids;
  if (!image_grid_thw.defined()) return grids;
  MMPOST_CHECK_DATA(image_grid_thw.dim() == 2 && image_grid_thw.size(1) == 3,
                    "image_grid_thw must be [N, 3], got ", image_grid_thw.sizes());
  auto g = image_grid_thw.to(torch::kCPU, torch::kInt64).contiguous();
  const int64_t* p = g.data_ptr<int64_t>();
  for (int64_t i = 0; i < g.size(0); ++i) grids.push_back({p[3 * i], p[3 * i + 1], p[3 * i + 2]});
  return grids;
}

LoraLinear linear(int64_t in, int64_t out, bool bias = true) {
  return LoraLinear(torch::nn::LinearOptions(in, out).bias(bias));
}

}  // namespace

// ---- vision block -----------------------------------------------------------------------------

Qwen2VisionBlockImpl::Qwen2VisionBlockImpl(const Qwen2VisionConfig& c, Qwen2VLVariant variant)
    : n_heads_(c.num_heads), head_dim_(c.head_dim()), act_(activation_from_name(c.hidden_act)) {
  const int64_t E = c.embed_dim;
  if (variant == Qwen2VLVariant::kQwen2_5VL) {
    rms1 = register_module("norm1", RmsNorm(E, 1e-6));
    rms2 = register_module("norm2", RmsNorm(E, 1e-6));
  } else {
    ln1 = register_module("norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({E}).eps(1e-6)));
    ln2 = register_module("norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({E}).eps(1e-6)));
  }
  auto attn = register_module("attn", std::make_shared<torch::nn::Module>());
  qkv = attn->register_module("qkv", linear(E, 3 * E));
  proj = attn->register_module("proj", linear(E, E));
  auto m = register_module("mlp", std::make_shared<torch::nn::Module>());
  if (variant == Qwen2VLVariant::kQwen2_5VL) {
    gate_proj = m->register_module("gate_proj", linear(E, c.intermediate_size));
    up_proj = m->register_module("up_proj", linear(E, c.intermediate_size));
    down_proj = m->register_module("down_proj", linear(c.intermediate_size, E));
  } else {
    fc1 = m->register_module("fc1", linear(E, c.intermediate_size));
    fc2 = m->register_module("fc2", linear(c.intermediate_size, E));
  }
}

torch::Tensor Qwen2VisionBlockImpl::attention(const torch::Tensor& x, const torch::Tensor& cos,
                                              const torch::Tensor& sin,
                                              const std::vector<int64_t>& cu_seqlens) {
  const int64_t L = x.size(0);
  auto parts = qkv(x).view({L, 3, n_heads_, head_dim_}).unbind(/*dim=*/1);  // 3 x [L, H, D]
  auto rope = [&](const torch::Tensor& t) {  // float32, as HF, then back to t's dtype
    auto f = t.to(torch::kFloat32);
    return (f * cos.unsqueeze(-2) + rotate_half(f) * sin.unsqueeze(-2)).to(t.scalar_type());
  };
  auto q = rope(parts[0]).transpose(0, 1);  // [H, L, D]
  auto k = rope(parts[1]).transpose(0, 1);
  auto v = parts[2].transpose(0, 1);
  std::vector<torch::Tensor> outs;
  for (size_t i = 0; i + 1 < cu_seqlens.size(); ++i) {
    const int64_t s = cu_seqlens[i], n = cu_seqlens[i + 1] - cu_seqlens[i];
    if (n == 0) continue;
    outs.push_back(at::scaled_dot_product_attention(
        q.narrow(1, s, n).unsqueeze(0), k.narrow(1, s, n).unsqueeze(0),
        v.narrow(1, s, n).unsqueeze(0)));  // [1, H, n, D]
  }
  auto out = torch::cat(outs, /*dim=*/2).squeeze(0).transpose(0, 1).reshape({L, -1});
  return proj(out);
}

torch::Tensor Qwen2VisionBlockImpl::mlp(const torch::Tensor& x) {
  if (fc1) return fc2(apply_activation(fc1(x), act_));
  if (act_ == Activation::kSilu) return down_proj(swiglu(gate_proj(x), up_proj(x)));
  return down_proj(apply_activation(gate_proj(x), act_) * up_proj(x));
}

torch::Tensor Qwen2VisionBlockImpl::forward(const torch::Tensor& x, const torch::Tensor& cos,
                                            const torch::Tensor& sin,
                                            const std::vector<int64_t>& cu_seqlens) {
  auto norm1 = [&](const torch::Tensor& t) { return ln1 ? ln1(t) : rms1(t); };
  auto norm2 = [&](const torch::Tensor& t) { return ln2 ? ln2(t) : rms2(t); };
  auto h = x + attention(norm1(x), cos, sin, cu_seqlens);
  return h + mlp(norm2(h));
}

// ---- positions and windows ---------------------------------------------------------------------

torch::Tensor vision_patch_positions(const std::vector<std::array<int64_t, 3>>& grids,
                                     int64_t m) {
  std::vector<int64_t> pos;
  for (const auto& [t, h, w] : grids) {
    for (int64_t f = 0; f < t; ++f) {
      for (int64_t bh = 0; bh < h / m; ++bh) {
        for (int64_t bw = 0; bw < w / m; ++bw) {
          for (int64_t i = 0; i < m; ++i) {
            for (int64_t j = 0; j < m; ++j) {
              pos.push_back(bh * m + i);
              pos.push_back(bw * m + j);
            }
          }
        }
      }
    }
  }
  return torch::tensor(pos, torch::kInt64).view({-1, 2});
}

std::pair<std::vector<int64_t>, std::vector<int64_t>> vision_window_index(
    const std::vector<std::array<int64_t, 3>>& grids, int64_t m, int64_t window_size,
    int64_t patch_size) {
  const int64_t ws = window_size / m / patch_size;  // merge units per window side
  const int64_t unit = m * m;
  std::vector<int64_t> index, cu = {0};
  int64_t offset = 0;
  for (const auto& [t, h, w] : grids) {
    const int64_t lh = h / m, lw = w / m;
    // HF pads by ws - (l % ws), so an exact multiple gets one extra (empty) window row.
    const int64_t nwh = (lh + ws - lh % ws) / ws, nww = (lw + ws - lw % ws) / ws;
    for (int64_t f = 0; f < t; ++f) {
      for (int64_t a = 0; a < nwh; ++a) {
        for (int64_t b = 0; b < nww; ++b) {
          int64_t count = 0;
          for (int64_t r = a * ws; r < std::min((a + 1) * ws, lh); ++r) {
            for (int64_t c = b * ws; c < std::min((b + 1) * ws, lw); ++c) {
              index.push_back(offset + f * lh * lw + r * lw + c);
              ++count;
            }
          }
          if (count > 0) cu.push_back(cu.back() + count * unit);  // unique_consecutive
        }
      }
    }
    offset += t * lh * lw;
  }
  return {index, cu};
}

std::pair<torch::Tensor, torch::Tensor> mrope_position_ids(const torch::Tensor& input_ids,
                                                           const torch::Tensor& image_grid_thw,
                                                           const torch::Tensor& attention_mask,
                                                           int64_t image_token_id, int64_t m) {
  MMPOST_CHECK_DATA(input_ids.dim() == 2, "input_ids must be [B, T], got ", input_ids.sizes());
  const int64_t B = input_ids.size(0), T = input_ids.size(1);
  auto ids = input_ids.to(torch::kCPU, torch::kInt64).contiguous();
  torch::Tensor mask = attention_mask.defined()
                           ? attention_mask.to(torch::kCPU, torch::kInt64).contiguous()
                           : torch::ones({B, T}, torch::kInt64);
  MMPOST_CHECK_DATA(mask.sizes() == ids.sizes(), "attention_mask ", mask.sizes(),
                    " does not match input_ids ", ids.sizes());
  const auto grids = grids_of(image_grid_thw);
  auto pos = torch::zeros({3, B, T}, torch::kInt64);
  auto deltas = torch::zeros({B}, torch::kInt64);
  auto P = pos.accessor<int64_t, 3>();
  const int64_t* id = ids.data_ptr<int64_t>();
  const int64_t* mk = mask.data_ptr<int64_t>();
  size_t next_grid = 0;
  for (int64_t b = 0; b < B; ++b) {
    int64_t current = 0, max_pos = -1, n_real = 0;
    int64_t t = 0;
    while (t < T) {
      if (mk[b * T + t] == 0) {
        ++t;
        continue;
      }
      if (id[b * T + t] != image_token_id) {
        for (int a = 0; a < 3; ++a) P[a][b][t] = current;
        max_pos = std::max(max_pos, current);
        ++current;
        ++n_real;
        ++t;
        continue;
      }
      MMPOST_CHECK_DATA(next_grid < grids.size(), "row ", b,
                        ": more image placeholder runs than image_grid_thw rows (",
                        grids.size(), ")");
      const auto [gt, gh, gw] = grids[next_grid++];
      const int64_t lh = gh / m, lw = gw / m, n = gt * lh * lw;
      int64_t filled = 0;
      for (int64_t f = 0; f < gt; ++f) {
        for (int64_t r = 0; r < lh; ++r) {
          for (int64_t c = 0; c < lw; ++c) {
            while (t < T && mk[b * T + t] == 0) ++t;
            MMPOST_CHECK_DATA(t < T && id[b * T + t] == image_token_id, "row ", b, ": image ",
                              next_grid - 1, " has grid (", gt, ", ", gh, ", ", gw, ") = ", n,
                              " placeholder tokens, but its run has ", filled);
            P[0][b][t] = current + f;
            P[1][b][t] = current + r;
            P[2][b][t] = current + c;
            max_pos = std::max({max_pos, current + f, current + r, current + c});
            ++filled;
            ++n_real;
            ++t;
          }
        }
      }
      current += std::max(gh, gw) / m;
    }
    deltas[b] = max_pos + 1 - n_real;
  }
  MMPOST_CHECK_DATA(next_grid == grids.size(), "image_grid_thw has ", grids.size(),
                    " rows but the input_ids hold ", next_grid, " image placeholder runs");
  return {pos.to(input_ids.device()), deltas.to(input_ids.device())};
}

// ---- vision tower ------------------------------------------------------------------------------

Qwen2VisionTransformerImpl::Qwen2VisionTransformerImpl(const Qwen2VisionConfig& c,
                                                       Qwen2VLVariant variant)
    : c_(c), variant_(variant) {
  auto pe = register_module("patch_embed", std::make_shared<torch::nn::Module>());
  const std::vector<int64_t> kernel = {c.temporal_patch_size, c.patch_size, c.patch_size};
  patch_embed_proj = pe->register_module(
      "proj", torch::nn::Conv3d(torch::nn::Conv3dOptions(c.in_channels, c.embed_dim, kernel)
                                    .stride(kernel)
                                    .bias(false)));
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.depth; ++i) blocks->push_back(Qwen2VisionBlock(c, variant));
  auto merger = register_module("merger", std::make_shared<torch::nn::Module>());
  const int64_t E = c.embed_dim, M = E * c.spatial_merge_size * c.spatial_merge_size;
  if (variant == Qwen2VLVariant::kQwen2_5VL) {
    merger_rms = merger->register_module("ln_q", RmsNorm(E, 1e-6));
  } else {
    merger_ln = merger->register_module(
        "ln_q", torch::nn::LayerNorm(torch::nn::LayerNormOptions({E}).eps(1e-6)));
  }
  merger_mlp = merger->register_module(
      "mlp", torch::nn::Sequential(linear(M, M), torch::nn::Functional([](const torch::Tensor& x) {
                                     return torch::gelu(x);  // nn.GELU(), exact erf
                                   }),
                                   linear(M, c.out_hidden_size)));
}

torch::Tensor Qwen2VisionTransformerImpl::forward(const torch::Tensor& pixel_values,
                                                  const torch::Tensor& image_grid_thw) {
  const auto grids = grids_of(image_grid_thw);
  const int64_t m = c_.spatial_merge_size, unit = m * m;
  int64_t L = 0;
  std::vector<int64_t> cu_full = {0};
  for (const auto& [t, h, w] : grids) {
    MMPOST_CHECK_DATA(t > 0 && h % m == 0 && w % m == 0, "image_grid_thw row (", t, ", ", h, ", ",
                      w, "): h and w must be multiples of spatial_merge_size ", m);
    for (int64_t f = 0; f < t; ++f) cu_full.push_back(cu_full.back() + h * w);  // per frame
    L += t * h * w;
  }
  MMPOST_CHECK_DATA(pixel_values.dim() == 2 && pixel_values.size(0) == L &&
                        pixel_values.size(1) == c_.patch_dim(),
                    "pixel_values must be [", L, ", ", c_.patch_dim(),
                    "] for these image_grid_thw rows, got ", pixel_values.sizes());
  const auto& w = patch_embed_proj->weight;  // Conv3d with stride = kernel = one matmul
  auto x = mmpost::gemm_linear(pixel_values.to(w.scalar_type()), w.view({w.size(0), -1}));  // [L, E]
  auto positions = vision_patch_positions(grids, m);                                   // [L, 2]
  std::vector<int64_t> cu_window;
  torch::Tensor window_index;
  const bool windows = variant_ == Qwen2VLVariant::kQwen2_5VL;
  if (windows) {
    auto [index, cu] = vision_window_index(grids, m, c_.window_size, c_.patch_size);
    cu_window = std::move(cu);
    window_index = torch::tensor(index, torch::kInt64);
    auto permute = [&](const torch::Tensor& t) {
      return t.reshape({L / unit, unit, -1}).index_select(0, window_index.to(t.device()))
          .reshape({L, -1});
    };
    x = permute(x);
    positions = permute(positions);
  }
  // 2-D rotary: inv_freq over head_dim / 2 dims, [h angles, w angles] duplicated (HF
  // Qwen2VLVisionRotaryEmbedding), float32.
  const int64_t spatial = c_.head_dim() / 2;
  auto fopts = torch::TensorOptions().dtype(torch::kFloat32).device(x.device());
  auto inv_freq = 1.0 / torch::pow(c_.rope_theta,
                                   torch::arange(0, spatial, 2, fopts.dtype(torch::kInt64))
                                           .to(torch::kFloat32) / static_cast<double>(spatial));
  auto freqs = positions.to(x.device()).to(torch::kFloat32).unsqueeze(-1) * inv_freq;  // [L,2,D/4]
  auto hw = torch::cat({freqs.select(1, 0), freqs.select(1, 1)}, /*dim=*/-1);          // [L, D/2]
  auto emb = torch::cat({hw, hw}, /*dim=*/-1);
  auto cos = emb.cos(), sin = emb.sin();
  for (size_t i = 0; i < blocks->size(); ++i) {
    const bool full = !windows || std::find(c_.fullatt_block_indexes.begin(),
                                            c_.fullatt_block_indexes.end(),
                                            static_cast<int64_t>(i)) !=
                                      c_.fullatt_block_indexes.end();
    const auto& cu = full ? cu_full : cu_window;
    auto* blk = blocks[i]->as<Qwen2VisionBlock>();
    if (checkpoint_blocks && is_training()) {
      x = checkpointed([blk, cos, sin, cu](const torch::Tensor& h) {
        return blk->forward(h, cos, sin, cu);
      }, x, trainable_parameters(*blk));
    } else {
      x = blk->forward(x, cos, sin, cu);
    }
  }
  x = merger_ln ? merger_ln(x) : merger_rms(x);
  auto merged = merger_mlp->forward(x.reshape({L / unit, -1}));
  if (windows) merged = merged.index_select(0, torch::argsort(window_index).to(merged.device()));
  return merged;
}

// ---- the full model ----------------------------------------------------------------------------

Qwen2VLImpl::Qwen2VLImpl(const Qwen2VLConfig& config) : config_(config) {
  visual = register_module("visual", Qwen2VisionTransformer(config.vision_config, config.variant));
  language_model = register_module(
      "language_model", LanguageModel(config.text_config, config.tie_word_embeddings));
}

torch::Tensor Qwen2VLImpl::image_features(const torch::Tensor& pixel_values,
                                          const torch::Tensor& image_grid_thw) {
  return visual(pixel_values, image_grid_thw);
}

torch::Tensor Qwen2VLImpl::embed_features(const torch::Tensor& input_ids,
                                          const torch::Tensor& features) {
  auto embeds = language_model->model->embed_tokens(input_ids);
  auto is_image = input_ids == config_.image_token_id;
  const int64_t n_tokens = is_image.sum().item<int64_t>();
  const int64_t n_features = features.defined() ? features.size(0) : 0;
  MMPOST_CHECK_DATA(n_tokens == n_features, "image features and image tokens do not match: ",
                    n_tokens, " <|image_pad|> tokens, ", n_features, " features");
  if (n_features == 0) return embeds;
  return embeds.masked_scatter(is_image.unsqueeze(-1), features.to(embeds.scalar_type()));
}

torch::Tensor Qwen2VLImpl::forward_hidden(const torch::Tensor& input_ids,
                                          const torch::Tensor& pixel_values,
                                          const torch::Tensor& image_grid_thw,
                                          const torch::Tensor& attention_mask, KVCache* cache,
                                          torch::Tensor position_ids) {
  torch::Tensor features;
  if (pixel_values.defined()) features = image_features(pixel_values, image_grid_thw);
  return forward_hidden_features(input_ids, features, image_grid_thw, attention_mask, cache,
                                 std::move(position_ids));
}

torch::Tensor Qwen2VLImpl::forward_hidden_features(const torch::Tensor& input_ids,
                                                   const torch::Tensor& features,
                                                   const torch::Tensor& image_grid_thw,
                                                   const torch::Tensor& attention_mask,
                                                   KVCache* cache, torch::Tensor position_ids) {
  auto embeds = embed_features(input_ids, features);
  const int64_t B = input_ids.size(0), T = input_ids.size(1);
  const int64_t n_past = cache != nullptr ? cache->seq_len() : 0;
  if (!position_ids.defined()) {
    if (n_past == 0) {
      auto mask = attention_mask.defined() ? attention_mask.narrow(1, 0, T) : torch::Tensor();
      auto [pos, deltas] = mrope_position_ids(input_ids, image_grid_thw, mask,
                                              config_.image_token_id,
                                              config_.vision_config.spatial_merge_size);
      position_ids = pos;
      if (cache != nullptr) cache->rope_deltas = deltas;
    } else {
      auto mask = attention_mask.defined()
                      ? attention_mask
                      : torch::ones({B, n_past + T}, input_ids.options());
      auto base = default_position_ids(mask, T);
      if (cache->rope_deltas.defined()) base = base + cache->rope_deltas.unsqueeze(1);
      position_ids = base.unsqueeze(0).expand({3, B, T});
    }
  }
  return language_model(embeds, attention_mask, position_ids, cache);
}

torch::Tensor Qwen2VLImpl::forward(const torch::Tensor& input_ids,
                                   const torch::Tensor& pixel_values,
                                   const torch::Tensor& image_grid_thw,
                                   const torch::Tensor& attention_mask, KVCache* cache,
                                   torch::Tensor position_ids) {
  return logits(forward_hidden(input_ids, pixel_values, image_grid_thw, attention_mask, cache,
                               std::move(position_ids)));
}

torch::Tensor Qwen2VLImpl::logits(const torch::Tensor& hidden) {
  return language_model->logits(hidden).to(torch::kFloat32);
}

void Qwen2VLImpl::set_activation_checkpointing(bool on) {
  visual->checkpoint_blocks = on;
  language_model->model->checkpoint_layers = on;
}

Qwen2VL build_qwen2_vl(const Qwen2VLConfig& config) {
  validate(config);
  return Qwen2VL(config);
}

// ---- checkpoint names --------------------------------------------------------------------------

std::string qwen2_vl_param_name(const std::string& name) {
  auto starts = [&](const std::string& p) { return name.rfind(p, 0) == 0; };
  if (starts("model.visual.")) return name.substr(6);
  if (starts("visual.")) return name;
  if (starts("model.language_model.")) return "language_model.model." + name.substr(21);
  if (starts("language_model.")) return name;  // already the module's own name
  if (starts("model.")) return "language_model." + name;
  if (name == "lm_head.weight") return "language_model.lm_head.weight";
  return name;
}

void load_qwen2_vl_weights(Qwen2VLImpl& model, const std::map<std::string, torch::Tensor>& tensors,
                           const std::string& source_name) {
  const bool tied = model.language_model->tied();
  load_named_weights(model, tensors, source_name, [tied](const std::string& name) {
    std::string p = qwen2_vl_param_name(name);
    return tied && p == "language_model.lm_head.weight" ? std::string() : p;
  });
}

std::map<std::string, torch::Tensor> qwen2_vl_state_dict(const Qwen2VLImpl& model) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    std::string name = item.key();
    if (name.rfind("language_model.", 0) == 0) name = name.substr(15);  // model.* / lm_head.*
    out[name] = item.value().detach().to(torch::kCPU).contiguous();
  }
  return out;
}

}  // namespace mmpost::model
