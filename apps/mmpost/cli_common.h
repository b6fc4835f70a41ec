// Shared CLI wiring: the flags every training stage takes (--recipe --set --output --device
// --seed), their resolution order (struct defaults < recipe file < --set < dedicated flags), and
// the subcommand registry main.cpp uses.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace mmpost::cli {

/// Flags shared by the training stages.
struct CommonArgs {
  std::string recipe;
  std::vector<std::string> sets;
  std::string output;
  std::string device;
  int64_t seed = -1;
  bool print_defaults = false;
};

/// Adds --recipe, --set, --output, --device, --seed, --print-defaults to `sub`.
void add_common_flags(CLI::App* sub, CommonArgs& args);

/// --set assignments followed by those implied by the dedicated flags (which therefore win).
std::vector<std::string> resolved_overrides(const CommonArgs& args);

/// A stage: its subcommand and the function that runs it once parsed (returns the exit code).
struct Stage {
  CLI::App* sub;
  std::function<int()> run;
};

/// Stage registrations (each in its own file).
Stage setup_sft(CLI::App& app);
Stage setup_dpo(CLI::App& app);
Stage setup_rlhf(CLI::App& app);
Stage setup_rm(CLI::App& app);
Stage setup_eval(CLI::App& app);
Stage setup_generate(CLI::App& app);
Stage setup_bench(CLI::App& app);  // hidden: bench-preprocess (scripts/bench)
Stage setup_inspect(CLI::App& app);

/// Adds every stage subcommand to `app`.
void register_subcommands(CLI::App& app);
/// Runs the subcommand CLI11 selected; returns the process exit code.
int run_selected(CLI::App& app);

}  // namespace mmpost::cli
