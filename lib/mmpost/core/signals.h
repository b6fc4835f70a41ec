// Graceful stop on SIGINT/SIGTERM: the handler only records the signal; training loops poll
// stop_requested() between steps, write a checkpoint, and exit with 128 + signal (130 / 143).
#pragma once

namespace mmpost {

/// Installs handlers for SIGINT and SIGTERM (a second SIGINT restores the default and kills).
void install_stop_handlers();
/// The signal number received (SIGINT = 2, SIGTERM = 15), or 0.
int stop_requested();

}  // namespace mmpost
