// Shared test helpers: a self-removing temporary folder and whole-file reads.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

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
inline std::string read_all(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace mmpost::testing
