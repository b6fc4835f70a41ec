// Unit tests for lib/mmpost/model: RoPE and RMSNorm against their formulas, KV-cache attention
// against full recomputation (GQA, left padding), image-token splicing, generation, weight tying,
// config.json mapping and HF name mapping. Parity with transformers: tests/golden/.
#include "catch.h"
#include "test_util.h"

#include "mmpost/core/check.h"
#include "mmpost/model/blocks.h"
#include "mmpost/model/config.h"
#include "mmpost/model/generation.h"
#include "mmpost/model/hf.h"
#include "mmpost/model/language_model.h"
#include "mmpost/model/vlm.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>

namespace unit_test_model {

using namespace mmpost::model;

namespace {

VlmConfig tiny_config(bool tie = false) { return mmpost::testing::tiny_llava_config(2, tie); }

// what() of the mmpost::Error that fn throws, or "" if it throws none.
template <typename Fn>
std::string error_text(Fn fn) {
  try {
    fn();
  } catch (const mmpost::Error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

double max_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

}  // namespace

TEST_CASE("rope rotates half-split pairs by position * theta^(-2i/D)", "[unit][model]") {
  // D = 4, theta = 10000: pair (x0, x2) turns by p rad, (x1, x3) by p * 10000^(-1/2) = p / 100.
  auto pos = torch::arange(4, torch::kInt64).unsqueeze(0);  // [1, 4]
  auto [cos, sin] = rope_cos_sin(pos, /*head_dim=*/4, /*theta=*/10000.0, torch::kFloat32);
  auto x = torch::tensor({1.0f, 2.0f, 3.0f, 4.0f}).view({1, 1, 1, 4}).expand({1, 1, 4, 4});
  auto y = apply_rope(x.contiguous(), cos, sin);  // [1, 1, 4, 4]
  for (int p = 0; p < 4; ++p) {
    const double a = p, b = p / 100.0;
    CHECK(y[0][0][p][0].item<float>() == Approx(1 * std::cos(a) - 3 * std::sin(a)).margin(1e-6));
    CHECK(y[0][0][p][2].item<float>() == Approx(3 * std::cos(a) + 1 * std::sin(a)).margin(1e-6));
    CHECK(y[0][0][p][1].item<float>() == Approx(2 * std::cos(b) - 4 * std::sin(b)).margin(1e-6));
    CHECK(y[0][0][p][3].item<float>() == Approx(4 * std::cos(b) + 2 * std::sin(b)).margin(1e-6));
  }
}

TEST_CASE("rms norm is weight * x / sqrt(mean(x^2) + eps)", "[unit][model]") {
  RmsNorm norm(4, /*eps=*/1e-6);
  norm->weight.data().copy_(torch::tensor({0.5f, 1.0f, 1.0f, 2.0f}));
  auto y = norm(torch::tensor({{1.0f, 2.0f, 3.0f, 4.0f}}));
  const double rms = std::sqrt((1 + 4 + 9 + 16) / 4.0 + 1e-6);  // sqrt(7.5 + eps)
  CHECK(y[0][0].item<float>() == Approx(0.5 * 1 / rms));
  CHECK(y[0][1].item<float>() == Approx(2 / rms));
  CHECK(y[0][3].item<float>() == Approx(2 * 4 / rms));
  // bfloat16 input: computed in float32, returned in bfloat16.
  auto yb = norm(torch::tensor({{1.0f, 2.0f, 3.0f, 4.0f}}).to(torch::kBFloat16));
  CHECK(yb.scalar_type() == torch::kFloat32);  // weight (float32) * bf16 promotes, as in HF
  CHECK(yb[0][3].item<float>() == Approx(8 / rms).epsilon(1e-2));
}

TEST_CASE("kv cache (prefill + steps) equals full recomputation with GQA and left padding",
          "[unit][model]") {
  torch::manual_seed(0);
  auto cfg = tiny_config();
  LlamaModel lm(cfg.text_config);
  const int64_t B = 2, T = 8;
  auto x = torch::randn({B, T, 32});
  auto mask = torch::ones({B, T}, torch::kInt64);
  mask[0].narrow(0, 0, 2).fill_(0);  // row 0 left-padded by 2
  torch::NoGradGuard no_grad;
  auto full = lm->forward(x, mask);  // [B, T, C]

  KVCache cache;
  std::vector<torch::Tensor> parts = {
      lm->forward(x.narrow(1, 0, 5), mask.narrow(1, 0, 5), {}, &cache)};
  for (int64_t t = 5; t < T; ++t) parts.push_back(
        lm->forward(x.narrow(1, t, 1), mask.narrow(1, 0, t + 1), {}, &cache));
  auto incremental = torch::cat(parts, /*dim=*/1);
  CHECK(cache.seq_len() == T);
  CHECK(cache.keys[0].size(1) == 2);  // kv heads are cached unrepeated
  auto keep = mask.to(torch::kBool).unsqueeze(-1).expand_as(full);
  CHECK(max_diff(full.masked_select(keep), incremental.masked_select(keep)) < 1e-5);
  // Left padding only shifts positions: row 0's real tokens match the unpadded sequence.
  auto alone = lm->forward(x[0].narrow(0, 2, 6).unsqueeze(0));
  CHECK(max_diff(alone[0], full[0].narrow(0, 2, 6)) < 1e-5);
}

TEST_CASE("n_image_tokens: 16 patches, +1 class token with the full strategy", "[unit][model]") {
  auto c = tiny_config();
  CHECK(c.n_image_tokens() == 16);
  c.vision_feature_select_strategy = "full";
  CHECK(c.n_image_tokens() == 17);
  torch::manual_seed(0);
  Vlm model(c);
  auto features = model->image_features(torch::randn({2, 3, 32, 32}));
  CHECK(features.sizes() == torch::IntArrayRef({2, 17, 32}));
}

TEST_CASE("embed puts image features at image-token rows, images in order", "[unit][model]") {
  torch::manual_seed(0);
  auto c = tiny_config();
  Vlm model(c);
  const int64_t img = c.image_token_index;
  // Sample 0: 1 image; sample 1: 2 images. T = 36.
  auto ids = torch::full({2, 36}, 5, torch::kInt64);
  ids[0].narrow(0, 2, 16).fill_(img);
  ids[1].narrow(0, 1, 16).fill_(img);
  ids[1].narrow(0, 19, 16).fill_(img);
  auto pixels = torch::randn({3, 3, 32, 32});
  torch::NoGradGuard no_grad;
  auto emb = model->embed(ids, pixels);            // [2, 36, 32]
  auto feats = model->image_features(pixels);      // [3, 16, 32]
  CHECK(max_diff(emb[0].narrow(0, 2, 16), feats[0]) == 0.0);
  CHECK(max_diff(emb[1].narrow(0, 1, 16), feats[1]) == 0.0);
  CHECK(max_diff(emb[1].narrow(0, 19, 16), feats[2]) == 0.0);
  auto text_row = model->language_model->model->embed_tokens->weight[5];
  CHECK(max_diff(emb[0][0], text_row) == 0.0);
  CHECK(max_diff(emb[1][17], text_row) == 0.0);
  CHECK(max_diff(emb[1][35], text_row) == 0.0);
}

TEST_CASE("a mismatched image-token count throws a data error", "[unit][model]") {
  torch::manual_seed(0);
  Vlm model(tiny_config());
  auto ids = torch::full({1, 20}, 5, torch::kInt64);
  ids[0].narrow(0, 0, 15).fill_(63);  // 15 tokens for one 16-patch image
  try {
    model->embed(ids, torch::randn({1, 3, 32, 32}));
    FAIL("expected mmpost::Error");
  } catch (const mmpost::Error& e) {
    CHECK(e.kind() == mmpost::ErrorKind::kData);
    CHECK(std::string(e.what()).find("15 image tokens") != std::string::npos);
  }
  CHECK_THROWS_AS(model->embed(ids, /*pixel_values=*/{}), mmpost::Error);
}

TEST_CASE("greedy generation with the kv cache equals recomputation, seeded sampling repeats",
          "[unit][model]") {
  torch::manual_seed(0);
  auto c = tiny_config();
  Vlm model(c);
  // Row 0: 3 pads then text + image; row 1: image + text. Left padding.
  auto ids = torch::full({2, 22}, 7, torch::kInt64);
  auto mask = torch::ones({2, 22}, torch::kInt64);
  ids[0].narrow(0, 0, 3).fill_(0);
  mask[0].narrow(0, 0, 3).fill_(0);
  ids[0].narrow(0, 4, 16).fill_(63);
  ids[1].narrow(0, 0, 16).fill_(63);
  auto pixels = torch::randn({2, 3, 32, 32});
  GenerationConfig g;
  g.max_new_tokens = 6;
  g.pad_token_id = 0;
  auto cached = generate(model, ids, mask, pixels, g, /*use_cache=*/true);
  auto recomputed = generate(model, ids, mask, pixels, g, /*use_cache=*/false);
  REQUIRE(cached.sequences.sizes() == torch::IntArrayRef({2, 6}));
  CHECK(torch::equal(cached.sequences, recomputed.sequences));
  CHECK(max_diff(cached.logps, recomputed.logps) < 1e-5);
  CHECK((cached.logps < 0).all().item<bool>());
  CHECK((cached.sequences != c.image_token_index).all().item<bool>());  // placeholder never emitted
  CHECK(torch::equal(cached.lengths, torch::tensor({6, 6}, torch::kInt64)));

  // EOS = row 0's 2nd token: row 0 stops at its first occurrence, pads and 0 log-probs after.
  const int64_t eos = cached.sequences[0][1].item<int64_t>();
  const int64_t len = cached.sequences[0][0].item<int64_t>() == eos ? 1 : 2;
  g.eos_token_ids = {eos};
  auto stopped = generate(model, ids, mask, pixels, g);
  CHECK(stopped.lengths[0].item<int64_t>() == len);
  CHECK(torch::equal(stopped.sequences[0].narrow(0, 0, len),
                     cached.sequences[0].narrow(0, 0, len)));
  const int64_t rest = stopped.sequences.size(1) - len;
  if (rest > 0) {
    CHECK((stopped.sequences[0].narrow(0, len, rest) == 0).all().item<bool>());
    CHECK((stopped.logps[0].narrow(0, len, rest) == 0).all().item<bool>());
  }

  g.eos_token_ids = {};
  g.temperature = 1.0;
  g.top_k = 20;
  g.top_p = 0.9;
  g.seed = 1234;
  auto s1 = generate(model, ids, mask, pixels, g);
  auto s2 = generate(model, ids, mask, pixels, g);
  CHECK(torch::equal(s1.sequences, s2.sequences));
  g.seed = 99;
  g.max_new_tokens = 12;
  auto s3 = generate(model, ids, mask, pixels, g);
  CHECK_FALSE(torch::equal(s1.sequences, s3.sequences.narrow(1, 0, 6)));
}

TEST_CASE("top-k 1 sampling is greedy", "[unit][model]") {
  auto logits = torch::tensor({{0.1f, 3.0f, 0.2f}, {5.0f, 0.0f, 4.9f}});
  GenerationConfig g;
  g.temperature = 0.7;
  g.top_k = 1;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(0);
  CHECK(torch::equal(select_next_token(logits, g, gen), torch::tensor({1, 0}, torch::kInt64)));
  g.top_k = 0;
  g.top_p = 0.01;  // keeps only the most likely token
  CHECK(torch::equal(select_next_token(logits, g, gen), torch::tensor({1, 0}, torch::kInt64)));
}

TEST_CASE("per-row sampling draws the softmax distribution, never a zero-probability token",
          "[unit][model]") {
  // probs = softmax(log(0.1, 0, 0.6, 0.3)): 4000 rows, each with its own seeded generator.
  const int64_t B = 4000;
  auto logits = torch::log(torch::tensor({0.1, 0.0, 0.6, 0.3}, torch::kFloat32))
                    .unsqueeze(0)
                    .expand({B, 4})
                    .contiguous();
  GenerationConfig g;
  g.temperature = 1.0;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(0);
  std::vector<torch::Generator> rows;
  for (int64_t i = 0; i < B; ++i) rows.push_back(at::make_generator<at::CPUGeneratorImpl>(1000 + i));
  auto next = select_next_token(logits, g, gen, &rows);
  REQUIRE(next.sizes() == torch::IntArrayRef({B}));
  auto counts = torch::bincount(next, /*weights=*/{}, /*minlength=*/4).to(torch::kFloat64) / B;
  INFO("frequencies " << counts);
  CHECK(counts[1].item<double>() == 0.0);
  // Binomial standard deviations at n = 4000 are <= 0.008; 0.03 is > 3.5 sigma (and the draw is
  // fixed by the seeds, so the test cannot flake).
  CHECK(std::abs(counts[0].item<double>() - 0.1) < 0.03);
  CHECK(std::abs(counts[2].item<double>() - 0.6) < 0.03);
  CHECK(std::abs(counts[3].item<double>() - 0.3) < 0.03);
  // The same seeds give the same tokens; a row's token depends on its own generator only.
  std::vector<torch::Generator> again, tail;
  for (int64_t i = 0; i < B; ++i) again.push_back(at::make_generator<at::CPUGeneratorImpl>(1000 + i));
  for (int64_t i = B - 3; i < B; ++i) tail.push_back(at::make_generator<at::CPUGeneratorImpl>(1000 + i));
  CHECK(torch::equal(select_next_token(logits, g, gen, &again), next));
  CHECK(torch::equal(select_next_token(logits.narrow(0, B - 3, 3), g, gen, &tail),
                     next.narrow(0, B - 3, 3)));
  // NaN logits are refused with the row named.
  auto bad = logits.narrow(0, 0, 2).clone();
  bad[1][2] = std::numeric_limits<float>::quiet_NaN();
  std::vector<torch::Generator> two = {at::make_generator<at::CPUGeneratorImpl>(1),
                                       at::make_generator<at::CPUGeneratorImpl>(2)};
  CHECK_THROWS_WITH(select_next_token(bad, g, gen, &two), Catch::Matchers::Contains("row 1"));
}

TEST_CASE("parameter names are the HF hub checkpoint names", "[unit][model]") {
  Vlm model(tiny_config());
  auto params = model->named_parameters();
  for (const char* name :
       {"vision_tower.vision_model.embeddings.patch_embedding.weight",
        "vision_tower.vision_model.embeddings.class_embedding",
        "vision_tower.vision_model.embeddings.position_embedding.weight",
        "vision_tower.vision_model.pre_layrnorm.weight",
        "vision_tower.vision_model.encoder.layers.1.self_attn.out_proj.bias",
        "vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight",
        "vision_tower.vision_model.encoder.layers.0.layer_norm2.bias",
        "vision_tower.vision_model.post_layernorm.weight", "multi_modal_projector.linear_1.bias",
        "multi_modal_projector.linear_2.weight", "language_model.model.embed_tokens.weight",
        "language_model.model.layers.1.self_attn.o_proj.weight",
        "language_model.model.layers.0.mlp.gate_proj.weight",
        "language_model.model.layers.0.post_attention_layernorm.weight",
        "language_model.model.norm.weight", "language_model.lm_head.weight"}) {
    INFO(name);
    CHECK(params.find(name) != nullptr);
  }
  CHECK(params.find("vision_tower.vision_model.embeddings.patch_embedding.bias") == nullptr);
  // vision: 3 embeddings + 2 pre-ln + 2 x 16 + 2 post-ln; projector 4; text: 1 + 2 x 9 + 1 + 1.
  CHECK(params.size() == 3 + 2 + 32 + 2 + 4 + 1 + 18 + 1 + 1);
}

TEST_CASE("tie_word_embeddings shares one tensor for embed_tokens and lm_head", "[unit][model]") {
  torch::manual_seed(0);
  Vlm model(tiny_config(/*tie=*/true));
  auto params = model->named_parameters();
  CHECK(params.find("language_model.lm_head.weight") == nullptr);
  auto& emb = model->language_model->model->embed_tokens->weight;
  CHECK(model->language_model->output_weight().data_ptr() == emb.data_ptr());
  auto h = torch::randn({1, 2, 32});
  CHECK(max_diff(model->logits(h), torch::matmul(h, emb.t())) < 1e-5);
  CHECK(hf_state_dict(model).count("language_model.lm_head.weight") == 0);
}

TEST_CASE("load_hf_weights accepts hub and transformers layouts and reports mismatches",
          "[unit][model]") {
  CHECK(hub_name("model.language_model.layers.0.mlp.up_proj.weight") ==
        "language_model.model.layers.0.mlp.up_proj.weight");
  CHECK(hub_name("lm_head.weight") == "language_model.lm_head.weight");
  CHECK(hub_name("model.vision_tower.vision_model.pre_layrnorm.bias") ==
        "vision_tower.vision_model.pre_layrnorm.bias");
  CHECK(hub_name("vision_tower.encoder.layers.0.mlp.fc1.weight") ==
        "vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight");
  CHECK(hub_name("model.multi_modal_projector.linear_1.weight") ==
        "multi_modal_projector.linear_1.weight");

  torch::manual_seed(0);
  Vlm src(tiny_config()), dst(tiny_config());
  auto sd = hf_state_dict(src);
  std::map<std::string, torch::Tensor> memory_layout;  // transformers >= 4.52 names, bfloat16
  for (const auto& [k, v] : sd) {
    std::string n = k;
    if (n.rfind("language_model.model.", 0) == 0) n = "model.language_model." + n.substr(21);
    else if (n == "language_model.lm_head.weight") n = "lm_head.weight";
    else n = "model." + n;
    memory_layout[n] = v.to(torch::kBFloat16);
  }
  load_hf_weights(dst, memory_layout, "mem.safetensors");
  auto w = dst->named_parameters()["language_model.model.norm.weight"];
  CHECK(w.scalar_type() == torch::kFloat32);
  auto expected = sd["language_model.model.norm.weight"].to(torch::kBFloat16).to(torch::kFloat32);
  CHECK(max_diff(w, expected) == 0);

  auto broken = sd;
  broken.erase("multi_modal_projector.linear_1.bias");
  broken["extra.weight"] = torch::zeros({1});
  try {
    load_hf_weights(dst, broken, "bad.safetensors");
    FAIL("expected mmpost::Error");
  } catch (const mmpost::Error& e) {
    const std::string msg = e.what();
    CHECK(msg.find("bad.safetensors") != std::string::npos);
    CHECK(contains(msg, "missing 1 tensor(s):\n    multi_modal_projector.linear_1.bias"));
    CHECK(msg.find("unexpected 1 tensor(s):\n    extra.weight") != std::string::npos);
  }
  auto wrong_shape = sd;
  wrong_shape["language_model.model.norm.weight"] = torch::zeros({31});
  auto msg = error_text([&] { load_hf_weights(dst, wrong_shape, "x"); });
  CHECK(contains(msg, "language_model.model.norm.weight\" has shape [31]"));
  CHECK(contains(msg, "expects [32]"));
}

TEST_CASE("config.json: HF defaults, round trip, refused values name the field", "[unit][model]") {
  auto c = vlm_config_from_json(nlohmann::json::parse(R"({"model_type": "llava",
      "text_config": {"hidden_size": 64, "num_attention_heads": 4, "tie_word_embeddings": true},
      "vision_config": {"image_size": 32, "patch_size": 8}})"));
  CHECK(c.text_config.head_dim == 16);               // hidden / heads
  CHECK(c.text_config.num_key_value_heads == 4);     // = num_attention_heads
  CHECK(c.text_config.vocab_size == 32000);          // LlamaConfig default
  CHECK(c.vision_config.hidden_size == 768);         // CLIPVisionConfig default
  CHECK(c.tie_word_embeddings);                      // from text_config, as LlavaConfig does
  CHECK(c.image_token_index == 32000);
  auto none = vlm_config_from_json(nlohmann::json::object());
  CHECK(none.vision_config.image_size == 336);       // LlavaConfig's CLIP ViT-L/14-336
  CHECK(none.n_image_tokens() == 576);

  auto back = vlm_config_from_json(vlm_config_to_json(tiny_config(true)));
  CHECK(back.text_config.num_key_value_heads == 2);
  CHECK(back.vision_config.num_hidden_layers == 2);
  CHECK(back.image_token_index == 63);
  CHECK(back.tie_word_embeddings);
  CHECK(vlm_config_to_json(back)["architectures"][0] == "LlavaForConditionalGeneration");

  auto refuse = [](const char* text, const char* expect) {
    try {
      vlm_config_from_json(nlohmann::json::parse(text));
      FAIL("expected mmpost::Error for " << text);
    } catch (const mmpost::Error& e) {
      CHECK(e.kind() == mmpost::ErrorKind::kUsage);
      CHECK(contains(e.what(), expect));
    }
  };
  refuse(R"({"text_config": {"hidden_act": "relu2"}})",
         "config.json: text_config.hidden_act: unsupported \"relu2\" (supported: silu");
  refuse(R"({"text_config": {"rope_scaling": {"type": "linear", "factor": 2.0}}})",
         "text_config.rope_scaling: unsupported");
  refuse(R"({"text_config": {"attention_bias": true}})", "text_config.attention_bias");
  refuse(R"({"vision_feature_layer": [-2, -5]})", "vision_feature_layer");
  // Unknown keys, at any level, are refused with their JSON path and the closest known key
  // (a misspelt size would otherwise build a different model silently).
  refuse(R"({"vision_config": {"hiden_size": 64}})",
         "config.json: vision_config.hiden_size: unknown key");
  refuse(R"({"vision_config": {"hiden_size": 64}})", "did you mean \"vision_config.hidden_size\"?");
  refuse(R"({"text_config": {"num_layers": 2}})", "config.json: text_config.num_layers: unknown key");
  refuse(R"({"image_token": 5})", "config.json: image_token: unknown key");
  // transformers' inert bookkeeping keys load.
  CHECK_NOTHROW(vlm_config_from_json(nlohmann::json::parse(
      R"({"architectures": ["LlavaForConditionalGeneration"], "transformers_version": "4.57.1",
          "ignore_index": -100, "vision_config": {"dropout": 0.0, "initializer_factor": 1.0},
          "text_config": {"use_cache": true, "pretraining_tp": 1, "attention_dropout": 0.0,
                          "id2label": {"0": "LABEL_0"}}})")));
  // A recipe's inline model.config names itself.
  try {
    vlm_config_from_json(nlohmann::json::parse(R"({"vision_config": {"hiden_size": 64}})"),
                         "model.config");
    FAIL("expected mmpost::Error");
  } catch (const mmpost::Error& e) {
    CHECK(e.message() == "model.config.vision_config.hiden_size: unknown key (mmpost does not read "
                         "it, and it is not one of transformers' keys known to leave the model "
                         "unchanged)");
    CHECK(e.hint() == "did you mean \"model.config.vision_config.hidden_size\"?");
  }
  refuse(R"({"text_config": {"hidden_size": "big"}})",
         "text_config.hidden_size: expected a number");
}

TEST_CASE("param_counts from the config equal the built model's parameters, per part",
          "[unit][model]") {
  for (int variant = 0; variant < 3; ++variant) {
    VlmConfig c = tiny_config(/*tie=*/variant == 1);
    if (variant == 2) c.multimodal_projector_bias = false;
    auto m = build_vlm(c);
    auto count = [](const torch::nn::Module& mod) {
      int64_t n = 0;
      for (const auto& p : mod.parameters()) n += p.numel();
      return n;
    };
    const ParamCounts n = param_counts(c);
    INFO("variant " << variant);
    CHECK(n.vision_tower == count(*m->vision_tower));
    CHECK(n.projector == count(*m->multi_modal_projector));
    CHECK(n.language_model == count(*m->language_model));
    CHECK(n.total() == count(*m));
  }
  // LLaVA-1.5-7B as transformers builds it from an empty LlavaConfig: 7,062,902,784 parameters
  // (LlavaForConditionalGeneration(LlavaConfig()).num_parameters(), transformers 5.24).
  VlmConfig hf_default = vlm_config_from_json(nlohmann::json::object());
  CHECK(num_params(hf_default) == 7062902784);
  // fp32 AdamW: 4 bytes of weights + 12 of gradient and moments per trainable parameter.
  CHECK(training_state_bytes(1000, 600, 4) == 4000 + 600 * 12);
  CHECK(training_state_bytes(1000, 1000, 2) == 8000);
}

}  // namespace unit_test_model
