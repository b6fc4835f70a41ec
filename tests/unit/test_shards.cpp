// train.cpu_shards (train/shards.h): shard ranges, the auto rule and its refusals, concurrent
// shards (every one runs, errors and thread-local state carried), and sharded backward = the
// gradient of the whole micro-batch, also through a tiny LLaVA with images.
#include <ATen/Parallel.h>

#include <atomic>
#include <set>
#include <stdexcept>

#include "catch.h"
#include "mmpost/algo/sft_loss.h"
#include "mmpost/core/check.h"
#include "mmpost/model/vlm.h"
#include "mmpost/train/shards.h"
#include "test_util.h"

namespace unit_test_shards {

using mmpost::train::backward_shards;
using mmpost::train::resolve_cpu_shards;
using mmpost::train::run_concurrently;
using mmpost::train::shard_blocker;
using mmpost::train::shard_range;

namespace {

/// Sets the intra-op thread count for a scope.
struct Threads {
  int before = at::get_num_threads();
  explicit Threads(int n) { at::set_num_threads(n); }
  ~Threads() { at::set_num_threads(before); }
};

double max_abs(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

}  // namespace

TEST_CASE("shard_range splits rows contiguously, the first shards one row larger",
          "[unit][shards]") {
  CHECK(shard_range(10, 3, 0) == std::make_pair<int64_t, int64_t>(0, 4));
  CHECK(shard_range(10, 3, 1) == std::make_pair<int64_t, int64_t>(4, 7));
  CHECK(shard_range(10, 3, 2) == std::make_pair<int64_t, int64_t>(7, 10));
  CHECK(shard_range(2, 2, 1) == std::make_pair<int64_t, int64_t>(1, 2));
  CHECK(shard_range(5, 1, 0) == std::make_pair<int64_t, int64_t>(0, 5));
  CHECK_THROWS_AS(shard_range(2, 3, 0), mmpost::Error);  // more shards than rows
  CHECK_THROWS_AS(shard_range(4, 2, 2), mmpost::Error);
}

TEST_CASE("train.cpu_shards: auto takes the threads for a small model, refuses what cannot split",
          "[unit][shards]") {
  const torch::Device cpu(torch::kCPU);
  const int64_t small = 4 << 20;  // 4 MiB of trainable weights
  {
    Threads t(2);
    CHECK(resolve_cpu_shards(0, cpu, small, "") == 2);
    CHECK(resolve_cpu_shards(1, cpu, small, "") == 1);
    CHECK(resolve_cpu_shards(3, cpu, small, "") == 3);
    // (n - 1) x 300 MiB of extra gradient buffers: over auto's 256 MiB.
    CHECK(resolve_cpu_shards(0, cpu, int64_t{300} << 20, "") == 1);
    CHECK(resolve_cpu_shards(0, cpu, small, "some reason") == 1);
    try {
      resolve_cpu_shards(2, cpu, small, "dropout (lora.dropout > 0) draws its masks per thread");
      FAIL("expected a usage error");
    } catch (const mmpost::Error& e) {
      CHECK(e.kind() == mmpost::ErrorKind::kUsage);
      CHECK(std::string(e.what()).find("train.cpu_shards") != std::string::npos);
      CHECK(std::string(e.what()).find("lora.dropout") != std::string::npos);
    }
    try {
      resolve_cpu_shards(2, torch::Device(torch::kCUDA, 0), small, "");
      FAIL("expected a usage error");
    } catch (const mmpost::Error& e) {
      CHECK(e.kind() == mmpost::ErrorKind::kUsage);
      CHECK(std::string(e.what()).find("CPU") != std::string::npos);
    }
    CHECK(resolve_cpu_shards(0, torch::Device(torch::kCUDA, 0), small, "") == 1);
    CHECK_THROWS_AS(resolve_cpu_shards(-1, cpu, small, ""), mmpost::Error);
  }
  {
    Threads t(1);
    CHECK(resolve_cpu_shards(0, cpu, small, "") == 1);
  }
  CHECK(shard_blocker(0.0, torch::kFloat32, false, 1).empty());
  CHECK(shard_blocker(0.05, torch::kFloat32, false, 1).find("dropout") != std::string::npos);
  CHECK(shard_blocker(0.0, torch::kBFloat16, false, 1).find("float32") != std::string::npos);
  CHECK(shard_blocker(0.0, torch::kFloat32, true, 1).find("mixed_precision") != std::string::npos);
  CHECK(shard_blocker(0.0, torch::kFloat32, false, 2).find("processes") != std::string::npos);
}

TEST_CASE("run_concurrently runs every shard on its own thread, carries grad mode, rethrows the "
          "lowest shard's error after all ran", "[unit][shards]") {
  Threads t(2);
  std::vector<int> thread_of(2, -1);
  std::vector<char> in_region(2, 0);
  run_concurrently(2, [&](int64_t s) {
    thread_of[s] = at::get_thread_num();
    in_region[s] = at::in_parallel_region();
  });
  CHECK(std::set<int>(thread_of.begin(), thread_of.end()).size() == 2);  // two threads
  CHECK(in_region[0]);
  CHECK(in_region[1]);  // so ATen kernels inside run single-threaded

  std::vector<char> grad_on(2, 1);
  {
    torch::NoGradGuard no_grad;
    run_concurrently(2, [&](int64_t s) { grad_on[s] = torch::GradMode::is_enabled(); });
  }
  CHECK(!grad_on[0]);
  CHECK(!grad_on[1]);

  std::atomic<int> ran{0};
  try {
    run_concurrently(4, [&](int64_t s) {
      ++ran;
      if (s >= 2) throw std::runtime_error("shard " + std::to_string(s));
    });
    FAIL("expected the shard's error");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()) == "shard 2");
  }
  CHECK(ran.load() == 4);
}

TEST_CASE("backward_shards gives the whole batch's gradient, added onto .grad, the same bits "
          "every run", "[unit][shards]") {
  Threads t(2);
  torch::manual_seed(0);
  torch::nn::Sequential net(torch::nn::Linear(6, 16), torch::nn::Tanh(), torch::nn::Linear(16, 3));
  auto unused = torch::randn({4}).requires_grad_();  // allow_unused: keeps what it had
  std::vector<torch::Tensor> params = net->parameters();
  params.push_back(unused);
  auto x = torch::randn({10, 6}), y = torch::randn({10, 3});
  auto loss_rows = [&](int64_t b, int64_t e) {
    return (net->forward(x.slice(0, b, e)) - y.slice(0, b, e)).pow(2).sum() / 10.0;
  };
  auto grads = [&] {
    std::vector<torch::Tensor> g;
    for (auto& p : params) g.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
    return g;
  };
  auto zero = [&] {
    for (auto& p : params) p.mutable_grad() = torch::Tensor();
  };
  // Reference: the whole batch, one backward, after a previous micro-batch's gradient.
  zero();
  loss_rows(0, 10).backward();
  auto whole = loss_rows(0, 10);
  whole.backward();
  auto expect = grads();
  for (int64_t n : {2, 3}) {
    INFO(n << " shards");
    std::vector<std::vector<torch::Tensor>> runs;
    for (int rep = 0; rep < 2; ++rep) {
      zero();
      loss_rows(0, 10).backward();  // the earlier micro-batch's gradient stays
      auto losses = backward_shards(
          n,
          [&](int64_t s) {
            auto [b, e] = shard_range(10, n, s);
            return loss_rows(b, e);
          },
          params);
      REQUIRE(losses.size(0) == n);
      CHECK(losses.scalar_type() == torch::kFloat64);
      CHECK(std::abs(losses.sum().item<double>() - whole.item<double>()) < 1e-6);
      runs.push_back(grads());
    }
    for (size_t i = 0; i + 1 < params.size(); ++i) {
      CHECK(max_abs(runs[0][i], expect[i]) < 1e-6);
      CHECK(torch::equal(runs[0][i], runs[1][i]));  // independent of thread timing
    }
    CHECK(!runs[0].back().defined());  // never used: no gradient made up
  }
}

TEST_CASE("two shards of a tiny LLaVA with images give the whole batch's loss and gradients",
          "[unit][shards]") {
  Threads t(2);
  torch::manual_seed(0);
  mmpost::model::Vlm model(mmpost::testing::tiny_llava_config());
  model->train();
  const int64_t B = 4, T = 24;
  auto ids = torch::randint(0, 60, {B, T}, torch::kInt64);
  ids.narrow(1, 2, 16).fill_(63);  // one 16-patch image per row
  auto mask = torch::ones({B, T}, torch::kInt64);
  mask[3].narrow(0, T - 3, 3).fill_(0);  // a padded row
  auto labels = ids.clone();
  labels.narrow(1, 0, 18).fill_(-100);
  labels[3].narrow(0, T - 3, 3).fill_(-100);
  auto pixels = torch::randn({B, 3, 32, 32});
  const double n_targets = static_cast<double>(mmpost::algo::n_supervised_targets(labels));
  auto loss_rows = [&](int64_t b, int64_t e) {
    auto logits = model->forward(ids.slice(0, b, e), {pixels.slice(0, b, e), {}},
                                 mask.slice(0, b, e));
    return mmpost::algo::sft_loss_sum(logits, labels.slice(0, b, e)) / n_targets;
  };
  std::vector<torch::Tensor> params = model->parameters();
  auto whole = loss_rows(0, B);
  whole.backward();
  std::vector<torch::Tensor> expect;
  for (auto& p : params) expect.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
  model->zero_grad(/*set_to_none=*/true);
  auto losses = backward_shards(
      2,
      [&](int64_t s) {
        auto [b, e] = shard_range(B, 2, s);
        return loss_rows(b, e);
      },
      params);
  CHECK(std::abs(losses.sum().item<double>() - whole.item<double>()) < 1e-6);
  auto named = model->named_parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    INFO(named.keys()[i]);
    REQUIRE(params[i].grad().defined() == expect[i].defined());  // unused layers: none
    if (!expect[i].defined()) continue;
    CHECK(max_abs(params[i].grad(), expect[i]) < 1e-5 * (1 + expect[i].abs().max().item<double>()));
  }
  // The vision tower's patch embedding (its weight gradient crossed both shards) really trained.
  CHECK(model->named_parameters()["vision_tower.vision_model.embeddings.patch_embedding.weight"]
            .grad()
            .abs()
            .sum()
            .item<double>() > 0);
}

TEST_CASE("the CLIP patch embedding as a GEMM equals the stride-p convolution", "[unit][shards]") {
  torch::manual_seed(0);
  mmpost::model::Vlm model(mmpost::testing::tiny_llava_config());
  auto& emb = model->vision_tower->vision_model->embeddings;
  auto pixels = torch::randn({3, 3, 32, 32});
  auto conv = torch::conv2d(pixels, emb->patch_embedding->weight, {}, /*stride=*/8);  // [3, C, 4, 4]
  auto expect = torch::cat({emb->class_embedding.view({1, 1, -1}).expand({3, 1, -1}),
                            conv.flatten(2).transpose(1, 2)},
                           1) +
                emb->position_embedding->weight.unsqueeze(0);
  CHECK(max_abs(emb->forward(pixels), expect) < 1e-5);
}

}  // namespace unit_test_shards
