// Crash-safe file writes: bytes go to "<file>.tmp.<pid>", then fsync, rename over the target and
// fsync of the folder, so readers see either the old file or the complete new one, never a torn
// one. Used by the safetensors writer, checkpoint text files (state.json, DONE) and index files.
#pragma once

#include <cstddef>
#include <filesystem>

namespace mmpost::io {

/// One atomic write in progress. Write bytes with write(), then commit(); destroying an
/// uncommitted AtomicFile (e.g. during exception unwinding) removes the temp file.
/// Not thread-safe; two AtomicFiles for the same target in one process would share a temp name.
class AtomicFile {
 public:
  /// Creates "<file>.tmp.<pid>" next to `file`.
  /// Throws mmpost::Error (kRuntime) naming `file` if the temp file cannot be created.
  explicit AtomicFile(std::filesystem::path file);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  /// Appends `n` bytes. Throws mmpost::Error (kRuntime) naming the file on a write error
  /// (disk full, quota, file size limit, I/O error); the temp file is removed first.
  void write(const void* data, size_t n);
  /// fsyncs, closes and renames the temp file over the target, then fsyncs the folder
  /// (best effort). Throws mmpost::Error (kRuntime) naming the file; the temp file is removed.
  void commit();

  /// The target path.
  const std::filesystem::path& path() const { return file_; }
  /// The temp path ("<file>.tmp.<pid>").
  const std::filesystem::path& temp_path() const { return temp_; }

 private:
  [[noreturn]] void fail(const char* what, int err);
  void discard();

  std::filesystem::path file_;
  std::filesystem::path temp_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace mmpost::io
