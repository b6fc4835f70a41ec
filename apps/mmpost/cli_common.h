// Shared CLI wiring: subcommand registration and dispatch (filled in by the stage drivers).
#pragma once
#include <CLI/CLI.hpp>

namespace mmpost::cli {
/// Adds every stage subcommand (sft, eval, ...) to `app`.
void register_subcommands(CLI::App& app);
/// Runs the subcommand CLI11 selected; returns the process exit code.
int run_selected(CLI::App& app);
}  // namespace mmpost::cli
