// Stand-alone driver for `bench-preprocess` (apps/mmpost/bench.cpp) used by run_all.sh when
// build/mmpost predates that subcommand: links the lead's build/libmmpost_lib.a, registers only
// the bench stage, so it does not depend on other stages being in a buildable state.
#include <CLI/CLI.hpp>
#include <iostream>

#include "mmpost/cli_common.h"
#include "mmpost/core/check.h"

namespace mmpost::cli {
Stage setup_bench(CLI::App& app);  // apps/mmpost/bench.cpp (also in cli_common.h once merged)
}

int main(int argc, char** argv) {
  CLI::App app{"mmpost bench driver"};
  app.require_subcommand(1);
  auto stage = mmpost::cli::setup_bench(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    return stage.run();
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
