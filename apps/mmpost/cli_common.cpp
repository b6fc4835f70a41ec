// Shared CLI wiring (see cli_common.h).
#include "mmpost/cli_common.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "mmpost/core/check.h"
#include "mmpost/io/jsonl.h"

namespace mmpost::cli {
namespace {
std::vector<Stage>& stages() {
  static std::vector<Stage> s;
  return s;
}
}  // namespace

void add_common_flags(CLI::App* sub, CommonArgs& a) {
  sub->add_option("--recipe,-r", a.recipe, "JSON recipe file");
  sub->add_option("--set,-s", a.sets, "override a recipe key: --set optim.lr=5e-5 (repeatable)")
      ->take_all();
  sub->add_option("--output,-o", a.output, "output folder (recipe key output_dir)");
  sub->add_option("--device", a.device, "auto | cpu | cuda | cuda:N (recipe key device)");
  sub->add_option("--seed", a.seed, "random seed (recipe key seed)");
  sub->add_flag("--print-defaults", a.print_defaults,
                "print every recipe key with its default and description, then exit");
}

std::vector<std::string> resolved_overrides(const CommonArgs& a) {
  std::vector<std::string> out = a.sets;
  if (!a.output.empty()) out.push_back("output_dir=\"" + a.output + "\"");
  if (!a.device.empty()) out.push_back("device=\"" + a.device + "\"");
  if (a.seed >= 0) out.push_back("seed=" + std::to_string(a.seed));
  return out;
}

StdinSpool::StdinSpool(std::string& path) {
  if (path != "-") return;
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/mmpost-stdin-XXXXXX";
  std::vector<char> name(pattern.begin(), pattern.end());
  name.push_back('\0');
  int fd = ::mkstemp(name.data());
  MMPOST_CHECK(fd >= 0, pattern, ": cannot create a file for standard input");
  file_ = name.data();
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, stdin)) > 0) {
    MMPOST_CHECK(::write(fd, buf, n) == static_cast<ssize_t>(n), file_,
                 ": cannot spool standard input (disk full?)");
  }
  ::close(fd);
  MMPOST_CHECK(!std::ferror(stdin), "--data -: cannot read standard input");
  io::set_stdin_spool(file_);
  path = file_;
}

StdinSpool::~StdinSpool() {
  if (!file_.empty()) std::remove(file_.c_str());
}

void register_subcommands(CLI::App& app) {
  stages().push_back(setup_sft(app));
  stages().push_back(setup_dpo(app));
  stages().push_back(setup_rlhf(app));
  stages().push_back(setup_rm(app));
  stages().push_back(setup_eval(app));
  stages().push_back(setup_generate(app));
  stages().push_back(setup_bench(app));
  stages().push_back(setup_inspect(app));
  stages().push_back(setup_init(app));
  stages().push_back(setup_report(app));
  stages().push_back(setup_bench_tokenize(app));
}

int run_selected(CLI::App& app) {
  for (const auto& s : stages()) {
    if (s.sub->parsed()) return s.run();
  }
  return 2;
}

}  // namespace mmpost::cli
