// Round trip with transformers: an HF LLaVA folder -> mmpost sft -> transformers from_pretrained
// loads the result with no missing/unexpected weights and the same logits (within 1e-4).
// Runs scripts/golden/check_roundtrip.py; skipped (with a warning) when the venv lacks
// transformers, which scripts/setup.sh installs.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "catch.h"
#include "test_util.h"

namespace e2e_test_hf_roundtrip {

namespace fs = std::filesystem;

namespace {
/// Runs scripts/golden/check_roundtrip.py EXTRA_ARGS with the venv's python (skipped when it
/// cannot import MODULES) and requires exit 0 and "ok": true in its output.
void check_roundtrip(const std::string& modules, const std::string& extra_args,
                     const std::string& name) {
  const fs::path root = MMPOST_SOURCE_DIR;
  const fs::path python = root / ".venv" / "bin" / "python";
  if (std::system((python.string() + " -c 'import " + modules + "' > /dev/null 2>&1").c_str()) != 0) {
    MMPOST_SKIP(python.string() + " cannot import " + modules + " (run scripts/setup.sh)");
  }
  const fs::path wd = fs::temp_directory_path() / (name + "_" + std::to_string(::getpid()));
  const fs::path log = wd.string() + ".log";
  std::string cmd = python.string() + " " + (root / "scripts/golden/check_roundtrip.py").string() +
                    extra_args + " --mmpost " + MMPOST_BINARY + " --workdir " + wd.string() +
                    " > " + log.string() + " 2>&1";
  int rc = std::system(cmd.c_str());
  std::ifstream in(log);
  std::stringstream ss;
  ss << in.rdbuf();
  INFO(ss.str());
  CHECK(rc == 0);
  CHECK(ss.str().find("\"ok\": true") != std::string::npos);
  fs::remove_all(wd);
  fs::remove(log);
}
}  // namespace

TEST_CASE("checkpoint saved by mmpost sft loads in transformers with the same logits", "[e2e][hf]") {
  check_roundtrip("transformers", "", "mmpost_rt");
}

TEST_CASE("LoRA adapters saved by mmpost sft load with PEFT onto the transformers model with the "
          "same logits, merge_on_save writes the merged model", "[e2e][hf]") {
  check_roundtrip("transformers, peft", " --lora", "mmpost_lora");
}

}  // namespace e2e_test_hf_roundtrip
