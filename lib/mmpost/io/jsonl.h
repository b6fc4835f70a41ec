// Line-numbered JSONL: a reader that reports malformed lines as records carrying a
// "path:line: ..." message (so datasets choose error-vs-skip) and an append-and-flush writer for
// metrics.jsonl and predictions. Line numbers are 1-based physical lines, blank lines included.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace mmpost::io {

/// "path:line", the prefix of every data error message (e.g. "data/train.jsonl:143"); the file
/// registered with set_stdin_spool reads "<stdin>:143".
std::string location(const std::filesystem::path& path, int64_t line);

/// Registers `file` as standard input copied to disk by the CLI (`--data -`): errors name it
/// "<stdin>" and relative paths inside it (images) resolve against the current folder.
void set_stdin_spool(const std::filesystem::path& file);
/// The name errors use for `path`: "<stdin>" for the spool, else the path itself.
std::string display_name(const std::filesystem::path& path);
/// The folder relative paths inside the JSONL `path` resolve against: its parent folder, or the
/// current folder for the stdin spool.
std::filesystem::path relative_base(const std::filesystem::path& path);

/// Reads a whole JSON file that must hold an object (config.json, preprocessor_config.json, ...).
/// Throws Error(kUsage) "PATH: cannot open", "PATH: invalid JSON: ..." or "PATH: expected a JSON
/// object".
nlohmann::json read_json_object_file(const std::filesystem::path& path);

/// One non-blank line of a JSONL file.
struct JsonlRecord {
  nlohmann::json value;  ///< the parsed object (null when `error` is set)
  int64_t line = 0;      ///< 1-based physical line number
  std::string error;     ///< non-empty if the line is malformed: "path:line: malformed JSON: ..."
                         ///< or "path:line: expected a JSON object, got <type>"
};

/// Streams the records of a JSONL file. Blank (whitespace-only) lines are skipped but counted;
/// CRLF line ends and a UTF-8 byte order mark on line 1 are accepted.
class JsonlReader {
 public:
  /// Opens `path`. Throws mmpost::Error (kData) naming the path if it is missing, a folder or
  /// unreadable.
  explicit JsonlReader(const std::filesystem::path& path);
  /// Reads the next non-blank line into `out`; false at the end of the file. Malformed lines do
  /// not throw (see JsonlRecord::error); a read error (EIO) throws mmpost::Error (kRuntime).
  bool next(JsonlRecord& out);
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  std::ifstream in_;
  int64_t line_ = 0;
};

/// Writes one JSON object per line, each written through to the OS at once (a crash loses at most
/// the line being written). Opens in append mode by default (metrics.jsonl continues on resume).
class JsonlWriter {
 public:
  enum class Mode { kAppend, kTruncate };
  /// Opens or creates `path` ("-": standard output). Throws mmpost::Error (kRuntime) naming the file on failure.
  explicit JsonlWriter(const std::filesystem::path& path, Mode mode = Mode::kAppend);
  ~JsonlWriter();
  JsonlWriter(const JsonlWriter&) = delete;
  JsonlWriter& operator=(const JsonlWriter&) = delete;
  /// Appends `object` + "\n". Invalid UTF-8 in strings is replaced by U+FFFD. Throws
  /// mmpost::Error (kUsage) if `object` is not an object, (kRuntime) naming the file on a write
  /// error such as a full disk.
  void write(const nlohmann::json& object);
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  int fd_ = -1;
};

}  // namespace mmpost::io
