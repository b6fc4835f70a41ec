// Helpers the end-to-end CLI tests share: metrics rows, a tiny trained start model, digit
// preference pairs. Header-only, in an anonymous namespace per test file.
#pragma once

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "catch.h"
#include "mmpost/io/jsonl.h"
#include "test_util.h"

namespace mmpost::testing {

inline const std::filesystem::path kDigitsDir =
    std::filesystem::path(MMPOST_SOURCE_DIR) / "data/digits-vqa";

/// Training rows (those with "loss") of a metrics.jsonl, in file order ({} when missing).
inline std::vector<nlohmann::json> train_rows(const std::filesystem::path& file) {
  std::vector<nlohmann::json> out;
  if (!std::filesystem::exists(file)) return out;
  io::JsonlReader r(file);
  io::JsonlRecord rec;
  while (r.next(rec)) {
    if (rec.error.empty() && rec.value.contains("loss")) out.push_back(rec.value);
  }
  return out;
}

/// Rows of a metrics.jsonl that hold `key` (e.g. "eval/accuracy"), in file order.
inline std::vector<nlohmann::json> read_lines_with(const std::filesystem::path& p,
                                                   const std::string& key) {
  std::vector<nlohmann::json> out;
  io::JsonlReader r(p);
  io::JsonlRecord rec;
  while (r.next(rec)) {
    if (rec.error.empty() && rec.value.contains(key)) out.push_back(rec.value);
  }
  return out;
}

/// A tiny SFT model folder (one step from random init) at dir/start: the start of dpo, rm and
/// rlhf runs. REQUIREs that the run succeeds.
inline std::filesystem::path tiny_model(const std::filesystem::path& dir) {
  auto out = dir / "start";
  auto r = run_cli("sft -r recipes/tiny/sft-tiny.json --output " + out.string() +
                       " --set data.eval= --set train.max_steps=1",
                   dir / "log_start");
  INFO(r.err);
  REQUIRE(r.code == 0);
  return out;
}

/// dir/prefs.jsonl: the first `n` digit-train records as preference pairs (the right digit chosen,
/// digit + 3 mod 10 rejected), with absolute image paths.
inline std::filesystem::path write_prefs(const std::filesystem::path& dir, int n) {
  io::JsonlReader in(kDigitsDir / "train.jsonl");
  io::JsonlRecord rec;
  auto path = dir / "prefs.jsonl";
  std::ofstream out(path);
  for (int i = 0; i < n && in.next(rec); ++i) {
    auto& r = rec.value;
    auto answer = r["messages"][1]["content"].get<std::string>();
    out << nlohmann::json{{"images", {(kDigitsDir / r["images"][0].get<std::string>()).string()}},
                          {"prompt", {r["messages"][0]}},
                          {"chosen", {{{"role", "assistant"}, {"content", answer}}}},
                          {"rejected",
                           {{{"role", "assistant"},
                             {"content", std::to_string((std::stoi(answer) + 3) % 10)}}}}}
                .dump()
        << "\n";
  }
  return path;
}

}  // namespace mmpost::testing
