// One training run's plumbing (see run.h).
#include "mmpost/train/run.h"

#include <fcntl.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>

#include "mmpost/core/check.h"
#include "mmpost/core/cpu_gemm.h"
#include "mmpost/core/device.h"
#include "mmpost/core/signals.h"
#include "mmpost/io/checkpoint.h"
#include "mmpost/io/jsonl.h"

namespace mmpost::train {
namespace fs = std::filesystem;

namespace {

constexpr const char* kLockFile = ".lock";
constexpr const char* kSummaryFile = "run.json";
constexpr const char* kMetricsFile = "metrics.jsonl";

std::string fmt(double v, int prec = 4) {
  std::ostringstream os;
  os.precision(prec);
  os << v;
  return os.str();
}

/// Takes an exclusive, non-blocking lock on `file` (an fcntl record lock: unlike flock, its
/// holder's PID can be asked for without writing to the file, and it works on NFS); returns the
/// fd, which holds the lock until closed. Throws Error(kUsage) naming the holder's PID when
/// another process has it. The file's contents are never written.
int take_lock(const fs::path& file, const fs::path& out) {
  int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  MMPOST_CHECK(fd >= 0, file.string(), ": cannot open the run lock: ", std::strerror(errno));
  struct flock lk {};
  lk.l_type = F_WRLCK;
  lk.l_whence = SEEK_SET;  // l_start = l_len = 0: the whole file
  if (::fcntl(fd, F_SETLK, &lk) != 0) {
    struct flock who {};
    who.l_type = F_WRLCK;
    who.l_whence = SEEK_SET;
    const bool known = ::fcntl(fd, F_GETLK, &who) == 0 && who.l_type != F_UNLCK;
    ::close(fd);
    throw Error(ErrorKind::kUsage,
                out.string() + ": another mmpost run (pid " +
                    (known ? std::to_string(who.l_pid) : std::string("unknown")) +
                    ") is writing to this folder",
                "wait for it to finish or stop it, or choose another --output");
  }
  return fd;
}

/// Removes what a crash mid-save leaves behind: hidden ".step_*.tmp.*" folders.
void remove_temp_folders(const fs::path& out) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(out, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(".step_", 0) == 0 && name.find(".tmp.") != std::string::npos) {
      fs::remove_all(e.path(), ec);
    }
  }
}

/// Keeps the metrics rows up to `step` (a resumed run rewrites what came after).
void truncate_metrics(const fs::path& file, int64_t step) {
  std::ifstream in(file);
  if (!in.good()) return;
  std::string line, kept;
  bool dropped = false;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("step") && j["step"].is_number() &&
        j["step"].get<int64_t>() > step) {
      dropped = true;
      continue;
    }
    if (!j.is_discarded()) kept += line + "\n";  // a torn last line from a crash goes too
    else dropped = true;
  }
  if (dropped) io::write_text_atomic(file, kept);
}

// Leaves where two recipes differ, as "path: old -> new" (dotted paths; arrays compared whole).
void recipe_diff(const nlohmann::json& before, const nlohmann::json& after, const std::string& path,
                 std::vector<std::pair<std::string, std::string>>& out) {
  if (before.is_object() && after.is_object()) {
    std::set<std::string> keys;
    for (const auto& [k, v] : before.items()) keys.insert(k);
    for (const auto& [k, v] : after.items()) keys.insert(k);
    for (const auto& k : keys) {
      const std::string sub = path.empty() ? k : path + "." + k;
      recipe_diff(before.contains(k) ? before[k] : nlohmann::json(),
                  after.contains(k) ? after[k] : nlohmann::json(), sub, out);
    }
    return;
  }
  if (before != after) {
    auto shown = [](const nlohmann::json& v) {
      std::string t = v.is_null() ? "(absent)" : v.dump();
      return t.size() > 60 ? t.substr(0, 57) + "..." : t;
    };
    out.emplace_back(path, shown(before) + " -> " + shown(after));
  }
}

}  // namespace

// ---- MetricWindow ------------------------------------------------------------------------------

void MetricWindow::add(const std::string& key, double value) {
  sum_[key] += value;
  ++n_[key];
}

void MetricWindow::count(int64_t tokens, int64_t samples) {
  tokens_ += tokens;
  samples_ += samples;
}

nlohmann::json MetricWindow::flush(const std::string& unit) {
  auto now = std::chrono::steady_clock::now();
  const double dt = std::max(1e-9, std::chrono::duration<double>(now - start_).count());
  nlohmann::json m = nlohmann::json::object();
  for (const auto& [k, v] : sum_) m[k] = v / static_cast<double>(n_[k]);
  if (tokens_ > 0) m["tokens_per_s"] = tokens_ / dt;
  if (samples_ > 0) m[unit + "_per_s"] = samples_ / dt;
  *this = MetricWindow{};
  return m;
}

nlohmann::json MetricWindow::sums() const {
  return {{"sum", sum_}, {"n", n_}, {"tokens", tokens_}, {"samples", samples_}};
}

void MetricWindow::add_sums(const nlohmann::json& other) {
  for (const auto& [k, v] : other.at("sum").items()) sum_[k] += v.get<double>();
  for (const auto& [k, v] : other.at("n").items()) n_[k] += v.get<int64_t>();
  tokens_ += other.at("tokens").get<int64_t>();
  samples_ += other.at("samples").get<int64_t>();
}

void add_step_stats(MetricWindow& w, const StepStats& st) {
  w.add("grad_norm", st.grad_norm);
  if (st.comm.all_reduces == 0) return;
  w.add("dist/allreduce_mb", static_cast<double>(st.comm.bytes_reduced) / (1024.0 * 1024.0));
  w.add("dist/comm_wait_s", st.comm.wait_s);
  w.add("dist/comm_s", st.comm.total_s);
}

// ---- Run ---------------------------------------------------------------------------------------

Run::Run(std::string stage, const config::CommonConfig& cfg, bool allow_resume)
    : stage_(std::move(stage)), out_(cfg.output_dir) {
  try {
    world_ = dist::world_from_env();
  } catch (const std::runtime_error& e) {
    throw Error(ErrorKind::kUsage, stage_ + ": " + e.what(),
                "launch with torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) or srun");
  }
  set_log_rank(world_.rank, world_.world_size);
  MMPOST_CHECK_USAGE(!out_.empty(), "output_dir: required");
  install_stop_handlers();
  if (cfg.num_threads > 0) torch::set_num_threads(static_cast<int>(cfg.num_threads));
  device_ = resolve_device(cfg.device);
  set_cpu_gemm(parse_cpu_gemm(cfg.cpu_gemm));
  if (device_.is_cpu()) {
    const std::string vendor = cpu_vendor();
    log_info(stage_ + ": float32 CPU matmuls in " +
             (cpu_gemm() == CpuGemm::kOneDnn ? "oneDNN" : "BLAS (at::linear)") +
             " (cpu_gemm " + cfg.cpu_gemm + (vendor.empty() ? "" : ", " + vendor + " CPU") + ")");
  }
  if (world_.world_size > 1 && device_.is_cuda() && !device_.has_index()) {
    device_ = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(world_.local_rank));
  }
  // Mixed precision: float32 weights (the master copy), bf16 compute under autocast for every
  // forward of the stage on this thread (training, reference model, rollouts, in-loop eval).
  mixed_precision_ = cfg.mixed_precision == "bf16";
  dtype_ = mixed_precision_ ? torch::kFloat32 : resolve_dtype(cfg.dtype, device_);
  if (mixed_precision_) {
    autocast_ = std::make_unique<AutocastGuard>(device_, torch::kBFloat16);
    log_info(stage_ + ": mixed precision bf16 (float32 weights, gradients and AdamW state; bf16 "
             "matmuls and attention under autocast)");
  }
  seed_everything(static_cast<uint64_t>(cfg.seed));
  if (world_.world_size > 1) {
    const std::string backend =
        cfg.dist.backend != "auto" ? cfg.dist.backend : device_.is_cuda() ? "nccl" : "gloo";
    log_info(stage_ + ": joining " + std::to_string(world_.world_size) + " processes (" +
             world_.launcher + ", " + backend + ", rendezvous " + world_.master_addr + ":" +
             std::to_string(world_.master_port) + ", timeout " + fmt(cfg.dist.timeout_s) + " s)");
    try {
      pg_ = std::make_unique<dist::ProcessGroup>(world_, cfg.dist.timeout_s, backend);
    } catch (const std::invalid_argument& e) {
      throw Error(ErrorKind::kUsage, std::string("dist.backend: ") + e.what());
    }
  }
  std::error_code ec;
  std::string resume_from;
  if (is_main()) {
    MMPOST_CHECK_USAGE(!fs::exists(out_, ec) || fs::is_directory(out_, ec), out_.string(),
                       ": exists and is not a folder; --output names the run's folder");
    fs::create_directories(out_, ec);
    MMPOST_CHECK(!ec, out_.string(), ": cannot create the output folder: ", ec.message());
    lock_fd_ = take_lock(out_ / kLockFile, out_);
    remove_temp_folders(out_);
    if (allow_resume) {
      if (auto c = io::latest_complete_checkpoint(out_)) resume_from = c->string();
    } else {
      // --no-resume: the previous run's checkpoints would outrank the new ones (higher steps).
      int n_removed = 0;
      for (const auto& e : fs::directory_iterator(out_, ec)) {
        if (io::parse_step_dir_name(e.path().filename().string()) && e.is_directory()) {
          fs::remove(e.path() / "DONE", ec);
          fs::remove_all(e.path(), ec);
          MMPOST_CHECK(!ec, e.path().string(), ": cannot remove: ", ec.message());
          ++n_removed;
        }
      }
      fs::remove(out_ / kMetricsFile, ec);
      fs::remove(out_ / kSummaryFile, ec);
      if (n_removed > 0) {
        log_warn(stage_ + ": --no-resume: removed " + std::to_string(n_removed) +
                 " checkpoint(s) of the previous run in " + out_.string());
      }
    }
  }
  if (pg_) resume_from = pg_->all_gather_object(resume_from)[0];  // rank 0 decides for all
  if (!resume_from.empty()) {
    ckpt_ = fs::path(resume_from);
    MMPOST_CHECK(io::is_complete(*ckpt_), ckpt_->string(), ": rank 0 resumes from this checkpoint, but this "
                 "process cannot read it", "\n  hint: OUTPUT must be on a file system every node "
                 "shares");
    state = read_train_state(*ckpt_);
  }
}

Run::~Run() {
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the flock; the file stays for the next run
}

bool Run::finished(int64_t total_steps) const {
  return ckpt_.has_value() && state.step >= total_steps && fs::is_regular_file(out_ / kSummaryFile);
}

int Run::report_already_finished() {
  if (!is_main()) return 0;
  nlohmann::json s;
  try {
    s = nlohmann::json::parse(std::ifstream(out_ / kSummaryFile));
  } catch (const nlohmann::json::exception&) {
    s = summary(RunEnd::kCompleted);
  }
  s["exit_reason"] = "already_finished";
  log_info(stage_ + ": " + out_.string() + " already holds this run, finished at step " +
           std::to_string(state.step) + "; nothing to do (--no-resume starts over, a larger "
           "train.max_steps continues)");
  std::cout << s.dump() << std::endl;
  return 0;
}

void Run::check_resumed_recipe(const nlohmann::json& recipe) const {
  if (state.recipe.is_null()) return;  // an older checkpoint without its recipe: nothing to compare
  std::vector<std::pair<std::string, std::string>> diffs;
  recipe_diff(state.recipe, recipe, "", diffs);
  std::string fixed, changed;
  for (const auto& [key, change] : diffs) {
    // The checkpoint's weights and config.json define the model that resumes: a recipe that
    // describes another one would be recorded but never applied.
    if (key.rfind("model.config.", 0) == 0 || key == "model.config" || key.rfind("lora.", 0) == 0 ||
        key == "lora") {
      fixed += "\n  " + key + ": " + change;
    } else if (key != "train.max_steps" && key != "train.epochs" && key != "output_dir") {
      changed += "\n  " + key + ": " + change;
    }
  }
  if (!fixed.empty()) {
    throw Error(ErrorKind::kUsage,
                ckpt_->string() + ": resuming would keep the checkpoint's model, but the recipe "
                "describes another one:" + fixed,
                "resume with the recipe the run started with, or start over (--no-resume, or "
                "another --output)");
  }
  if (!changed.empty()) {
    log_warn(stage_ + ": resuming " + ckpt_->string() + " with settings changed since the run "
             "started (applied from here on):" + changed);
  }
}

void Run::start(int64_t total_steps, const nlohmann::json& recipe) {
  total_steps_ = total_steps;
  start_step_ = state.step;
  if (ckpt_) check_resumed_recipe(recipe);  // every rank: each throws alike
  if (!is_main()) return;  // rank 0 writes the recipe and metrics and draws the progress
  io::write_text_atomic(out_ / "recipe.json", recipe.dump(2) + "\n");
  if (ckpt_) {
    truncate_metrics(out_ / kMetricsFile, state.step);
    log_info(stage_ + ": resumed from " + ckpt_->string() + " at step " +
             std::to_string(state.step) + " of " + std::to_string(total_steps));
  }
  metrics_ = std::make_unique<io::JsonlWriter>(
      out_ / kMetricsFile, ckpt_ ? io::JsonlWriter::Mode::kAppend : io::JsonlWriter::Mode::kTruncate);
  progress_ = std::make_unique<Progress>(stage_, total_steps);
  progress_->update(state.step);
}

bool Run::due(int64_t every) const {
  return every > 0 && state.step % every == 0 && state.step < total_steps_;
}

void Run::log_step(nlohmann::json m, const std::vector<std::string>& shown) {
  if (!is_main()) return;
  m["step"] = state.step;
  metrics_->write(m);
  last_train_ = m;
  std::string line = "step " + std::to_string(state.step) + "/" + std::to_string(total_steps_);
  auto num = [&](const std::string& k) { return m.contains(k) && m[k].is_number(); };
  for (const auto& k : shown) {
    if (num(k)) line += " " + k + " " + fmt(m[k].get<double>());
  }
  if (num("grad_norm")) line += " grad_norm " + fmt(m["grad_norm"].get<double>(), 3);
  if (num("lr")) line += " lr " + fmt(m["lr"].get<double>(), 3);
  if (num("tokens_per_s")) line += " tokens/s " + format_rate(m["tokens_per_s"].get<double>());
  if (!stderr_is_tty()) line += " eta " + format_duration(progress_->eta_s());
  progress_->clear();
  log_info(line);
}

nlohmann::json Run::flush(MetricWindow& window, const std::string& unit) const {
  if (!pg_) return window.flush(unit);
  const auto parts = pg_->all_gather_object(window.sums().dump());
  for (size_t r = 0; r < parts.size(); ++r) {  // this rank's own sums are already in `window`
    if (static_cast<int>(r) != world_.rank) window.add_sums(nlohmann::json::parse(parts[r]));
  }
  return window.flush(unit);
}

void Run::log_eval(const nlohmann::json& m, const std::string& line) {
  if (!is_main()) return;
  nlohmann::json row = m;
  row["step"] = state.step;
  if (metrics_) metrics_->write(row);
  last_eval_ = row;
  if (progress_) progress_->clear();
  log_info(line);
}

void Run::progress() {
  if (progress_) progress_->update(state.step);
}

int Run::stop_requested() const {
  const int sig = mmpost::stop_requested();
  if (!pg_) return sig;
  // Every rank stops at the same step: SIGTERM if any rank saw it, else SIGINT if any did.
  auto seen = all_sum({sig == SIGTERM ? 1.0 : 0.0, sig == SIGINT ? 1.0 : 0.0});
  return seen[0] > 0 ? SIGTERM : seen[1] > 0 ? SIGINT : 0;
}

std::vector<double> Run::all_sum(std::vector<double> values) const {
  return dist::sum_over_ranks(pg_.get(), std::move(values));
}

nlohmann::json Run::summary(RunEnd end) const {
  static const char* kReasons[] = {"completed", "already_finished", "signal"};
  return {{"stage", stage_},
          {"output_dir", out_.string()},
          {"step", state.step},
          {"total_steps", total_steps_},
          {"exit_reason", kReasons[static_cast<int>(end)]},
          {"tokens_seen", state.tokens_seen},
          {"skipped", state.n_skipped},
          {"metrics", last_train_},
          {"eval", last_eval_}};
}

int Run::stopped(int sig) {
  if (!is_main()) return 128 + sig;
  if (progress_) progress_->finish();
  log_warn(stage_ + ": stopped by signal " + std::to_string(sig) + " at step " +
           std::to_string(state.step) + "; the checkpoint is written, rerun the same command to "
           "resume");
  auto s = summary(RunEnd::kSignal);
  s["signal"] = sig;
  std::cout << s.dump() << std::endl;
  return 128 + sig;
}

int Run::completed(const nlohmann::json& extra) {
  if (pg_) pg_->barrier();  // rank 0's final model is written: no rank reports success before
  if (!is_main()) return 0;
  if (progress_) progress_->finish();
  auto s = summary(RunEnd::kCompleted);
  for (const auto& [k, v] : extra.items()) s[k] = v;
  io::write_text_atomic(out_ / kSummaryFile, s.dump(2) + "\n");
  std::cout << s.dump() << std::endl;
  return 0;
}

int64_t total_steps_of(const config::TrainSection& t, int64_t n_records, int64_t per_step) {
  if (t.max_steps > 0) return t.max_steps;
  return std::max<int64_t>(
      1, static_cast<int64_t>(std::ceil(t.epochs * static_cast<double>(n_records) /
                                        static_cast<double>(std::max<int64_t>(1, per_step)))));
}

std::string format_rate(double v) {
  if (!std::isfinite(v)) return "?";
  const char* suffix = "";
  if (v >= 1e9) v /= 1e9, suffix = "G";
  else if (v >= 1e6) v /= 1e6, suffix = "M";
  else if (v >= 1e3) v /= 1e3, suffix = "k";
  char buf[32];
  std::snprintf(buf, sizeof(buf), v >= 100 ? "%.0f%s" : v >= 10 ? "%.1f%s" : "%.2f%s", v, suffix);
  return buf;
}

}  // namespace mmpost::train
