// Logging and progress display (see log.h).
#include "mmpost/core/log.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <mutex>

namespace mmpost {
namespace {
std::mutex g_log_mutex;
int g_rank = 0, g_world = 1;
Progress* g_active_bar = nullptr;

std::string timestamp() {
  std::time_t t = std::time(nullptr);
  char buf[16];
  std::strftime(buf, sizeof(buf), "%H:%M:%S", std::localtime(&t));
  return buf;
}

void emit(const std::string& prefix, const std::string& msg, bool every_rank) {
  if (g_rank != 0 && !every_rank) return;
  std::lock_guard<std::mutex> lock(g_log_mutex);
  if (g_active_bar != nullptr) std::cerr << "\r\033[2K";
  std::cerr << "[mmpost " << timestamp() << "] " << rank_prefix() << prefix << msg << std::endl;
}
}  // namespace

void log_info(const std::string& msg) { emit("", msg, false); }
void log_warn(const std::string& msg) { emit("warning: ", msg, true); }
void set_log_rank(int rank, int world_size) {
  g_rank = rank;
  g_world = world_size;
}
std::string rank_prefix() {
  return g_world > 1 ? "[rank " + std::to_string(g_rank) + "/" + std::to_string(g_world) + "] "
                     : std::string();
}
bool stderr_is_tty() { return ::isatty(STDERR_FILENO) == 1; }

std::string format_duration(double s) {
  char buf[32];
  if (!std::isfinite(s) || s < 0) return "?";
  if (s >= 3600) {
    std::snprintf(buf, sizeof(buf), "%dh%02dm", static_cast<int>(s / 3600),
                  static_cast<int>(std::fmod(s, 3600) / 60));
  } else if (s >= 60) {
    std::snprintf(buf, sizeof(buf), "%dm%02ds", static_cast<int>(s / 60),
                  static_cast<int>(std::fmod(s, 60)));
  } else {
    std::snprintf(buf, sizeof(buf), "%.1fs", s);
  }
  return buf;
}

Progress::Progress(std::string label, int64_t total)
    : label_(std::move(label)), total_(total), tty_(stderr_is_tty() && g_rank == 0),
      start_(std::chrono::steady_clock::now()), last_draw_(start_) {}

Progress::~Progress() {
  std::lock_guard<std::mutex> lock(g_log_mutex);
  if (g_active_bar == this) g_active_bar = nullptr;
}

double Progress::elapsed_s() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

double Progress::eta_s() const {
  const int64_t done_here = done_ - base_;  // work done by this process (not a resumed prefix)
  if (done_here <= 0 || total_ <= 0) return 0.0;
  return elapsed_s() / static_cast<double>(done_here) * static_cast<double>(total_ - done_);
}

static int terminal_width() {
  struct winsize ws {};
  if (::ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  return 80;
}

void Progress::update(int64_t done, const std::string& status) {
  if (base_ < 0) {
    base_ = done;
    start_ = std::chrono::steady_clock::now();
  }
  done_ = done;
  if (!tty_) return;
  auto now = std::chrono::steady_clock::now();
  if (done < total_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  // "label [####....] 12/100 elapsed 3.1s eta 20.5s  status", cut to the terminal width so the
  // line never wraps (a wrapped line cannot be redrawn with \r).
  const std::string counts = " " + std::to_string(done) + "/" + std::to_string(total_) +
                             " elapsed " + format_duration(elapsed_s()) + " eta " +
                             format_duration(eta_s()) + (status.empty() ? "" : "  " + status);
  const int width = terminal_width() - 1;
  const int room = width - static_cast<int>(label_.size() + counts.size()) - 3;
  const int bar_width = std::min(30, room);
  std::string line = label_;
  if (bar_width >= 5) {
    double frac = total_ > 0 ? std::min(1.0, static_cast<double>(done) / total_) : 0.0;
    int filled = static_cast<int>(frac * bar_width);
    line += " [" + std::string(filled, '#') + std::string(bar_width - filled, '.') + "]";
  }
  line += counts;
  if (static_cast<int>(line.size()) > width) line.resize(std::max(0, width));
  std::lock_guard<std::mutex> lock(g_log_mutex);
  std::cerr << "\r\033[2K" << line << std::flush;
  drawn_ = true;
  g_active_bar = this;
}

void Progress::clear() {
  if (!tty_ || !drawn_) return;
  std::lock_guard<std::mutex> lock(g_log_mutex);
  std::cerr << "\r\033[2K" << std::flush;
}

void Progress::finish() {
  if (!tty_ || !drawn_) return;
  std::lock_guard<std::mutex> lock(g_log_mutex);
  std::cerr << std::endl;
  drawn_ = false;
  if (g_active_bar == this) g_active_bar = nullptr;
}

}  // namespace mmpost
