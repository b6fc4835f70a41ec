// One name table per enum: a recipe string <-> enum value table that its parser, its error
// message ("valid values: ...") and its help text all read, so the three cannot drift apart.
// Usage: `constexpr std::pair<Mode, const char*> kModeNames[] = {{Mode::kA, "a"}, ...};`
#pragma once

#include <string>
#include <utility>

#include "mmpost/core/check.h"

namespace mmpost {

/// The names of `table` joined by `sep` ("a, b, c" or "a | b | c" for help text).
template <typename E, size_t N>
std::string names_of(const std::pair<E, const char*> (&table)[N], const char* sep = ", ") {
  std::string s;
  for (const auto& [e, n] : table) s += (s.empty() ? "" : sep) + std::string(n);
  return s;
}

/// The enum value named `name`. Throws Error(kUsage) "`what`: unknown value 'name'" with the
/// valid names as hint (`what` is the recipe key, e.g. "rlhf.algorithm").
template <typename E, size_t N>
E parse_name(const std::pair<E, const char*> (&table)[N], const std::string& name,
             const std::string& what) {
  for (const auto& [e, n] : table) {
    if (name == n) return e;
  }
  throw Error(ErrorKind::kUsage, what + ": unknown value '" + name + "'",
              "valid values: " + names_of(table));
}

/// The name of `value` (every enum value must be in its table).
template <typename E, size_t N>
std::string name_of(const std::pair<E, const char*> (&table)[N], E value) {
  for (const auto& [e, n] : table) {
    if (e == value) return n;
  }
  throw Error(ErrorKind::kRuntime, "enum value missing from its name table");
}

}  // namespace mmpost
