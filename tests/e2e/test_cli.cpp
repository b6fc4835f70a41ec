// End-to-end: the mmpost binary on a tiny recipe. Checkpoints are written with DONE, a small
// batch is overfit to accuracy 1.0 for every seed, eval prints one JSON object as its last stdout line, resume is exact, and bad input
// exits with the documented code and a message naming the JSON path or FILE:LINE.
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "catch.h"
#include "mmpost/io/jsonl.h"
#include "mmpost/io/safetensors.h"

namespace e2e_test_cli {

namespace fs = std::filesystem;

namespace {
struct RunResult {
  int code;
  std::string out, err;
};

/// Runs the mmpost binary from the repo root; returns exit code, stdout and stderr.
RunResult run_mmpost(const std::string& args, const fs::path& tmp) {
  fs::create_directories(tmp);
  std::string cmd = std::string("cd ") + MMPOST_SOURCE_DIR + " && " + MMPOST_BINARY + " " + args +
                    " > " + (tmp / "stdout.txt").string() + " 2> " + (tmp / "stderr.txt").string();
  int status = std::system(cmd.c_str());
  auto slurp = [](const fs::path& p) {
    std::ifstream in(p);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(tmp / "stdout.txt"),
          slurp(tmp / "stderr.txt")};
}

std::vector<nlohmann::json> read_metrics(const fs::path& p) {
  std::vector<nlohmann::json> out;
  mmpost::io::JsonlReader r(p);
  mmpost::io::JsonlRecord rec;
  while (r.next(rec)) {
    if (rec.value.contains("loss")) out.push_back(rec.value);
  }
  return out;
}

fs::path tmpdir(const std::string& name) {
  auto d = fs::temp_directory_path() / ("mmpost_e2e_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d;
}
}  // namespace

TEST_CASE("sft on the tiny recipe learns, checkpoints, and eval runs", "[e2e]") {
  auto dir = tmpdir("sft");
  auto r = run_mmpost("sft -r recipes/tiny/sft-tiny.json --output " + (dir / "run").string(), dir);
  INFO(r.err);
  REQUIRE(r.code == 0);
  auto m = read_metrics(dir / "run" / "metrics.jsonl");
  REQUIRE(m.size() == 6);  // steps 5..30
  for (size_t i = 0; i < m.size(); ++i) CHECK(m[i]["step"] == 5 * (i + 1));
  CHECK(fs::exists(dir / "run" / "step_000015" / "DONE"));
  CHECK(fs::exists(dir / "run" / "step_000030" / "DONE"));
  CHECK(fs::exists(dir / "run" / "step_000030" / "optimizer.pt"));
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.model",
                        "preprocessor_config.json", "recipe.json"}) {
    CHECK(fs::exists(dir / "run" / f));
  }
  auto e = run_mmpost("eval --model " + (dir / "run").string() +
                          " --data data/digits-vqa/test.jsonl --max-samples 20 --out " +
                          (dir / "preds.jsonl").string(),
                      dir);
  INFO(e.err);
  REQUIRE(e.code == 0);
  auto last_line = e.out.substr(e.out.rfind('\n', e.out.size() - 2) + 1);
  auto res = nlohmann::json::parse(last_line);
  CHECK(res["n"] == 20);
  std::ifstream preds(dir / "preds.jsonl");
  std::string line;
  int n = 0, n_correct = 0;
  while (std::getline(preds, line)) {
    auto p = nlohmann::json::parse(line);
    CHECK(p.contains("prediction_ids"));
    CHECK(p["correct"].get<bool>() == (p["prediction"] == p["reference"]));
    n_correct += p["correct"].get<bool>();
    ++n;
  }
  CHECK(n == 20);
  // The summary agrees with the per-sample records.
  CHECK(res["n_correct"] == n_correct);
  CHECK(res["accuracy"].get<double>() == Approx(n_correct / 20.0).margin(1e-12));
  fs::remove_all(dir);
}

TEST_CASE("sft overfits one small batch to accuracy 1.0 for every seed", "[e2e]") {
  // 8 training records seen 100 times: every seed must memorize them (an invariant of a working
  // loss, loop and decoder, not a threshold on where a trajectory happens to end).
  auto dir = tmpdir("overfit");
  fs::create_directories(dir);
  std::ifstream src(std::string(MMPOST_SOURCE_DIR) + "/data/digits-vqa/train.jsonl");
  std::ofstream dst(dir / "eight.jsonl");
  std::string line;
  for (int i = 0; i < 8 && std::getline(src, line); ++i) {
    auto rec = nlohmann::json::parse(line);
    rec["images"][0] = std::string(MMPOST_SOURCE_DIR) + "/data/digits-vqa/" +
                       rec["images"][0].get<std::string>();
    // A per-record tag makes every record memorizable even where the tiny vision tower cannot
    // yet tell two 8x8 digits apart.
    rec["messages"][0]["content"] =
        rec["messages"][0]["content"].get<std::string>() + " Record " + std::to_string(i) + ".";
    dst << rec.dump() << "\n";
  }
  dst.close();
  for (int seed : {1, 2, 3}) {
    INFO("seed " << seed);
    auto r = run_mmpost("sft -r recipes/tiny/sft-tiny.json --seed " + std::to_string(seed) +
                            " --set data.train=" + (dir / "eight.jsonl").string() +
                            " --set data.eval= --set train.batch_size=8 --set train.max_steps=100"
                            " --set optim.lr=3e-3 --set model.config.text_config.hidden_size=64"
                            " --set model.config.text_config.intermediate_size=128"
                            " --set model.config.text_config.num_hidden_layers=2 --output " +
                            (dir / "run").string() +
                            std::to_string(seed),
                        dir);
    INFO(r.err);
    REQUIRE(r.code == 0);
    auto e = run_mmpost("eval --model " + (dir / "run").string() + std::to_string(seed) +
                            " --data " + (dir / "eight.jsonl").string(),
                        dir);
    REQUIRE(e.code == 0);
    auto res = nlohmann::json::parse(e.out.substr(e.out.rfind('\n', e.out.size() - 2) + 1));
    CHECK(res["n"] == 8);
    CHECK(res["accuracy"].get<double>() == 1.0);
  }
  fs::remove_all(dir);
}

TEST_CASE("resume: 2 steps + resume + 2 steps equals 4 straight steps", "[e2e]") {
  auto dir = tmpdir("resume");
  std::string base = "sft -r recipes/tiny/sft-tiny.json --set data.eval='\"\"' "
                     "train.save_every_n_steps=2 data.shuffle_buffer=64 ";
  auto a = run_mmpost(base + "train.max_steps=4 --output " + (dir / "straight").string(), dir);
  REQUIRE(a.code == 0);
  auto b1 = run_mmpost(base + "train.max_steps=2 --output " + (dir / "resumed").string(), dir);
  REQUIRE(b1.code == 0);
  // Same output folder, longer run: resumes from step_000002.
  auto b2 = run_mmpost(base + "train.max_steps=4 --output " + (dir / "resumed").string(), dir);
  INFO(b2.err);
  REQUIRE(b2.code == 0);
  CHECK(b2.err.find("resumed from") != std::string::npos);
  auto ta = mmpost::io::load_safetensors(dir / "straight" / "model.safetensors");
  auto tb = mmpost::io::load_safetensors(dir / "resumed" / "model.safetensors");
  REQUIRE(ta.size() == tb.size());
  for (const auto& [name, t] : ta) {
    INFO(name);
    CHECK(torch::equal(t, tb.at(name)));
  }
  fs::remove_all(dir);
}

TEST_CASE("bad recipe key and bad data give the path and exit codes", "[e2e]") {
  auto dir = tmpdir("bad");
  auto r = run_mmpost("sft -r recipes/tiny/sft-tiny.json --set optim.learning_rate=1 --output " +
                          (dir / "x").string(),
                      dir);
  CHECK(r.code == 2);
  CHECK(r.err.find("optim.learning_rate: unknown key") != std::string::npos);
  // A malformed line in the training data: exit 3 naming file:line; with skip it trains.
  fs::create_directories(dir);
  std::ifstream src(std::string(MMPOST_SOURCE_DIR) + "/data/digits-vqa/train.jsonl");
  std::ofstream dst(dir / "train.jsonl");
  std::string line;
  for (int i = 1; i <= 40 && std::getline(src, line); ++i) {
    // Rewrite image paths to absolute so the copy resolves them.
    auto pos = line.find("images/");
    line.replace(pos, 7, std::string(MMPOST_SOURCE_DIR) + "/data/digits-vqa/images/");
    if (i == 17) line.replace(line.find(".png"), 4, "_missing.png");
    dst << (i == 3 ? std::string("{not json") : i == 29 ? std::string(R"({"messages": []})") : line)
        << "\n";
  }
  dst.close();
  std::string args = "sft -r recipes/tiny/sft-tiny.json --set data.eval='\"\"' train.max_steps=2 "
                     "data.shuffle_buffer=0 data.train=" + (dir / "train.jsonl").string() +
                     " --output " + (dir / "y").string();
  // All three bad lines (malformed JSON, a missing image, empty messages) are reported by the
  // validation pass before step 1, in one run.
  auto bad = run_mmpost(args, dir);
  INFO(bad.err);
  CHECK(bad.code == 3);
  CHECK(bad.err.find("3 of 40 records are bad (found before training)") != std::string::npos);
  CHECK(bad.err.find("train.jsonl:3: malformed JSON") != std::string::npos);
  CHECK(bad.err.find("train.jsonl:17: ") != std::string::npos);
  CHECK(bad.err.find("_missing.png: image file not found") != std::string::npos);
  CHECK(bad.err.find("train.jsonl:29: messages: expected a non-empty array") != std::string::npos);
  CHECK_FALSE(fs::exists(dir / "y" / "metrics.jsonl"));  // no step ran
  auto skip = run_mmpost(args + " --set data.on_bad_sample=skip --no-resume", dir);
  INFO(skip.err);
  CHECK(skip.code == 0);
  CHECK(skip.err.find("3 of 40 records will be skipped") != std::string::npos);
  CHECK(skip.err.find("skipped: ") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("a model.config too large for the memory is refused before allocating", "[e2e]") {
  // An empty text_config takes LlamaConfig's 7B defaults: refused with the sizes, exit 2, before
  // any weight exists (this would otherwise be OOM-killed minutes later).
  auto dir = tmpdir("toolarge");
  auto r = run_mmpost("sft -r recipes/tiny/sft-tiny.json --set 'model.config.text_config={}' "
                      "model.config.image_token_index=32000 --output " + (dir / "x").string(),
                      dir);
  INFO(r.err);
  CHECK(r.code == 2);
  CHECK(r.err.find("model.config describes ") != std::string::npos);
  CHECK(r.err.find("language_model 6") != std::string::npos);  // 6.7e9 decoder parameters
  CHECK(r.err.find("an empty text_config") != std::string::npos);
  // A cap in the recipe refuses even a model that fits the machine, naming the cap.
  auto capped = run_mmpost("sft -r recipes/tiny/sft-tiny.json --set model.max_memory_gb=0.0001 "
                           "--output " + (dir / "y").string(), dir);
  CHECK(capped.code == 2);
  CHECK(capped.err.find("over model.max_memory_gb = 0.0001") != std::string::npos);
  CHECK_FALSE(fs::exists(dir / "y" / "metrics.jsonl"));
  // Under LoRA only modules_to_save carry gradients and AdamW moments: the tiny model's ~0.2 MB
  // of weights fit a 0.5 MB cap that full fine-tuning (weights + 3x for its state) exceeds.
  const std::string half_mb = "sft -r recipes/tiny/sft-tiny.json --set model.max_memory_gb=0.0005 "
                              "train.max_steps=1 data.eval='\"\"' ";
  auto full = run_mmpost(half_mb + "--output " + (dir / "full").string(), dir);
  CHECK(full.code == 2);
  CHECK(full.err.find("over model.max_memory_gb = 0.0005") != std::string::npos);
  auto lora = run_mmpost(half_mb + "lora.r=2 --output " + (dir / "lora").string(), dir);
  INFO(lora.err);
  CHECK(lora.code == 0);
  auto lora_all = run_mmpost(half_mb + "lora.r=2 'lora.modules_to_save=[\"language_model\"]' "
                             "--output " + (dir / "lora_all").string(), dir);
  CHECK(lora_all.code == 2);  // the whole language model trained again: over the cap
  CHECK(lora_all.err.find("over model.max_memory_gb = 0.0005") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("sft efficiency settings (fused AdamW, chunked loss, activation checkpointing, "
          "packing, CPU shards, bf16 mixed precision) keep step 1's loss and gradient norm",
          "[e2e]") {
  auto dir = tmpdir("efficiency");
  const std::string base = "sft -r recipes/tiny/sft-tiny.json --set data.eval='\"\"' "
                           "train.max_steps=2 train.log_every_n_steps=1 data.shuffle_buffer=0 ";
  auto first_row = [&](const std::string& name, const std::string& sets) {
    auto r = run_mmpost(base + sets + " --output " + (dir / name).string(), dir / ("log_" + name));
    INFO(name << ": " << r.err);
    REQUIRE(r.code == 0);
    auto rows = read_metrics(dir / name / "metrics.jsonl");
    REQUIRE(rows.size() == 2);
    return std::make_pair(rows[0], r.err);
  };
  // Whole [B, T, V] logits and torch::optim::AdamW: the path before these settings existed.
  auto [plain, plain_log] =
      first_row("plain", "train.logits_chunk_size=0 optim.fused=false train.cpu_shards=1");
  auto [dflt, dflt_log] = first_row("default", "");
  auto [ckpt, ckpt_log] =
      first_row("ckpt", "model.enable_activation_checkpointing=true train.logits_chunk_size=3");
  // Packing: the same 16 samples in fewer rows (positions per sample, no cross-sample
  // attention), so the same loss and gradient.
  auto [packed, packed_log] = first_row("packed", "data.packing=true");
  auto [bf16, bf16_log] = first_row("bf16", "mixed_precision=bf16");
  // Row shards run at once on two threads (16 samples: 6 + 5 + 5), packed or not.
  auto [sharded, sharded_log] = first_row("sharded", "num_threads=2 train.cpu_shards=3");
  auto [sharded_packed, sharded_packed_log] =
      first_row("sharded_packed", "num_threads=2 train.cpu_shards=2 data.packing=true");
  CHECK(sharded_log.find("train.cpu_shards 3: each micro-batch runs as 3 row shards") !=
        std::string::npos);
  const double loss = plain["loss"].get<double>(), gn = plain["grad_norm"].get<double>();
  CHECK(loss > 5.0);  // ~ ln 512 at random init
  for (const auto* row : {&dflt, &ckpt, &packed, &sharded, &sharded_packed}) {
    CHECK(std::abs((*row)["loss"].get<double>() - loss) < 1e-5 * loss);
    CHECK(std::abs((*row)["grad_norm"].get<double>() - gn) < 1e-4 * gn);
  }
  CHECK(packed.contains("padding_fraction"));
  // bf16 matmuls: close to float32, not equal.
  CHECK(std::abs(bf16["loss"].get<double>() - loss) < 2e-2 * loss);
  CHECK(bf16["loss"].get<double>() != loss);
  CHECK(bf16_log.find("mixed precision bf16") != std::string::npos);
  // The master weights, and so the saved model, stay float32.
  auto saved = mmpost::io::load_safetensors(dir / "bf16" / "model.safetensors");
  REQUIRE(!saved.empty());
  for (const auto& [name, t] : saved) {
    INFO(name);
    CHECK(t.scalar_type() == torch::kFloat32);
  }
  // Shards refuse what does not split: dropout masks, bf16 compute.
  for (const std::string sets : {"lora.r=2 lora.dropout=0.1 train.cpu_shards=2",
                                 "mixed_precision=bf16 train.cpu_shards=2"}) {
    auto refused = run_mmpost(base + sets + " --output " + (dir / "refused").string(),
                              dir / "log_refused");
    INFO(sets << ": " << refused.err);
    CHECK(refused.code == 2);
    CHECK(refused.err.find("train.cpu_shards: 2 shards cannot be used here") != std::string::npos);
  }
  // Pure bf16 and mixed bf16 together are refused, naming both keys.
  auto bad = run_mmpost(base + "mixed_precision=bf16 dtype=bfloat16 --output " +
                            (dir / "bad").string(), dir / "log_bad");
  CHECK(bad.code == 2);
  CHECK(bad.err.find("mixed_precision") != std::string::npos);
  CHECK(bad.err.find("dtype bfloat16") != std::string::npos);
  fs::remove_all(dir);
}

}  // namespace e2e_test_cli
