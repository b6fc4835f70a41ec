// Shared CLI wiring (placeholder until the stage drivers land).
#include "mmpost/cli_common.h"

namespace mmpost::cli {
void register_subcommands(CLI::App& app) {}
int run_selected(CLI::App& app) { return 0; }
}  // namespace mmpost::cli
