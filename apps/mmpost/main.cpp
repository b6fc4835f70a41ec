// mmpost entry point: registers the stage subcommands and maps exceptions to exit codes
// (0 ok, 1 runtime failure, 2 bad usage or recipe, 3 bad data, 130/143 after SIGINT/SIGTERM).
#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <dlfcn.h>
#include <malloc.h>

#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>

#include "mmpost/cli_common.h"
#include "mmpost/core/check.h"
#include "mmpost/core/log.h"
#include "mmpost_version.h"

namespace {

/// The malloc this process resolved to: "tcmalloc" when gperftools' tcmalloc serves it (linked
/// into build/mmpost, see CMakeLists.txt, or LD_PRELOADed; its malloc is an alias of tc_malloc),
/// else "glibc" (or "other" for any other interposed allocator).
std::string malloc_name() {
  void* m = dlsym(RTLD_DEFAULT, "malloc");
  void* tc = dlsym(RTLD_DEFAULT, "tc_malloc");
  if (tc != nullptr && m == tc) return "tcmalloc";
  Dl_info info{};
  if (m != nullptr && dladdr(m, &info) != 0 && info.dli_fname != nullptr &&
      std::strstr(info.dli_fname, "libc.so") != nullptr) {
    return "glibc";
  }
  return "other";
}

/// `mmpost --version`: version, commit, LibTorch version, what accelerators it sees, and malloc.
int print_version() {
  std::cout << "mmpost " << MMPOST_VERSION << " (commit " << MMPOST_GIT_COMMIT << ")\n"
            << "LibTorch " << TORCH_VERSION << ", CUDA "
            << (torch::cuda::is_available()
                    ? "available (" + std::to_string(torch::cuda::device_count()) + " device(s))"
                    : std::string("not available"))
            << "\nmalloc " << malloc_name()
#ifdef MMPOST_LINKED_TCMALLOC
            << " (built with tcmalloc)"
#endif
            << "\n";
  return 0;
}

/// Names an unknown subcommand in the error (CLI11 would only say "arguments were not expected").
bool check_subcommand(CLI::App& app, int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') return true;
  std::string valid;
  for (auto* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    if (sub->get_name() == argv[1]) return true;
    if (!sub->get_group().empty()) valid += (valid.empty() ? "" : ", ") + sub->get_name();
  }
  std::cerr << "error: unknown subcommand \"" << argv[1] << "\"\n  valid subcommands: " << valid
            << "\n  (mmpost --help lists them, mmpost SUBCOMMAND --help their flags)\n";
  return false;
}

/// With glibc's malloc (a build without tcmalloc, or MMPOST_TCMALLOC=OFF; tcmalloc ignores
/// mallopt): glibc returns freed blocks above M_TRIM_THRESHOLD / M_MMAP_THRESHOLD to the OS, so every
/// training step page-faults its activations and gradients back in (~90k faults per step at
/// 100M parameters). Keep them: serve blocks up to glibc's largest mmap threshold (32 MiB on
/// 64-bit) from the heap and never trim it. Peak RSS is unchanged (memory that a step needs it
/// needs at its peak anyway). A user's MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ wins.
void keep_freed_memory() {
  if (std::getenv("MALLOC_MMAP_THRESHOLD_") == nullptr) mallopt(M_MMAP_THRESHOLD, 32 << 20);
  if (std::getenv("MALLOC_TRIM_THRESHOLD_") == nullptr) mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

}  // namespace

int main(int argc, char** argv) {
  keep_freed_memory();
  if (argc == 2 && std::strcmp(argv[1], "--version") == 0) return print_version();
  CLI::App app{"mmpost: post-training for vision-language models (mmpost --version prints the "
               "version)"};
  app.require_subcommand(1);
  mmpost::cli::register_subcommands(app);
  if (!check_subcommand(app, argc, argv)) return 2;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    return mmpost::cli::run_selected(app);
  } catch (const mmpost::Error& e) {
    std::cerr << mmpost::rank_prefix() << "error: " << e.what() << "\n";
    switch (e.kind()) {
      case mmpost::ErrorKind::kUsage: return 2;
      case mmpost::ErrorKind::kData: return 3;
      case mmpost::ErrorKind::kRuntime: return 1;
    }
  } catch (const c10::Error& e) {
    std::cerr << mmpost::rank_prefix() << "error: " << e.what_without_backtrace() << "\n";
  } catch (const std::exception& e) {
    std::cerr << mmpost::rank_prefix() << "error: " << e.what() << "\n";
  }
  return 1;
}
