// Shared test helpers: a self-removing temporary folder and whole-file reads.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <iostream>

#include "mmpost/model/config.h"

/// Reports the running test as skipped with `reason` (an optional dependency is missing): prints
/// "MMPOST_SKIPPED: reason", which CTest's SKIP_REGULAR_EXPRESSION turns into "Skipped" (Catch2
/// v2 has no skip), and under Catch2 v3 also SKIP()s. Use it as a statement that ends the test.
#if defined(MMPOST_CATCH3)
#define MMPOST_SKIP(reason)                                            \
  do {                                                                 \
    std::cout << "MMPOST_SKIPPED: " << reason << std::endl;            \
    SKIP(reason);                                                      \
  } while (0)
#else
#define MMPOST_SKIP(reason)                                            \
  do {                                                                 \
    std::cout << "MMPOST_SKIPPED: " << reason << std::endl;            \
    return;                                                            \
  } while (0)
#endif

namespace mmpost::testing {

/// A fresh folder under the system temp dir, removed (recursively) on destruction.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& tag = "test") {
    static int counter = 0;
    path = std::filesystem::temp_directory_path() /
           ("mmpost_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(++counter));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

/// The bytes of a file as a string ("" if it cannot be opened).
/// tests/golden/fixtures/ of the source tree.
inline const std::filesystem::path kGoldenFixtures =
    std::filesystem::path(MMPOST_SOURCE_DIR) / "tests/golden/fixtures";

/// Parses a JSON file (the test fails via the exception when it cannot).
inline nlohmann::json read_json_file(const std::filesystem::path& file) {
  std::ifstream f(file);
  if (!f.good()) throw std::runtime_error(file.string() + ": cannot open");
  return nlohmann::json::parse(f);
}

inline std::string read_all(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// Result of one CLI run.
struct CliResult {
  int code;  // exit status (-1 if killed by a signal)
  std::string out, err;
};

/// Runs the mmpost binary (MMPOST_BINARY) from the repo root with `args`; stdout and stderr are
/// captured through files in `tmp` (created if needed).
inline CliResult run_cli(const std::string& args, const std::filesystem::path& tmp) {
  std::filesystem::create_directories(tmp);
  std::string cmd = std::string("cd ") + MMPOST_SOURCE_DIR + " && " + MMPOST_BINARY + " " + args +
                    " > " + (tmp / "stdout.txt").string() + " 2> " + (tmp / "stderr.txt").string();
  int status = std::system(cmd.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, read_all(tmp / "stdout.txt"),
          read_all(tmp / "stderr.txt")};
}

/// A tiny LLaVA config for unit tests: CLIP 16x16 images in 8x8 patches (C 16, 1 layer), Llama
/// C 32, 1 layer, GQA 4:2, head_dim 8, 64 positions; `vocab` tokens, <image> = `image_token`.
inline model::VlmConfig tiny_vlm_config(int64_t vocab, int64_t image_token) {
  model::VlmConfig c;
  c.vision_config = {.hidden_size = 16, .intermediate_size = 32, .num_hidden_layers = 1,
                     .num_attention_heads = 2, .image_size = 16, .patch_size = 8};
  c.text_config.vocab_size = vocab;
  c.text_config.hidden_size = 32;
  c.text_config.intermediate_size = 48;
  c.text_config.num_hidden_layers = 1;
  c.text_config.num_attention_heads = 4;
  c.text_config.num_key_value_heads = 2;
  c.text_config.head_dim = 8;
  c.text_config.max_position_embeddings = 64;
  c.image_token_index = image_token;
  return c;
}

/// Tiny LLaVA for model-level tests: image 32 / patch 8 -> 16 patches, 2 vision layers (LLaVA's
/// default vision_feature_layer -2 runs the first), `text_layers` decoder layers, GQA 4:2,
/// vocabulary 64 with <image> = 63.
inline model::VlmConfig tiny_llava_config(int64_t text_layers = 2, bool tie = false) {
  model::VlmConfig c;
  c.vision_config = {.hidden_size = 16, .intermediate_size = 32, .num_hidden_layers = 2,
                     .num_attention_heads = 2, .image_size = 32, .patch_size = 8};
  c.text_config.vocab_size = 64;
  c.text_config.hidden_size = 32;
  c.text_config.intermediate_size = 48;
  c.text_config.num_hidden_layers = text_layers;
  c.text_config.num_attention_heads = 4;
  c.text_config.num_key_value_heads = 2;
  c.text_config.head_dim = 8;
  c.text_config.max_position_embeddings = 128;
  c.image_token_index = 63;
  c.tie_word_embeddings = tie;
  return c;
}

}  // namespace mmpost::testing
