// Tests for hub/hf_folder: loading an HF model folder checks that config.json describes the
// stored weights before allocating the model.
#include <filesystem>
#include <fstream>

#include "catch.h"
#include "mmpost/hub/hf_folder.h"
#include "test_util.h"

namespace unit_test_hub {

namespace fs = std::filesystem;

using mmpost::testing::TempDir;

TEST_CASE("load_pretrained refuses a config that does not describe the stored weights",
          "[unit][hub]") {
  // A config.json without its sub-configs falls back to HF's LLaVA-7B defaults; the folder's
  // weights hold ~0.1M parameters, so loading must fail before allocating 7B.
  TempDir dir("cfg_mismatch");
  const fs::path src = fs::path(MMPOST_SOURCE_DIR) / "tests/golden/fixtures/llava_tiny";
  for (const auto& e : fs::directory_iterator(src)) fs::copy(e.path(), dir.path / e.path().filename());
  REQUIRE_NOTHROW(mmpost::hub::load_pretrained(dir.path));
  std::ofstream(dir.path / "config.json", std::ios::trunc) << R"({"model_type": "llava"})";
  CHECK_THROWS_WITH(mmpost::hub::load_pretrained(dir.path),
                    HasSubstr("config.json: describes a model of about") &&
                        HasSubstr("vision_config and text_config"));
}

}  // namespace unit_test_hub
