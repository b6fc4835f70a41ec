// Strict, declarative JSON <-> struct mapping for recipes. A config struct lists its fields once
// in `template <class V> void visit(V& v)` as v("name", field, "doc"); the visitors below read
// JSON (unknown keys and wrong types are errors naming the JSON path), write JSON, and print help.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "mmpost/core/check.h"

namespace mmpost::config {

/// A struct is a section when it has a visit() member.
template <class T, class V>
concept Section = requires(T& t, V& v) { t.visit(v); };

/// Short JSON type name for error messages ("number", "string", ...).
std::string json_type_name(const nlohmann::json& j);
/// Closest key of `valid` to `key` by edit distance (empty if none is close).
std::string closest_key(const std::string& key, const std::vector<std::string>& valid);

/// Reads a JSON object into a section; throws Error(kUsage) "SOURCE: a.b.c: message".
class JsonReader {
 public:
  JsonReader(const nlohmann::json& j, std::string source, std::string path)
      : j_(j), source_(std::move(source)), path_(std::move(path)) {}

  template <class T>
  void operator()(const char* name, T& field, const char* /*doc*/) {
    seen_.emplace_back(name);
    if (!j_.contains(name)) return;
    const auto& v = j_.at(name);
    std::string path = path_.empty() ? name : path_ + "." + name;
    if constexpr (Section<T, JsonReader>) {
      read_section(v, field, path);
    } else {
      read_value(v, field, path);
    }
  }

  /// Throws for keys of the object that no field claimed.
  void finish() const;

  /// Reads `j` into `section`, checking that it is an object.
  template <class T>
  void read_section(const nlohmann::json& j, T& section, const std::string& path) {
    if (!j.is_object()) fail(path, "expected an object, got " + json_type_name(j));
    JsonReader sub(j, source_, path);
    section.visit(sub);
    sub.finish();
  }

 private:
  [[noreturn]] void fail(const std::string& path, const std::string& msg,
                         const std::string& hint = "") const;
  void read_value(const nlohmann::json& v, int64_t& f, const std::string& path);
  void read_value(const nlohmann::json& v, double& f, const std::string& path);
  void read_value(const nlohmann::json& v, bool& f, const std::string& path);
  void read_value(const nlohmann::json& v, std::string& f, const std::string& path);
  void read_value(const nlohmann::json& v, std::vector<double>& f, const std::string& path);
  void read_value(const nlohmann::json& v, std::vector<std::string>& f, const std::string& path);
  void read_value(const nlohmann::json& v, nlohmann::json& f, const std::string& path) { f = v; }

  const nlohmann::json& j_;
  std::string source_;
  std::string path_;
  std::vector<std::string> seen_;
};

/// Writes a section to JSON (every field, defaults included).
class JsonWriter {
 public:
  explicit JsonWriter(nlohmann::json& out) : out_(out) {}
  template <class T>
  void operator()(const char* name, const T& field, const char* /*doc*/) {
    if constexpr (Section<T, JsonWriter>) {
      nlohmann::json sub = nlohmann::json::object();
      JsonWriter w(sub);
      const_cast<T&>(field).visit(w);
      out_[name] = sub;
    } else {
      out_[name] = field;
    }
  }

 private:
  nlohmann::json& out_;
};

/// Collects "path  default  doc" rows for --help and the resolved-recipe table.
class TableWriter {
 public:
  struct Row {
    std::string path, value, doc;
  };
  explicit TableWriter(std::vector<Row>& rows, std::string prefix = "")
      : rows_(rows), prefix_(std::move(prefix)) {}
  template <class T>
  void operator()(const char* name, const T& field, const char* doc) {
    std::string path = prefix_.empty() ? name : prefix_ + "." + name;
    if constexpr (Section<T, TableWriter>) {
      TableWriter sub(rows_, path);
      const_cast<T&>(field).visit(sub);
    } else {
      rows_.push_back({path, nlohmann::json(field).dump(), doc});
    }
  }

 private:
  std::vector<Row>& rows_;
  std::string prefix_;
};

/// Parses a recipe struct from JSON strictly. `source` names the file in errors.
template <class T>
T from_json(const nlohmann::json& j, const std::string& source) {
  T out;
  JsonReader reader(j, source, "");
  reader.read_section(j, out, "");
  return out;
}

/// Serializes a recipe struct with every field.
template <class T>
nlohmann::json to_json(const T& cfg) {
  nlohmann::json out = nlohmann::json::object();
  JsonWriter w(out);
  const_cast<T&>(cfg).visit(w);
  return out;
}

/// Rows of (path, value, doc) for a recipe struct, in declaration order.
template <class T>
std::vector<TableWriter::Row> to_rows(const T& cfg) {
  std::vector<TableWriter::Row> rows;
  TableWriter w(rows);
  const_cast<T&>(cfg).visit(w);
  return rows;
}

/// Reads a JSON file; throws Error(kUsage) naming the file and the parse position.
nlohmann::json read_json_file(const std::string& path);

/// Applies "a.b.c=value" to `j` (value parsed as JSON, else taken as a string). Intermediate
/// objects are created; the strict reader later rejects unknown paths. Throws on a missing '='.
void apply_override(nlohmann::json& j, const std::string& assignment);

/// Formats rows as an aligned table: path, value and, with `with_docs`, "# description".
std::string format_table(const std::vector<TableWriter::Row>& rows, bool with_docs = false);

}  // namespace mmpost::config
