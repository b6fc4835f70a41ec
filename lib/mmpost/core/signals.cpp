// Signal handling for graceful stops (see signals.h).
#include "mmpost/core/signals.h"

#include <atomic>
#include <csignal>

namespace mmpost {
namespace {
std::atomic<int> g_signal{0};

extern "C" void on_signal(int sig) {
  if (g_signal.load() != 0 && sig == SIGINT) {
    std::signal(SIGINT, SIG_DFL);
    std::raise(SIGINT);
    return;
  }
  g_signal.store(sig);
}
}  // namespace

void install_stop_handlers() {
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
}

int stop_requested() { return g_signal.load(); }

}  // namespace mmpost
