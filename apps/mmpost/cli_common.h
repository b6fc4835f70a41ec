// Shared CLI wiring: the flags every training stage takes (--recipe --set --output --device
// --seed), their resolution order (struct defaults < recipe file < --set < dedicated flags), and
// the subcommand registry main.cpp uses.
#pragma once

#include <CLI/CLI.hpp>

#include "mmpost/config/schema.h"

#include <functional>
#include <iostream>
#include <memory>
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

/// Registers a recipe-driven training stage `name`: the common flags, --no-resume and
/// --print-defaults (the table of every key of Config with its default). `load` parses and
/// validates the recipe, `run` runs it (returns the exit code).
template <class Config>
Stage training_stage(CLI::App& app, const std::string& name, const std::string& description,
                     Config (*load)(const std::string&, const std::vector<std::string>&),
                     int (*run)(const Config&, bool)) {
  auto* sub = app.add_subcommand(name, description);
  auto args = std::make_shared<CommonArgs>();
  auto no_resume = std::make_shared<bool>(false);
  add_common_flags(sub, *args);
  sub->add_flag("--no-resume", *no_resume,
                "start fresh even if OUTPUT has a complete checkpoint (default: resume from it)");
  return {sub, [args, no_resume, load, run] {
            if (args->print_defaults) {
              std::cout << config::format_table(config::to_rows(Config{}), /*with_docs=*/true);
              return 0;
            }
            return run(load(args->recipe, resolved_overrides(*args)), !*no_resume);
          }};
}

/// `--data -`: copies standard input to a temporary JSONL file (removed with this object) and
/// points `path` at it, so eval/generate can read it twice (count, then stream). Errors name it
/// "<stdin>" and relative image paths resolve against the current folder (io::set_stdin_spool).
/// Does nothing when `path` is not "-". Throws Error(kRuntime) when the copy fails.
class StdinSpool {
 public:
  explicit StdinSpool(std::string& path);
  ~StdinSpool();
  StdinSpool(const StdinSpool&) = delete;
  StdinSpool& operator=(const StdinSpool&) = delete;

 private:
  std::string file_;
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
Stage setup_init(CLI::App& app);
Stage setup_report(CLI::App& app);
Stage setup_bench_tokenize(CLI::App& app);  // hidden: bench-tokenize (scripts/bench)

/// Adds every stage subcommand to `app`.
void register_subcommands(CLI::App& app);
/// Runs the subcommand CLI11 selected; returns the process exit code.
int run_selected(CLI::App& app);

}  // namespace mmpost::cli
