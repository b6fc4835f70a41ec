// End-to-end tests of the run harness every training stage shares (train/run.h, checkpointing.h):
// SIGTERM checkpoint + resume equals a straight run for sft, dpo, rm and rlhf; a resumed run
// survives pruning of the folder it resumed from; gradient accumulation equals one big batch;
// frozen parts stay byte-identical; a finished run is left untouched on rerun; a second writer is
// refused; --no-resume starts clean; shell conveniences (multi-process runs: test_dist_cli.cpp).
// Every comparison is between two runs on the same machine, so none depends on the CPU's
// floating-point path.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "catch.h"
#include "mmpost/io/jsonl.h"
#include "mmpost/io/safetensors.h"
#include "e2e_util.h"
#include "test_util.h"

namespace e2e_test_run_harness {

namespace fs = std::filesystem;
using mmpost::testing::read_all;
using mmpost::testing::run_cli;
using mmpost::testing::TempDir;
using mmpost::testing::tiny_model;
using mmpost::testing::train_rows;
using mmpost::testing::write_prefs;

namespace {

const fs::path kDigits = fs::path(MMPOST_SOURCE_DIR) / "data/digits-vqa";

/// Starts `mmpost ARGS` (from the repo root) as our child; stdout/stderr go to files in `log`.
pid_t spawn_cli(const std::string& args, const fs::path& log) {
  fs::create_directories(log);
  std::string cmd = std::string("cd ") + MMPOST_SOURCE_DIR + " && exec " + MMPOST_BINARY + " " +
                    args + " > " + (log / "stdout.txt").string() + " 2> " +
                    (log / "stderr.txt").string();
  pid_t pid = ::fork();
  if (pid == 0) {
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return pid;
}

/// Waits for our child; its exit status, 128 + signal when killed, -1 after `timeout_s` (then it
/// is killed).
int wait_cli(pid_t pid, double timeout_s = 120) {
  auto start = std::chrono::steady_clock::now();
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >
        timeout_s) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/// Polls until metrics.jsonl has a training row (the loop is running), up to 60 s.
bool wait_for_first_step(const fs::path& run, pid_t pid) {
  for (int i = 0; i < 12000; ++i) {
    if (!train_rows(run / "metrics.jsonl").empty()) return true;
    if (::waitpid(pid, nullptr, WNOHANG) != 0) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

/// The last stdout line as JSON (the training stages' summary).
nlohmann::json last_json_line(const std::string& out) {
  auto end = out.find_last_not_of('\n');
  REQUIRE(end != std::string::npos);
  auto begin = out.rfind('\n', end);
  return nlohmann::json::parse(out.substr(begin == std::string::npos ? 0 : begin + 1));
}

/// `n` digit prompts whose answer is "7".
fs::path write_prompts(const fs::path& dir, int n) {
  mmpost::io::JsonlReader in(kDigits / "train.jsonl");
  mmpost::io::JsonlRecord rec;
  auto path = dir / "prompts.jsonl";
  std::ofstream out(path);
  for (int i = 0; i < n && in.next(rec); ++i) {
    auto r = rec.value;
    r["images"] = {(kDigits / r["images"][0].get<std::string>()).string()};
    r["answer"] = "7";
    out << r.dump() << "\n";
  }
  return path;
}

/// Stops a run with SIGTERM once its loop is running, checks exit 143 and a complete checkpoint,
/// reruns it to the end and requires the final weights (and heads) to equal a straight run's.
void check_sigterm_resume(const std::string& args, const TempDir& dir,
                          const std::vector<std::string>& files) {
  auto straight = dir.path / "straight", stopped = dir.path / "stopped";
  auto r = run_cli(args + " --output " + straight.string(), dir.path / "log_straight");
  INFO(r.err);
  REQUIRE(r.code == 0);
  pid_t pid = spawn_cli(args + " --output " + stopped.string(), dir.path / "log_stop");
  REQUIRE(wait_for_first_step(stopped, pid));
  ::kill(pid, SIGTERM);
  REQUIRE(wait_cli(pid) == 143);
  auto summary = last_json_line(read_all(dir.path / "log_stop" / "stdout.txt"));
  CHECK(summary["exit_reason"] == "signal");
  const int64_t stop_step = summary["step"].get<int64_t>();
  CHECK(fs::exists(stopped / ("step_" + std::string(6 - std::to_string(stop_step).size(), '0') +
                              std::to_string(stop_step)) / "DONE"));
  CHECK_FALSE(fs::exists(stopped / "model.safetensors"));  // not finished: no final model yet
  r = run_cli(args + " --output " + stopped.string(), dir.path / "log_resume");
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.err, HasSubstr("resumed from"));
  for (const auto& f : files) {
    INFO(f);
    CHECK(read_all(straight / f) == read_all(stopped / f));
    CHECK(!read_all(straight / f).empty());
  }
  // metrics.jsonl has each step once, in order, as the straight run's.
  auto a = train_rows(straight / "metrics.jsonl"), b = train_rows(stopped / "metrics.jsonl");
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    CHECK(a[i]["step"] == b[i]["step"]);
    CHECK(a[i]["loss"] == b[i]["loss"]);
  }
}

/// Path -> bytes of every file under `dir`.
std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) out[e.path().string()] = read_all(e.path());
  }
  return out;
}

}  // namespace

TEST_CASE("sft: SIGTERM checkpoints, resume equals a straight run", "[e2e][run]") {
  TempDir dir("run_sft_term");
  check_sigterm_resume("sft -r recipes/tiny/sft-tiny.json --set data.eval= "
                       "--set train.max_steps=12 --set train.log_every_n_steps=1",
                       dir, {"model.safetensors", "tokenizer.model"});
}

TEST_CASE("dpo: SIGTERM checkpoints, resume equals a straight run", "[e2e][run]") {
  TempDir dir("run_dpo_term");
  auto start = tiny_model(dir.path);
  auto prefs = write_prefs(dir.path, 32);
  check_sigterm_resume("dpo -r recipes/tiny/dpo-tiny.json --set model.path=" + start.string() +
                           " --set data.train=" + prefs.string() +
                           " --set data.eval= --set train.max_steps=8 --set train.batch_size=4"
                           " --set train.log_every_n_steps=1",
                       dir, {"model.safetensors"});
}

TEST_CASE("rm: SIGTERM checkpoints, resume equals a straight run", "[e2e][run]") {
  TempDir dir("run_rm_term");
  auto start = tiny_model(dir.path);
  auto prefs = write_prefs(dir.path, 32);
  check_sigterm_resume("rm -r recipes/tiny/rm-tiny.json --set model.path=" + start.string() +
                           " --set data.train=" + prefs.string() +
                           " --set data.eval= --set train.max_steps=8 --set train.batch_size=4"
                           " --set train.log_every_n_steps=1",
                       dir, {"model.safetensors", "reward_head.safetensors"});
}

TEST_CASE("rlhf: SIGTERM checkpoints, resume equals a straight run", "[e2e][run]") {
  TempDir dir("run_rlhf_term");
  auto start = tiny_model(dir.path);
  auto prompts = write_prompts(dir.path, 16);
  check_sigterm_resume("rlhf -r recipes/tiny/grpo-tiny.json --set model.path=" + start.string() +
                           " --set data.train=" + prompts.string() +
                           " --set data.eval= --set train.max_steps=6 --set train.batch_size=2"
                           " --set train.log_every_n_steps=1",
                       dir, {"model.safetensors"});
}

TEST_CASE("a resumed run survives pruning of the checkpoint it resumed from", "[e2e][run]") {
  // The tokenizer used to be re-read from the step folder the run resumed from; once that
  // folder was pruned the next save failed. Now it is written from memory.
  TempDir dir("run_prune");
  const std::string args = "sft -r recipes/tiny/sft-tiny.json --set data.eval= "
                           "--set train.save_every_n_steps=2 --set train.keep_last_n_checkpoints=1";
  auto straight = dir.path / "straight", twice = dir.path / "twice";
  auto r = run_cli(args + " --set train.max_steps=8 --output " + straight.string(),
                   dir.path / "log_a");
  REQUIRE(r.code == 0);
  r = run_cli(args + " --set train.max_steps=4 --output " + twice.string(), dir.path / "log_b");
  REQUIRE(r.code == 0);
  // A larger max_steps continues the finished run (constant schedule: same updates).
  r = run_cli(args + " --set train.max_steps=8 --output " + twice.string(), dir.path / "log_c");
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.err, HasSubstr("resumed from"));
  CHECK_FALSE(fs::exists(twice / "step_000004"));  // pruned after step 6 was complete
  CHECK(fs::exists(twice / "step_000008" / "DONE"));
  CHECK(read_all(straight / "model.safetensors") == read_all(twice / "model.safetensors"));
  CHECK(read_all(straight / "tokenizer.model") == read_all(twice / "tokenizer.model"));
}

TEST_CASE("resuming with another model.config is refused, other changed settings are logged",
          "[e2e][run]") {
  // The checkpoint's weights and config.json resume, whatever the recipe says: a recipe that
  // described another model used to be recorded in recipe.json and silently not applied.
  TempDir dir("run_changed");
  auto run = dir.path / "run";
  const std::string args = "sft -r recipes/tiny/sft-tiny.json --set data.eval= "
                           "--set train.save_every_n_steps=2 --output " + run.string() + " ";
  auto r = run_cli(args + "--set train.max_steps=2", dir.path / "log_a");
  REQUIRE(r.code == 0);
  const std::string recipe_before = read_all(run / "recipe.json");
  r = run_cli(args + "--set train.max_steps=4 --set model.config.text_config.rms_norm_eps=0.001",
              dir.path / "log_b");
  INFO(r.err);
  CHECK(r.code == 2);
  CHECK_THAT(r.err, HasSubstr("resuming would keep the checkpoint's model, but the recipe "
                              "describes another one:\n  model.config.text_config.rms_norm_eps: "));
  CHECK_THAT(r.err, HasSubstr("-> 0.001"));
  CHECK(read_all(run / "recipe.json") == recipe_before);  // nothing recorded
  CHECK_FALSE(fs::exists(run / "step_000004"));
  // An optimizer setting may change (it applies from the resumed step on): logged, then run.
  r = run_cli(args + "--set train.max_steps=4 --set optim.lr=0.0005", dir.path / "log_c");
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.err, HasSubstr("with settings changed since the run started (applied from here "
                              "on):\n  optim.lr: "));
  CHECK_THAT(r.err, HasSubstr("-> 0.0005"));
  CHECK_THAT(r.err, !HasSubstr("train.max_steps:"));  // a larger max_steps is how runs continue
  CHECK(fs::exists(run / "step_000004" / "DONE"));
}

TEST_CASE("a finished run is left untouched when rerun", "[e2e][run]") {
  TempDir dir("run_finished");
  auto run = dir.path / "run";
  const std::string args = "sft -r recipes/tiny/sft-tiny.json --set data.eval= "
                           "--set train.max_steps=4 --output " + run.string();
  auto r = run_cli(args, dir.path / "log_a");
  REQUIRE(r.code == 0);
  auto summary = last_json_line(r.out);
  CHECK(summary["exit_reason"] == "completed");
  CHECK(summary["step"] == 4);
  CHECK(summary["output_dir"] == run.string());
  CHECK(summary["metrics"].contains("loss"));
  auto before = snapshot(run);
  r = run_cli(args, dir.path / "log_b");
  INFO(r.err);
  CHECK(r.code == 0);
  CHECK_THAT(r.err, HasSubstr("already holds this run"));
  CHECK(last_json_line(r.out)["exit_reason"] == "already_finished");
  CHECK(snapshot(run) == before);
  // --no-resume starts over: old checkpoints and metrics go, the new run writes its own.
  r = run_cli("sft -r recipes/tiny/sft-tiny.json --set data.eval= --set train.max_steps=2 "
              "--set train.log_every_n_steps=1 --no-resume --output " + run.string(),
              dir.path / "log_c");
  REQUIRE(r.code == 0);
  CHECK_FALSE(fs::exists(run / "step_000004"));
  CHECK(fs::exists(run / "step_000002" / "DONE"));
  auto rows = train_rows(run / "metrics.jsonl");
  REQUIRE(rows.size() == 2);
  CHECK(rows[0]["step"] == 1);
  CHECK(rows[1]["step"] == 2);
}

TEST_CASE("a second run on the same output folder is refused at once", "[e2e][run]") {
  TempDir dir("run_lock");
  auto run = dir.path / "run";
  const std::string args = "sft -r recipes/tiny/sft-tiny.json --set data.eval= "
                           "--set train.max_steps=100000 --set train.log_every_n_steps=1 --output " +
                           run.string();
  pid_t first = spawn_cli(args, dir.path / "log_first");
  REQUIRE(wait_for_first_step(run, first));
  auto t0 = std::chrono::steady_clock::now();
  auto r = run_cli(args, dir.path / "log_second");
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ::kill(first, SIGTERM);
  CHECK(wait_cli(first) == 143);
  CHECK(r.code == 2);
  CHECK_THAT(r.err, HasSubstr("another mmpost run (pid " + std::to_string(first) + ")"));
  CHECK(secs < 30);  // refused before loading anything (generous bound: not a timing test)
}

TEST_CASE("gradient accumulation equals one big batch", "[e2e][run]") {
  TempDir dir("run_accum");
  const std::string args = "sft -r recipes/tiny/sft-tiny.json --set data.eval= "
                           "--set train.max_steps=3 --set train.log_every_n_steps=1";
  auto r = run_cli(args + " --set train.batch_size=8 --output " + (dir.path / "big").string(),
                   dir.path / "log_big");
  REQUIRE(r.code == 0);
  r = run_cli(args + " --set train.batch_size=2 --set train.gradient_accumulation_steps=4 "
                     "--output " + (dir.path / "acc").string(),
              dir.path / "log_acc");
  REQUIRE(r.code == 0);
  auto big = train_rows(dir.path / "big/metrics.jsonl");
  auto acc = train_rows(dir.path / "acc/metrics.jsonl");
  REQUIRE(big.size() == 3);
  REQUIRE(acc.size() == 3);
  for (size_t i = 0; i < 3; ++i) {
    CHECK(acc[i]["loss"].get<double>() ==
          Approx(big[i]["loss"].get<double>()).epsilon(1e-6).margin(0));
    CHECK(acc[i]["grad_norm"].get<double>() ==
          Approx(big[i]["grad_norm"].get<double>()).epsilon(1e-5).margin(0));
  }
  // The batches must really differ from a shifted stream: a different seed changes the loss.
  r = run_cli(args + " --set train.batch_size=8 --seed 9 --output " + (dir.path / "other").string(),
              dir.path / "log_other");
  REQUIRE(r.code == 0);
  CHECK(train_rows(dir.path / "other/metrics.jsonl")[0]["loss"] != big[0]["loss"]);
}

TEST_CASE("model.freeze keeps the frozen part byte-identical", "[e2e][run]") {
  TempDir dir("run_freeze");
  auto start = tiny_model(dir.path);
  auto out = dir.path / "frozen";
  auto r = run_cli("sft -r recipes/tiny/sft-tiny.json --set data.eval= --set train.max_steps=3 "
                   "--set model.path=" + start.string() +
                   " --set model.freeze=[\\\"vision_tower\\\"] --output " + out.string(),
                   dir.path / "log");
  INFO(r.err);
  REQUIRE(r.code == 0);
  auto a = mmpost::io::load_safetensors(start / "model.safetensors");
  auto b = mmpost::io::load_safetensors(out / "model.safetensors");
  REQUIRE(a.size() == b.size());
  int n_frozen = 0, n_changed = 0;
  for (const auto& [name, t] : a) {
    if (name.find("vision_tower") != std::string::npos) {
      INFO(name);
      CHECK(torch::equal(t, b.at(name)));
      ++n_frozen;
    } else if (!torch::equal(t, b.at(name))) {
      ++n_changed;
    }
  }
  CHECK(n_frozen > 4);
  CHECK(n_changed > 4);  // the rest trained
}

TEST_CASE("shell conveniences: --version, unknown subcommand, defaults with docs, stdin",
          "[e2e][run]") {
  TempDir dir("run_shell");
  auto r = run_cli("--version", dir.path / "v");
  CHECK(r.code == 0);
  CHECK_THAT(r.out, HasSubstr("mmpost ") && HasSubstr("commit") && HasSubstr("LibTorch 2.") &&
                        HasSubstr("CUDA"));
#ifdef MMPOST_LINKED_TCMALLOC
  // build/mmpost links tcmalloc (CMakeLists.txt): the process's malloc must be it, not glibc's.
  CHECK_THAT(r.out, HasSubstr("malloc tcmalloc (built with tcmalloc)"));
#else
  CHECK_THAT(r.out, HasSubstr("\nmalloc ") && !HasSubstr("built with tcmalloc"));
#endif
  r = run_cli("trian", dir.path / "u");
  CHECK(r.code == 2);
  CHECK_THAT(r.err, HasSubstr("unknown subcommand \"trian\"") && HasSubstr("sft"));
  r = run_cli("dpo --print-defaults", dir.path / "d");
  CHECK(r.code == 0);
  CHECK_THAT(r.out, HasSubstr("dpo.beta") && HasSubstr("# DPO temperature"));

  // eval --data - --out -: predictions then the summary on stdout; images relative to the cwd.
  auto model = tiny_model(dir.path);
  std::string cmd = "cd " + kDigits.string() + " && head -5 val.jsonl | " + MMPOST_BINARY +
                    " eval --model " + model.string() + " --data - --out - > " +
                    (dir.path / "out.txt").string() + " 2> " + (dir.path / "err.txt").string();
  int status = std::system(cmd.c_str());
  INFO(read_all(dir.path / "err.txt"));
  REQUIRE(WEXITSTATUS(status) == 0);
  std::istringstream lines(read_all(dir.path / "out.txt"));
  std::vector<nlohmann::json> rows;
  for (std::string line; std::getline(lines, line);) rows.push_back(nlohmann::json::parse(line));
  REQUIRE(rows.size() == 6);
  for (int i = 0; i < 5; ++i) CHECK(rows[i].contains("prediction"));
  CHECK(rows[5]["n"] == 5);
  CHECK(rows[5]["data"] == "<stdin>");
  // A bad line on stdin is located as <stdin>:LINE.
  cmd = "cd " + kDigits.string() + " && (head -2 val.jsonl; echo '{oops') | " + MMPOST_BINARY +
        " eval --model " + model.string() + " --data - 2> " + (dir.path / "err2.txt").string() +
        " > /dev/null";
  status = std::system(cmd.c_str());
  CHECK(WEXITSTATUS(status) == 3);
  CHECK_THAT(read_all(dir.path / "err2.txt"), HasSubstr("<stdin>:3"));
}

// LoRA in the stages with a reference or a head (lora.r > 0): the adapter file is part of the
// resumed state, and the frozen base weights are written back unchanged.
TEST_CASE("LoRA in dpo, rm and rlhf: SIGTERM resume equals a straight run, base weights unchanged",
          "[e2e][run][lora]") {
  const std::string lora = " --set lora.r=4 --set lora.alpha=8 --set lora.dropout=0.1";
  TempDir dir("run_lora_term");
  auto start = tiny_model(dir.path);
  auto prefs = write_prefs(dir.path, 32);
  auto prompts = write_prompts(dir.path, 16);
  const std::vector<std::pair<std::string, std::string>> stages = {
      {"dpo", "dpo -r recipes/tiny/dpo-tiny.json --set data.train=" + prefs.string() +
                  " --set train.max_steps=8 --set train.batch_size=4"},
      {"rm", "rm -r recipes/tiny/rm-tiny.json --set data.train=" + prefs.string() +
                 " --set train.max_steps=8 --set train.batch_size=4"},
      {"rlhf", "rlhf -r recipes/tiny/grpo-tiny.json --set data.train=" + prompts.string() +
                   " --set train.max_steps=6 --set train.batch_size=2 --set rlhf.beta=0.04"}};
  for (const auto& [name, args] : stages) {
    INFO(name);
    TempDir sub("run_lora_" + name);
    std::vector<std::string> files = {"adapter_model.safetensors", "adapter_config.json"};
    if (name == "rm") files.push_back("reward_head.safetensors");
    check_sigterm_resume(args + lora + " --set model.path=" + start.string() +
                             " --set data.eval= --set train.log_every_n_steps=1",
                         sub, files);
    CHECK(read_all(sub.path / "straight" / "model.safetensors") ==
          read_all(start / "model.safetensors"));
    auto config = nlohmann::json::parse(read_all(sub.path / "straight" / "adapter_config.json"));
    CHECK(config["peft_type"] == "LORA");
    CHECK(config["r"] == 4);
  }
}

// The adapters-off reference (no second copy) is the starting model itself: a LoRA DPO run
// against it equals, step for step and bit for bit, the same run against a separately loaded
// copy of the starting model (dpo.ref_model).
TEST_CASE("dpo LoRA: the policy with adapters off is the same reference as a loaded copy",
          "[e2e][dpo][lora]") {
  TempDir dir("dpo_lora_ref");
  auto start = tiny_model(dir.path);
  auto prefs = write_prefs(dir.path, 32);
  const std::string args = "dpo -r recipes/tiny/dpo-tiny.json --set lora.r=4 --set lora.alpha=8"
                           " --set model.path=" + start.string() +
                           " --set data.train=" + prefs.string() + " --set data.eval=" +
                           prefs.string() + " --set train.max_steps=6 --set train.batch_size=4"
                           " --set train.eval_every_n_steps=3 --set train.log_every_n_steps=1";
  auto shared = dir.path / "shared", copy = dir.path / "copy";
  auto r = run_cli(args + " --output " + shared.string(), dir.path / "log_shared");
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.err, HasSubstr("the policy with its LoRA adapters off (no copy)"));
  r = run_cli(args + " --set dpo.ref_model=" + start.string() + " --output " + copy.string(),
              dir.path / "log_copy");
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.err, HasSubstr("a copy, as dpo.ref_model asks"));
  auto rows = [](const fs::path& file) {
    std::vector<nlohmann::json> out;
    std::istringstream in(read_all(file));
    for (std::string line; std::getline(in, line);) {
      auto j = nlohmann::json::parse(line);
      if (j.contains("rewards/margins") || j.contains("eval/rewards/margins")) out.push_back(j);
    }
    return out;
  };
  auto a = rows(shared / "metrics.jsonl"), b = rows(copy / "metrics.jsonl");
  REQUIRE(a.size() >= 6 + 2);  // 6 steps, evals at 3 and 6 (and the final one)
  REQUIRE(b.size() == a.size());
  bool moved = false;
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("row " << i);
    for (const char* k : {"loss", "rewards/chosen", "rewards/rejected", "grad_norm",
                          "eval/rewards/margins", "eval/rewards/chosen"}) {
      if (!a[i].contains(k)) continue;
      CHECK(a[i][k].get<double>() == b[i][k].get<double>());
      if (std::string(k) == "rewards/chosen") moved |= a[i][k].get<double>() != 0.0;
    }
  }
  CHECK(moved);  // the adapters did train: the rewards are not all 0
  CHECK(read_all(shared / "adapter_model.safetensors") == read_all(copy / "adapter_model.safetensors"));
}

/// Runs `args` with train.logits_chunk_size=CHUNK into DIR/NAME; its training rows.
std::vector<nlohmann::json> rows_with_chunk_size(const std::string& args, const TempDir& dir,
                                                 const std::string& name, const std::string& chunk) {
  auto r = run_cli(args + " --set train.logits_chunk_size=" + chunk + " --output " +
                       (dir.path / name).string(),
                   dir.path / ("log_" + name));
  INFO(r.err);
  REQUIRE(r.code == 0);
  return train_rows(dir.path / name / "metrics.jsonl");
}

// train.logits_chunk_size in dpo: the completion tokens through the LM head a chunk at a time
// give the whole-logits run's log-probs, logits metric, gradient norm and next-step loss.
TEST_CASE("dpo chunked log-probs keep the whole-logits run's steps", "[e2e][dpo][efficiency]") {
  TempDir dir("dpo_chunked");
  auto start = tiny_model(dir.path);
  auto prefs = write_prefs(dir.path, 16);
  const std::string args = "dpo -r recipes/tiny/dpo-tiny.json --set model.path=" + start.string() +
                           " --set data.train=" + prefs.string() +
                           " --set data.eval= --set train.max_steps=2 --set train.batch_size=4"
                           " --set train.log_every_n_steps=1";
  auto rows_of = [&](const std::string& name, const std::string& chunk) {
    return rows_with_chunk_size(args, dir, name, chunk);
  };
  auto whole = rows_of("whole", "0");
  REQUIRE(whole.size() == 2);
  CHECK(whole[0]["loss"].get<double>() == Approx(std::log(2.0)).margin(1e-6));
  for (const char* chunk : {"-1", "3"}) {
    INFO("logits_chunk_size " << chunk);
    auto rows = rows_of(std::string("chunk") + chunk, chunk);
    REQUIRE(rows.size() == 2);
    auto close = [](const nlohmann::json& a, const nlohmann::json& b, const char* k, double rel) {
      INFO(k);
      const double x = a[k].get<double>(), y = b[k].get<double>();
      CHECK(std::abs(x - y) <= rel * std::abs(y));
    };
    for (const char* k : {"logps/chosen", "logps/rejected", "grad_norm"}) {
      close(rows[0], whole[0], k, 1e-5);
    }
    close(rows[0], whole[0], "logits/chosen", 1e-4);
    close(rows[1], whole[1], "loss", 1e-5);
  }
}

// train.logits_chunk_size in rlhf (GRPO with a KL term): the same rollouts (generation does not
// depend on it), so step 1's loss, gradient norm, KL and entropy equal the whole-logits run's.
TEST_CASE("rlhf chunked log-probs keep the whole-logits run's step", "[e2e][rlhf][efficiency]") {
  TempDir dir("rlhf_chunked");
  auto start = tiny_model(dir.path);
  auto prompts = write_prompts(dir.path, 8);
  const std::string args = "rlhf -r recipes/tiny/grpo-tiny.json --set model.path=" +
                           start.string() + " --set data.train=" + prompts.string() +
                           " --set data.eval= --set train.max_steps=2 --set train.batch_size=2"
                           " --set rlhf.beta=0.04 --set train.log_every_n_steps=1";
  auto rows_of = [&](const std::string& name, const std::string& chunk) {
    return rows_with_chunk_size(args, dir, name, chunk);
  };
  auto whole = rows_of("whole", "0");
  REQUIRE(whole.size() == 2);
  for (const char* chunk : {"-1", "3"}) {
    INFO("logits_chunk_size " << chunk);
    auto rows = rows_of(std::string("chunk") + chunk, chunk);
    REQUIRE(rows.size() == 2);
    for (const char* k : {"loss", "grad_norm", "entropy", "kl", "reward"}) {
      INFO(k);
      REQUIRE(whole[0].contains(k));
      const double x = rows[0][k].get<double>(), y = whole[0][k].get<double>();
      CHECK(std::abs(x - y) <= 1e-5 * std::abs(y) + 1e-7);
    }
  }
}

// LoRA folders and resumes that must not silently do the wrong thing.
TEST_CASE("LoRA: stale adapters removed, resume settings checked, bf16 base, PEFT-loadable "
          "modules_to_save, half an adapter refused", "[e2e][run][lora]") {
  TempDir dir("lora_guard");
  const std::string sft = "sft -r recipes/tiny/sft-tiny.json --set data.eval= "
                          "--set train.log_every_n_steps=1 --set train.save_every_n_steps=1 ";
  auto out = dir.path / "run";
  auto r = run_cli(sft + "--set train.max_steps=2 --set lora.r=4 --output " + out.string(),
                   dir.path / "l1");
  INFO(r.err);
  REQUIRE(r.code == 0);
  REQUIRE(fs::exists(out / "adapter_model.safetensors"));
  // Resuming with other LoRA settings is refused before training, naming the setting.
  r = run_cli(sft + "--set train.max_steps=3 --set lora.r=4 --set lora.alpha=32 --output " +
                  out.string(), dir.path / "l2");
  CHECK(r.code == 2);
  CHECK_THAT(r.err, HasSubstr("lora.alpha: 32") && HasSubstr("was trained with 16"));
  r = run_cli(sft + "--set train.max_steps=3 --set lora.r=4 "
                    "--set 'lora.modules_to_save=[\"multi_modal_projector\"]' --output " +
                  out.string(), dir.path / "l2b");
  CHECK(r.code == 2);
  CHECK_THAT(r.err, HasSubstr("lora.modules_to_save: [\"multi_modal_projector\"], but"));
  r = run_cli(sft + "--set train.max_steps=3 --output " + out.string(), dir.path / "l3");
  CHECK(r.code == 2);
  CHECK_THAT(r.err, HasSubstr("this run was trained with LoRA") && HasSubstr("lora.r is 0"));
  // The same folder rewritten without LoRA loses the old adapter files (else merged on load).
  r = run_cli(sft + "--set train.max_steps=2 --no-resume --output " + out.string(), dir.path / "l4");
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK_FALSE(fs::exists(out / "adapter_model.safetensors"));
  CHECK_FALSE(fs::exists(out / "adapter_config.json"));
  // ... and resuming that full fine-tune with LoRA is refused.
  r = run_cli(sft + "--set train.max_steps=3 --set lora.r=4 --output " + out.string(), dir.path / "l5");
  CHECK(r.code == 2);
  CHECK_THAT(r.err, HasSubstr("this run was trained without LoRA"));
  // A bfloat16 base: the float32 adapters' output is cast to it.
  r = run_cli(sft + "--set train.max_steps=1 --set lora.r=4 --set dtype=bfloat16 --output " +
                  (dir.path / "bf16").string(), dir.path / "l6");
  INFO(r.err);
  CHECK(r.code == 0);
  // A part saved whole may not also hold adapters (PEFT would ignore them).
  r = run_cli(sft + "--set train.max_steps=1 --set lora.r=4 "
                    "--set 'lora.modules_to_save=[\"vision_tower\"]' --output " +
                  (dir.path / "mts").string(), dir.path / "l7");
  CHECK(r.code == 2);
  CHECK_THAT(r.err, HasSubstr("lora.modules_to_save: vision_tower is trained whole"));
  r = run_cli(sft + "--set train.max_steps=1 --set lora.r=4 "
                    "--set 'lora.target_modules=\".*language_model.*\\\\.(q_proj|v_proj)\"' "
                    "--set 'lora.modules_to_save=[\"vision_tower\"]' --output " +
                  (dir.path / "mts_ok").string(), dir.path / "l8");
  INFO(r.err);
  CHECK(r.code == 0);
  // Half an adapter: named, not silently ignored.
  auto half = dir.path / "half";
  r = run_cli(sft + "--set train.max_steps=1 --set lora.r=4 --output " + half.string(), dir.path / "l9");
  REQUIRE(r.code == 0);
  fs::remove(half / "adapter_model.safetensors");
  r = run_cli("eval --model " + half.string() + " --data data/digits-vqa/val.jsonl --max-samples 2",
              dir.path / "l10");
  CHECK(r.code == 3);
  CHECK_THAT(r.err, HasSubstr("adapter_model.safetensors: missing"));
}

}  // namespace e2e_test_run_harness
