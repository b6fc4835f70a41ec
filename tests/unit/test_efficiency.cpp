// Training-efficiency paths that must not change what is learned: activation checkpointing
// (same gradients, and the recompute node really is in the graph), chunked LM-head log-probs
// (same values and gradients as whole logits), and bf16 autocast over float32 weights
// (bf16 matmuls ran, float32 parameters and gradients, state restored).
#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <set>
#include <thread>

#include "catch.h"
#include "test_util.h"
#include "mmpost/algo/chunked_logps.h"
#include "mmpost/algo/logprobs.h"
#include "mmpost/algo/sft_loss.h"
#include "mmpost/core/device.h"
#include "mmpost/model/lora.h"
#include "mmpost/model/vlm.h"
#include "mmpost/train/rollout.h"

namespace unit_test_efficiency {

using namespace mmpost;

namespace {

// A batch of 2: row 0 has one image, row 1 is right-padded text; labels on the tail.
struct Batch {
  torch::Tensor ids, pixels, mask, labels;
};
Batch tiny_batch() {
  torch::manual_seed(11);
  auto ids = torch::randint(1, 60, {2, 24}, torch::kInt64);
  ids[0].narrow(0, 1, 16).fill_(63);
  auto mask = torch::ones({2, 24}, torch::kInt64);
  mask[1].narrow(0, 20, 4).fill_(0);
  auto labels = ids.clone();
  labels.narrow(1, 0, 17).fill_(-100);
  labels[1].narrow(0, 20, 4).fill_(-100);
  return {ids, torch::randn({1, 3, 32, 32}), mask, labels};
}

std::map<std::string, torch::Tensor> grads_of(model::Vlm& m) {
  std::map<std::string, torch::Tensor> g;
  for (const auto& p : m->named_parameters()) {
    if (p.value().grad().defined()) g[p.key()] = p.value().grad().clone();
  }
  return g;
}

// Names of the autograd nodes reachable from t.
std::multiset<std::string> graph_node_names(const torch::Tensor& t) {
  std::multiset<std::string> names;
  std::set<torch::autograd::Node*> seen;
  std::function<void(torch::autograd::Node*)> walk = [&](torch::autograd::Node* n) {
    if (n == nullptr || !seen.insert(n).second) return;
    names.insert(n->name());
    for (const auto& e : n->next_edges()) walk(e.function.get());
  };
  walk(t.grad_fn().get());
  return names;
}

double max_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
}

}  // namespace

TEST_CASE("activation checkpointing: gradients equal the plain backward, one recompute node per "
          "layer", "[unit][efficiency]") {
  for (bool tie : {false, true}) {
    INFO("tie_word_embeddings " << tie);
    torch::manual_seed(5);
    auto m = model::build_vlm(testing::tiny_llava_config(3, tie));
    m->train();
    auto b = tiny_batch();
    auto run = [&](bool ckpt) {
      m->set_activation_checkpointing(ckpt);
      m->zero_grad();
      auto logits = m->forward(b.ids, b.pixels, b.mask);
      auto loss = algo::sft_loss_sum(logits, b.labels);
      auto names = graph_node_names(loss);
      loss.backward();
      return std::make_tuple(loss.item<double>(), grads_of(m),
                             names.count("mmpost::CheckpointBackward"));
    };
    auto [loss0, g0, n0] = run(false);
    auto [loss1, g1, n1] = run(true);
    CHECK(n0 == 0);
    // Every decoder layer and the vision layers LLaVA runs: vision_feature_layer -2 (the default)
    // stops after the first of the two.
    CHECK(n1 == 1 + 3);
    CHECK(loss0 == loss1);
    REQUIRE(g0.size() == g1.size());
    REQUIRE(g0.size() > 10);
    for (const auto& [name, g] : g0) {
      INFO(name);
      REQUIRE(g1.count(name) == 1);
      CHECK(max_diff(g, g1[name]) <= 1e-6 * (1 + g.abs().max().item<double>()));
    }
    // With a frozen vision tower, its layers have nothing to recompute for: no node, same grads.
    for (auto& p : m->vision_tower->parameters()) p.set_requires_grad(false);
    auto [loss2, g2, n2] = run(true);
    CHECK(n2 == 3);
    CHECK(loss2 == loss0);
    CHECK(g2.count("vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight") == 0);
    CHECK(max_diff(g2["language_model.model.layers.0.mlp.up_proj.weight"],
                   g0["language_model.model.layers.0.mlp.up_proj.weight"]) <= 1e-6);
    // Eval mode and no-grad forwards take the plain path.
    m->eval();
    torch::NoGradGuard ng;
    CHECK(max_diff(m->forward(b.ids, b.pixels, b.mask),
                   [&] { m->set_activation_checkpointing(false); return m->forward(b.ids, b.pixels, b.mask); }()) == 0);
  }
}

TEST_CASE("activation checkpointing with LoRA: the adapters get the plain backward's gradients, "
          "LoRA dropout masks included", "[unit][efficiency][lora]") {
  torch::manual_seed(5);
  auto m = model::build_vlm(testing::tiny_llava_config(3));
  for (auto& p : m->parameters()) p.set_requires_grad(false);  // a frozen base, as lora.r > 0
  model::LoraSettings s;
  s.r = 4;
  s.lora_alpha = 8;
  s.lora_dropout = 0.5;
  s.target_modules = {"q_proj", "v_proj", "down_proj"};
  model::LoraAdapters lora(*m, s);
  {
    torch::NoGradGuard ng;  // B != 0, so every adapter is on the path to the loss
    for (auto& [k, t] : lora.named_parameters()) {
      if (k.find("lora_B") != std::string::npos) t.normal_(0, 0.1);
    }
  }
  m->train();
  auto b = tiny_batch();
  auto run = [&](bool ckpt) {
    m->set_activation_checkpointing(ckpt);
    for (auto& [k, t] : lora.named_parameters()) t.mutable_grad() = torch::Tensor();
    torch::manual_seed(77);  // the same dropout draws in both runs' forwards
    auto loss = algo::sft_loss_sum(m->forward(b.ids, b.pixels, b.mask), b.labels);
    const auto n_nodes = graph_node_names(loss).count("mmpost::CheckpointBackward");
    loss.backward();
    const auto after = torch::rand({1}).item<double>();  // where the generator stands afterwards
    std::map<std::string, torch::Tensor> g;
    for (auto& [k, t] : lora.named_parameters()) {
      if (t.grad().defined()) g[k] = t.grad().clone();
    }
    return std::make_tuple(loss.item<double>(), g, n_nodes, after);
  };
  auto [loss0, g0, n0, after0] = run(false);
  auto [loss1, g1, n1, after1] = run(true);
  CHECK(n0 == 0);
  CHECK(n1 == 1 + 3);  // the base is frozen: the adapters alone make each layer recompute
  CHECK(loss0 == loss1);
  CHECK(after0 == after1);  // the recompute put the generator back where the run left it
  // All but the second vision layer's q/v adapters (A and B): LLaVA stops before that layer.
  REQUIRE(lora.named_parameters().size() == 26);
  REQUIRE(g0.size() == 26 - 4);
  REQUIRE(g1.size() == g0.size());
  for (const auto& [name, g] : g0) {
    INFO(name);
    CHECK(g.abs().max().item<double>() > 0);
    CHECK(max_diff(g, g1[name]) <= 1e-6 * (1 + g.abs().max().item<double>()));
  }
}

TEST_CASE("chunked LM-head log-probs equal whole-logits log_softmax, values and gradients",
          "[unit][efficiency]") {
  torch::manual_seed(2);
  auto hidden = torch::randn({37, 16}, torch::kFloat64).requires_grad_(true);
  auto weight = torch::randn({50, 16}, torch::kFloat64).requires_grad_(true);
  auto targets = torch::randint(0, 50, {37}, torch::kInt64);
  auto gout = torch::randn({37}, torch::kFloat64);

  auto ref = torch::log_softmax(torch::nn::functional::linear(hidden, weight).to(torch::kFloat32), -1)
                 .gather(-1, targets.unsqueeze(-1)).squeeze(-1);
  auto [gh_ref, gw_ref] = [&] {
    auto g = torch::autograd::grad({ref}, {hidden, weight}, {gout.to(torch::kFloat32)});
    return std::make_pair(g[0], g[1]);
  }();
  for (int64_t chunk : {1, 8, 37, 100}) {
    INFO("chunk " << chunk);
    auto out = algo::linear_token_logps(hidden, weight, targets, chunk);
    CHECK(out.scalar_type() == torch::kFloat32);
    CHECK(max_diff(out, ref) < 1e-5);
    auto g = torch::autograd::grad({out}, {hidden, weight}, {gout.to(torch::kFloat32)});
    CHECK(max_diff(g[0], gh_ref) < 1e-5);
    CHECK(max_diff(g[1], gw_ref) < 1e-5);
    // A hand check of the formula on row 0: d out_0 / d h_0 = W[t_0] - softmax(z_0) W.
    if (chunk == 8) {
      auto z0 = torch::mv(weight.detach(), hidden.detach()[0]);
      auto expect = weight.detach()[targets[0].item<int64_t>()] -
                    torch::mv(weight.detach().t(), torch::softmax(z0, 0));
      CHECK(max_diff(g[0][0] / gout[0], expect) < 1e-5);
    }
  }
  CHECK(algo::logits_chunk_rows(0, 49152) == (int64_t{128} << 20) / (4 * 49152));  // 682
  CHECK(algo::logits_chunk_rows(-1, 1 << 30) == 1);
  CHECK(algo::logits_chunk_rows(64, 49152) == 64);
}

TEST_CASE("preference token stats from hidden states (chunked) equal token_stats on whole logits",
          "[unit][efficiency]") {
  torch::manual_seed(4);
  auto hidden = torch::randn({3, 9, 16}).requires_grad_(true);
  auto weight = torch::randn({50, 16}).requires_grad_(true);
  auto labels = torch::randint(0, 50, {3, 9}, torch::kInt64);
  labels.narrow(1, 0, 4).fill_(-100);   // prompts
  labels[2].narrow(0, 7, 2).fill_(-100);  // padding
  auto gout = torch::randn({3, 8});
  auto ref = algo::token_stats(torch::nn::functional::linear(hidden, weight), labels);
  auto g_ref = torch::autograd::grad({ref.logps}, {hidden, weight}, {gout});
  for (int64_t chunk : {1, 5, 64}) {
    INFO("chunk " << chunk);
    auto st = algo::token_stats_from_hidden(hidden, weight, labels, chunk);
    CHECK(torch::equal(st.mask, ref.mask));
    CHECK(st.logps.sizes() == ref.logps.sizes());
    CHECK(max_diff(st.logps, ref.logps) < 1e-5);
    CHECK(st.logps.masked_select(~st.mask).abs().sum().item<double>() == 0);
    CHECK(max_diff(st.logits_sum, ref.logits_sum) < 1e-3);  // sums of ~200 logits each
    CHECK(!st.log_sum_sq.defined());
    auto g = torch::autograd::grad({st.logps}, {hidden, weight}, {gout});
    CHECK(max_diff(g[0], g_ref[0]) < 1e-5);
    CHECK(max_diff(g[1], g_ref[1]) < 1e-5);
    // The prompt positions' hidden states get no gradient (they never reach the head).
    CHECK(g[0].narrow(1, 0, 3).abs().sum().item<double>() == 0);
  }
}

TEST_CASE("mean entropy from hidden states (chunked) equals the whole-logits mean entropy",
          "[unit][efficiency]") {
  torch::manual_seed(6);
  auto hidden = torch::randn({3, 7, 16});
  auto weight = torch::randn({50, 16}) * 0.3;
  auto mask = torch::ones({3, 7});
  mask[1].narrow(0, 4, 3).fill_(0);
  mask[2].narrow(0, 1, 6).fill_(0);
  const double whole =
      train::mean_entropy(torch::nn::functional::linear(hidden, weight), mask);
  CHECK(whole > 0.5);
  CHECK(whole < std::log(50.0));
  for (int64_t chunk : {1, 4, 100}) {
    INFO("chunk " << chunk);
    CHECK(algo::mean_entropy_from_hidden(hidden, weight, mask, chunk) == Approx(whole).epsilon(1e-6));
  }
  // A zero head: the uniform distribution, entropy ln V exactly by hand.
  CHECK(algo::mean_entropy_from_hidden(hidden, torch::zeros({50, 16}), mask, 3) ==
        Approx(std::log(50.0)).epsilon(1e-6));
  CHECK(algo::mean_entropy_from_hidden(hidden, weight, torch::zeros({3, 7}), 3) == 0.0);
}

TEST_CASE("sft loss from hidden states (supervised rows only, chunked) equals the whole-logits "
          "loss, with the same gradients through the model", "[unit][efficiency]") {
  for (bool tie : {false, true}) {
    INFO("tie_word_embeddings " << tie);
    torch::manual_seed(9);
    auto m = model::build_vlm(testing::tiny_llava_config(3, tie));
    m->train();
    auto b = tiny_batch();
    m->zero_grad();
    auto full = algo::sft_loss_sum(m->forward(b.ids, b.pixels, b.mask), b.labels);
    full.backward();
    auto g_full = grads_of(m);
    m->zero_grad();
    auto hidden = m->forward_hidden(b.ids, b.pixels, b.mask);
    auto chunked = algo::sft_loss_sum_from_hidden(
        hidden, m->language_model->output_weight(), b.labels, /*chunk_rows=*/3);
    chunked.backward();
    auto g_chunk = grads_of(m);
    // 7 + 3 supervised targets of a 64-token vocabulary: loss ~ 10 ln 64.
    CHECK(full.item<double>() > 30);
    CHECK(std::abs(full.item<double>() - chunked.item<double>()) < 1e-5 * full.item<double>());
    REQUIRE(g_full.size() == g_chunk.size());
    for (const auto& [name, g] : g_full) {
      // Float32 sums in another order: relative to the gradient's scale (loss ~ 40 here).
      INFO(name << " max |g| " << g.abs().max().item<double>());
      CHECK(max_diff(g, g_chunk[name]) < 1e-5 * (1.0 + g.abs().max().item<double>()));
    }
  }
  // Nothing supervised: 0, and backward still works.
  auto h = torch::randn({1, 4, 8}).requires_grad_(true);
  auto none = algo::sft_loss_sum_from_hidden(h, torch::randn({10, 8}),
                                             torch::full({1, 4}, -100, torch::kInt64), 2);
  CHECK(none.item<double>() == 0.0);
  none.backward();
}

TEST_CASE("bf16 autocast over float32 weights: bf16 matmuls, float32 parameters and gradients, "
          "state restored", "[unit][efficiency]") {
  torch::manual_seed(4);
  auto m = model::build_vlm(testing::tiny_llava_config(3));
  m->train();
  auto b = tiny_batch();
  auto ref = m->forward(b.ids, b.pixels, b.mask).detach();
  CHECK_FALSE(at::autocast::is_autocast_enabled(at::kCPU));
  torch::Tensor logits, hidden;
  {
    AutocastGuard ac(torch::kCPU, torch::kBFloat16);
    CHECK(at::autocast::is_autocast_enabled(at::kCPU));
    hidden = m->forward_hidden(b.ids, b.pixels, b.mask);
    logits = m->logits(hidden);
    auto loss = algo::sft_loss_sum(logits, b.labels);
    loss.backward();
    // The head's matmul ran in bf16; the logits come out float32 for the loss.
    CHECK(m->language_model->logits(hidden).scalar_type() == torch::kBFloat16);
  }
  CHECK_FALSE(at::autocast::is_autocast_enabled(at::kCPU));
  CHECK(logits.scalar_type() == torch::kFloat32);
  // bf16 keeps 8 bits of mantissa: the logits moved (bf16 really ran) but only by bf16 rounding.
  const double d = max_diff(logits, ref);
  CHECK(d > 1e-4);
  CHECK(d < 0.05 * (1 + ref.abs().max().item<double>()));
  for (const auto& p : m->named_parameters()) {
    INFO(p.key());
    CHECK(p.value().scalar_type() == torch::kFloat32);
    if (p.value().grad().defined()) CHECK(p.value().grad().scalar_type() == torch::kFloat32);
  }
  // The guard disabled: nothing changes.
  {
    AutocastGuard off(torch::kCPU, torch::kBFloat16, /*enabled=*/false);
    CHECK_FALSE(at::autocast::is_autocast_enabled(at::kCPU));
  }
  // Checkpointing under autocast recomputes in bf16 too: same gradients as without it.
  auto grads_under_autocast = [&](bool ckpt) {
    m->set_activation_checkpointing(ckpt);
    m->zero_grad();
    AutocastGuard ac(torch::kCPU, torch::kBFloat16);
    algo::sft_loss_sum(m->forward(b.ids, b.pixels, b.mask), b.labels).backward();
    return grads_of(m);
  };
  auto g0 = grads_under_autocast(false);
  auto g1 = grads_under_autocast(true);
  for (const auto& [name, g] : g0) {
    INFO(name);
    CHECK(max_diff(g, g1[name]) <= 1e-6 * (1 + g.abs().max().item<double>()));
  }
}

TEST_CASE("at::parallel_for in mmpost's code runs on the intra-op threads, in LibTorch's OpenMP "
          "runtime", "[unit][efficiency]") {
  // ATen's parallel_for is inline: compiled without OpenMP it runs its body on the calling
  // thread (the fused kernels and the host gradient clipping were single-threaded that way).
  const int saved = at::get_num_threads();
  at::set_num_threads(2);
  std::mutex mu;
  std::set<std::thread::id> ids;
  std::atomic<int> started{0}, in_region{0};
  at::parallel_for(0, 2, 1, [&](int64_t, int64_t) {
    started++;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (started.load() < 2 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::yield();
    }
    std::lock_guard<std::mutex> lock(mu);
    ids.insert(std::this_thread::get_id());
    // LibTorch's own runtime sees the region: one thread pool, so torch ops called inside run
    // inline instead of starting a second team.
    in_region += at::in_parallel_region() ? 1 : 0;
  });
  at::set_num_threads(saved);
  CHECK(ids.size() == 2);
  CHECK(in_region == 2);
}

}  // namespace unit_test_efficiency
