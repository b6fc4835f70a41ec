// Error type and MMPOST_CHECK: user, data and I/O problems become mmpost::Error carrying the
// source location of the check, a message naming the file/line/JSON path, and an optional hint.
// Tensor invariants use TORCH_CHECK instead (see ARCHITECTURE.md, "Boundaries").
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace mmpost {

/// What kind of problem an Error reports; main.cpp maps it to an exit code
/// (kUsage -> 2, kData -> 3, kRuntime -> 1).
enum class ErrorKind { kRuntime, kUsage, kData };

/// The one exception type library code throws for problems a user can fix.
/// `what()` is the message followed by "\n  hint: ..." when a hint was given.
class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message, const std::string& hint = "")
      : std::runtime_error(hint.empty() ? message : message + "\n  hint: " + hint),
        kind_(kind), message_(message), hint_(hint) {}
  ErrorKind kind() const { return kind_; }
  const std::string& message() const { return message_; }
  const std::string& hint() const { return hint_; }

 private:
  ErrorKind kind_;
  std::string message_;
  std::string hint_;
};

namespace detail {
/// Concatenates any streamable arguments into one string.
template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

/// Throws Error(kind, message, hint) unless `cond` holds.
inline void check(bool cond, ErrorKind kind, const std::string& message,
                  const std::string& hint = "") {
  if (!cond) throw Error(kind, message, hint);
}

}  // namespace mmpost

/// MMPOST_CHECK(cond, msg...): runtime error (exit 1) built from the streamed pieces of msg.
#define MMPOST_CHECK(cond, ...)                                                      \
  do {                                                                               \
    if (!(cond)) throw ::mmpost::Error(::mmpost::ErrorKind::kRuntime,                \
                                       ::mmpost::detail::cat(__VA_ARGS__));          \
  } while (0)

/// MMPOST_CHECK_USAGE: bad flag or recipe (exit 2).
#define MMPOST_CHECK_USAGE(cond, ...)                                                \
  do {                                                                               \
    if (!(cond)) throw ::mmpost::Error(::mmpost::ErrorKind::kUsage,                  \
                                       ::mmpost::detail::cat(__VA_ARGS__));          \
  } while (0)

/// MMPOST_CHECK_DATA: bad input data (exit 3).
#define MMPOST_CHECK_DATA(cond, ...)                                                 \
  do {                                                                               \
    if (!(cond)) throw ::mmpost::Error(::mmpost::ErrorKind::kData,                   \
                                       ::mmpost::detail::cat(__VA_ARGS__));          \
  } while (0)
