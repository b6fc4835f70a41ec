// mmpost entry point: registers the stage subcommands and maps exceptions to exit codes
// (0 ok, 1 runtime failure, 2 bad usage or recipe, 3 bad data, 130/143 after SIGINT/SIGTERM).
#include <CLI/CLI.hpp>
#include <iostream>

#include "mmpost/cli_common.h"
#include "mmpost/core/check.h"

int main(int argc, char** argv) {
  CLI::App app{"mmpost: post-training for vision-language models"};
  app.require_subcommand(1);
  mmpost::cli::register_subcommands(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    return mmpost::cli::run_selected(app);
  } catch (const mmpost::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    switch (e.kind()) {
      case mmpost::ErrorKind::kUsage: return 2;
      case mmpost::ErrorKind::kData: return 3;
      case mmpost::ErrorKind::kRuntime: return 1;
    }
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
  }
  return 1;
}
