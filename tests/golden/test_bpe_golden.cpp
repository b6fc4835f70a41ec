// mmpost's byte-level BPE against Hugging Face `tokenizers` (fixture written by
// scripts/golden/make_bpe_fixture.py): four families (GPT-2 ByteLevel, SmolLM2's Digits +
// ByteLevel, Llama-3's Split regex + ByteLevel without regex with ignore_merges, Qwen2's NFC +
// Split regex + ByteLevel) on hostile strings. Ids must be identical and decode(encode(x)) == x
// (NFC(x) for Qwen2).
#include <filesystem>
#include <cstdlib>
#include <fstream>
#include <iostream>

#include "catch.h"
#include "mmpost/core/check.h"
#include "mmpost/data/bpe.h"
#include "mmpost/data/tokenizer.h"
#include "test_util.h"

namespace golden_test_bpe_golden {

using namespace mmpost;
using namespace mmpost::data;
namespace fs = std::filesystem;

namespace {
const fs::path kDir = fs::path(MMPOST_SOURCE_DIR) / "tests/golden/fixtures/bpe";

nlohmann::json read_json(const fs::path& p) {
  std::ifstream f(p);
  REQUIRE(f.good());
  return nlohmann::json::parse(f);
}
}  // namespace

TEST_CASE("byte-level BPE ids equal tokenizers' on hostile strings, three pre-tokenizer families",
          "[golden][data]") {
  const auto e = read_json(kDir / "expected.json");
  for (const char* kind : {"gpt2", "smollm", "llama3", "qwen2"}) {
    SECTION(kind) {
      const auto j = read_json(kDir / kind / "tokenizer.json");
      ByteLevelBpe bpe(j, std::string(kind) + "/tokenizer.json");
      int checked = 0;
      for (size_t i = 0; i < e["texts"].size(); ++i) {
        const auto text = e["texts"][i].get<std::string>();
        const auto& row = e["tokenizers_"][kind][i];
        const auto ids = bpe.encode(text);
        INFO(kind << " text " << i << ": " << text << "\n  pieces (tokenizers): " << row["pieces"].dump());
        // decode(encode(x)) == x, or NFC(x) for Qwen2's NFC normalizer, as tokenizers decodes.
        CHECK(bpe.decode(ids) == row["decoded"].get<std::string>());
        if (std::string(kind) != "qwen2") CHECK(bpe.decode(ids) == text);
        // Texts with special tokens typed inside are split by data::Tokenizer, not here.
        if (text.find("<|im_") != std::string::npos) continue;
        CHECK(ids == row["ids"].get<std::vector<int64_t>>());
        ++checked;
      }
      CHECK(checked >= 15);
    }
  }
}

TEST_CASE("byte-level BPE refuses tokenizer.json settings it does not reproduce, by name",
          "[unit][data]") {
  auto j = read_json(kDir / "gpt2/tokenizer.json");
  auto refusal = [](const nlohmann::json& t) {
    try {
      ByteLevelBpe b(t, "tokenizer.json");
    } catch (const Error& err) {
      return std::string(err.what());
    }
    return std::string();
  };
  CHECK(refusal(j).empty());
  auto n = j;
  n["normalizer"] = {{"type", "NFKC"}};
  CHECK_THAT(refusal(n), Catch::Matchers::Contains("tokenizer.json: normalizer.type: NFKC is not reproduced"));
  auto p = j;
  p["pre_tokenizer"] = {{"type", "Whitespace"}};
  CHECK_THAT(refusal(p), Catch::Matchers::Contains("pre_tokenizer.type: Whitespace is not reproduced"));
  auto m = j;
  m["model"]["byte_fallback"] = true;
  CHECK_THAT(refusal(m), Catch::Matchers::Contains("model.byte_fallback: true is not reproduced"));
  auto d = j;
  d["decoder"] = nullptr;
  CHECK_THAT(refusal(d), Catch::Matchers::Contains("decoder.type: null is not reproduced"));
}

TEST_CASE("data::Tokenizer over tokenizer.json: special tokens typed in text split out as "
          "tokenizers does", "[golden][data]") {
  const auto e = read_json(kDir / "expected.json");
  for (const char* kind : {"gpt2", "smollm", "llama3", "qwen2"}) {
    Tokenizer tok((kDir / kind / "tokenizer.json").string());
    CHECK(tok.kind() == "bpe");
    CHECK(tok.piece_to_id("<|im_start|>") == 1);
    for (size_t i = 0; i < e["texts"].size(); ++i) {
      const auto text = e["texts"][i].get<std::string>();
      INFO(kind << " text " << i << ": " << text);
      const auto ids = tok.encode(text);
      CHECK(ids == e["tokenizers_"][kind][i]["ids"].get<std::vector<int64_t>>());
      // Specials print as their text; Qwen2's NFC normalizer composes (as tokenizers decodes).
      CHECK(tok.decode(ids) == e["tokenizers_"][kind][i]["decoded"].get<std::string>());
    }
  }
}

// Run by tests/golden/smollm2_parity.sh, which writes the expected ids with `tokenizers`.
TEST_CASE("byte-level BPE on the real SmolLM2-135M tokenizer (needs MMPOST_SMOLLM2_DIR and "
          "MMPOST_SMOLLM2_EXPECTED)", "[golden][data][smollm2]") {
  const char* dir = std::getenv("MMPOST_SMOLLM2_DIR");
  const char* expected = std::getenv("MMPOST_SMOLLM2_EXPECTED");
  if (dir == nullptr || expected == nullptr) {
    MMPOST_SKIP("MMPOST_SMOLLM2_DIR / MMPOST_SMOLLM2_EXPECTED not set (scripts/get_smollm2.py "
                "makes the folder)");
  }
  Tokenizer tok((fs::path(dir) / "tokenizer.json").string());
  const auto e = read_json(expected);
  int64_t n_ids = 0;
  for (size_t i = 0; i < e["texts"].size(); ++i) {
    const auto text = e["texts"][i].get<std::string>();
    const auto ids = tok.encode(text);
    INFO("text " << i << ": " << text.substr(0, 200));
    CHECK(ids == e["ids"][i].get<std::vector<int64_t>>());
    CHECK(tok.decode(ids) == text);
    n_ids += static_cast<int64_t>(ids.size());
  }
  std::cout << "smollm2 tokenizer parity: " << e["texts"].size() << " texts, "
            << e["bytes"].get<int64_t>() << " bytes, " << n_ids << " ids\n";
}

}  // namespace golden_test_bpe_golden
