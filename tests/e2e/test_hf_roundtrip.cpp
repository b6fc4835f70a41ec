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

namespace fs = std::filesystem;

TEST_CASE("checkpoint saved by mmpost sft loads in transformers with the same logits", "[e2e][hf]") {
  const fs::path root = MMPOST_SOURCE_DIR;
  const fs::path python = root / ".venv" / "bin" / "python";
  if (std::system((python.string() + " -c 'import transformers' > /dev/null 2>&1").c_str()) != 0) {
    MMPOST_SKIP(python.string() + " cannot import transformers (run scripts/setup.sh)");
  }
  const fs::path wd = fs::temp_directory_path() / ("mmpost_rt_" + std::to_string(::getpid()));
  const fs::path log = fs::temp_directory_path() / ("mmpost_rt_" + std::to_string(::getpid()) + ".log");
  std::string cmd = python.string() + " " + (root / "scripts/golden/check_roundtrip.py").string() +
                    " --mmpost " + MMPOST_BINARY + " --workdir " + wd.string() + " > " +
                    log.string() + " 2>&1";
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

TEST_CASE("LoRA adapters saved by mmpost sft load with PEFT onto the transformers model with the "
          "same logits, merge_on_save writes the merged model", "[e2e][hf]") {
  const fs::path root = MMPOST_SOURCE_DIR;
  const fs::path python = root / ".venv" / "bin" / "python";
  if (std::system((python.string() + " -c 'import transformers, peft' > /dev/null 2>&1").c_str()) != 0) {
    MMPOST_SKIP(python.string() + " cannot import transformers and peft (run scripts/setup.sh)");
  }
  const fs::path wd = fs::temp_directory_path() / ("mmpost_lora_" + std::to_string(::getpid()));
  const fs::path log = wd.string() + ".log";
  std::string cmd = python.string() + " " + (root / "scripts/golden/check_roundtrip.py").string() +
                    " --lora --mmpost " + MMPOST_BINARY + " --workdir " + wd.string() + " > " +
                    log.string() + " 2>&1";
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
