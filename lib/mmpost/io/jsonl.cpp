// Line-numbered JSONL reader and flushing writer (see jsonl.h). The writer uses a POSIX fd with
// O_APPEND so each line goes out in one write() and errors carry errno (ENOSPC, EIO).
#include "mmpost/io/jsonl.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>

#include "mmpost/core/check.h"

namespace mmpost::io {

namespace fs = std::filesystem;

namespace {
fs::path& stdin_spool() {
  static fs::path p;
  return p;
}
}  // namespace

void set_stdin_spool(const fs::path& file) { stdin_spool() = file; }

std::string display_name(const fs::path& path) {
  return !stdin_spool().empty() && path == stdin_spool() ? "<stdin>" : path.string();
}

fs::path relative_base(const fs::path& path) {
  return !stdin_spool().empty() && path == stdin_spool() ? fs::path() : path.parent_path();
}

nlohmann::json read_json_object_file(const fs::path& path) {
  std::ifstream in(path);
  MMPOST_CHECK_USAGE(in.good(), path.string(), ": cannot open");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(ErrorKind::kUsage, path.string() + ": invalid JSON: " + e.what());
  }
  MMPOST_CHECK_USAGE(j.is_object(), path.string(), ": expected a JSON object");
  return j;
}

std::string location(const fs::path& path, int64_t line) {
  return display_name(path) + ":" + std::to_string(line);
}

JsonlReader::JsonlReader(const fs::path& path) : path_(path) {
  std::error_code ec;
  MMPOST_CHECK_DATA(fs::exists(path, ec), path.string(), ": no such file");
  MMPOST_CHECK_DATA(!fs::is_directory(path, ec), path.string(),
                    ": is a folder, expected a JSONL file");
  in_.open(path, std::ios::binary);
  MMPOST_CHECK_DATA(in_.is_open(), path.string(), ": cannot open: ", std::strerror(errno));
}

bool JsonlReader::next(JsonlRecord& out) {
  std::string text;
  while (std::getline(in_, text)) {
    ++line_;
    if (line_ == 1 && text.rfind("\xEF\xBB\xBF", 0) == 0) text.erase(0, 3);
    if (!text.empty() && text.back() == '\r') text.pop_back();
    if (text.find_first_not_of(" \t\r\f\v") == std::string::npos) continue;
    out = JsonlRecord{};
    out.line = line_;
    try {
      out.value = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      out.value = nullptr;
      out.error = location(path_, line_) + ": malformed JSON: " + e.what();
      return true;
    }
    if (!out.value.is_object()) {
      out.error = location(path_, line_) + ": expected a JSON object, got " +
                  out.value.type_name();
      out.value = nullptr;
    }
    return true;
  }
  MMPOST_CHECK(!in_.bad(), location(path_, line_ + 1), ": read error");
  return false;
}

JsonlWriter::JsonlWriter(const fs::path& path, Mode mode) : path_(path) {
  if (path == "-") {  // standard output, sharing its offset with std::cout
    std::cout.flush();
    fd_ = ::dup(STDOUT_FILENO);
    MMPOST_CHECK(fd_ >= 0, "stdout: cannot write: ", std::strerror(errno));
    return;
  }
  int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (mode == Mode::kAppend ? O_APPEND : O_TRUNC);
  fd_ = ::open(path.c_str(), flags, 0644);
  MMPOST_CHECK(fd_ >= 0, path.string(), ": cannot open for writing: ", std::strerror(errno));
}

JsonlWriter::~JsonlWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void JsonlWriter::write(const nlohmann::json& object) {
  MMPOST_CHECK_USAGE(object.is_object(), path_.string(),
                     ": JsonlWriter::write expects an object, got ", object.type_name());
  std::string text = object.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  const char* p = text.data();
  size_t n = text.size();
  while (n > 0) {
    ssize_t w = ::write(fd_, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      int err = w < 0 ? errno : EIO;
      throw Error(ErrorKind::kRuntime, path_.string() + ": write failed: " + std::strerror(err),
                  err == ENOSPC || err == EDQUOT ? "the disk is full: free space" : "");
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

}  // namespace mmpost::io
