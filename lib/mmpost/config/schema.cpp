// Strict recipe parsing helpers (see schema.h).
#include "mmpost/config/schema.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace mmpost::config {

std::string json_type_name(const nlohmann::json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null: return "null";
    case nlohmann::json::value_t::object: return "an object";
    case nlohmann::json::value_t::array: return "an array";
    case nlohmann::json::value_t::string: return "a string (" + j.dump() + ")";
    case nlohmann::json::value_t::boolean: return "a boolean (" + j.dump() + ")";
    case nlohmann::json::value_t::number_float: return "a float (" + j.dump() + ")";
    default:
      if (j.is_number()) return "a number (" + j.dump() + ")";
      return "a value";
  }
}

std::string closest_key(const std::string& key, const std::vector<std::string>& valid) {
  std::string best;
  size_t best_d = std::max<size_t>(2, key.size() / 3) + 1;
  for (const auto& cand : valid) {
    std::vector<size_t> prev(cand.size() + 1), cur(cand.size() + 1);
    for (size_t j = 0; j <= cand.size(); ++j) prev[j] = j;
    for (size_t i = 1; i <= key.size(); ++i) {
      cur[0] = i;
      for (size_t j = 1; j <= cand.size(); ++j) {
        cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1,
                           prev[j - 1] + (key[i - 1] == cand[j - 1] ? 0 : 1)});
      }
      std::swap(prev, cur);
    }
    if (prev[cand.size()] < best_d) {
      best_d = prev[cand.size()];
      best = cand;
    }
  }
  return best;
}

void JsonReader::fail(const std::string& path, const std::string& msg,
                      const std::string& hint) const {
  throw Error(ErrorKind::kUsage, source_ + ": " + (path.empty() ? "(top level)" : path) + ": " + msg,
              hint);
}

void JsonReader::finish() const {
  for (auto it = j_.begin(); it != j_.end(); ++it) {
    if (std::find(seen_.begin(), seen_.end(), it.key()) != seen_.end()) continue;
    std::string path = path_.empty() ? it.key() : path_ + "." + it.key();
    std::string valid;
    for (const auto& s : seen_) valid += (valid.empty() ? "" : ", ") + s;
    std::string near = closest_key(it.key(), seen_);
    fail(path, "unknown key" + (near.empty() ? "" : " (did you mean \"" + near + "\"?)"),
         "valid keys here: " + valid);
  }
}

void JsonReader::read_value(const nlohmann::json& v, int64_t& f, const std::string& path) {
  if (v.is_number_integer()) {
    f = v.get<int64_t>();
  } else if (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>() &&
             std::abs(v.get<double>()) < 9e15) {
    f = static_cast<int64_t>(v.get<double>());
  } else {
    fail(path, "expected an integer, got " + json_type_name(v));
  }
}

void JsonReader::read_value(const nlohmann::json& v, double& f, const std::string& path) {
  if (!v.is_number()) fail(path, "expected a number, got " + json_type_name(v));
  f = v.get<double>();
  if (!std::isfinite(f)) fail(path, "expected a finite number");
}

void JsonReader::read_value(const nlohmann::json& v, bool& f, const std::string& path) {
  if (!v.is_boolean()) fail(path, "expected true or false, got " + json_type_name(v));
  f = v.get<bool>();
}

void JsonReader::read_value(const nlohmann::json& v, std::string& f, const std::string& path) {
  if (!v.is_string()) fail(path, "expected a string, got " + json_type_name(v));
  f = v.get<std::string>();
}

void JsonReader::read_value(const nlohmann::json& v, std::vector<double>& f,
                            const std::string& path) {
  if (!v.is_array()) fail(path, "expected an array of numbers, got " + json_type_name(v));
  f.clear();
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_number()) {
      fail(path + "[" + std::to_string(i) + "]", "expected a number, got " + json_type_name(v[i]));
    }
    f.push_back(v[i].get<double>());
  }
}

void JsonReader::read_value(const nlohmann::json& v, std::vector<std::string>& f,
                            const std::string& path) {
  if (v.is_string()) {  // "sigmoid" == ["sigmoid"], as TRL accepts for loss_type
    f = {v.get<std::string>()};
    return;
  }
  if (!v.is_array()) fail(path, "expected an array of strings, got " + json_type_name(v));
  f.clear();
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_string()) {
      fail(path + "[" + std::to_string(i) + "]", "expected a string, got " + json_type_name(v[i]));
    }
    f.push_back(v[i].get<std::string>());
  }
}

nlohmann::json read_json_file(const std::string& path) {
  std::error_code ec;
  MMPOST_CHECK_USAGE(!std::filesystem::is_directory(path, ec), path,
                     ": is a folder, not a JSON file");
  std::ifstream in(path);
  MMPOST_CHECK_USAGE(in.good(), path, ": cannot open file");
  try {
    return nlohmann::json::parse(in, /*cb=*/nullptr, /*allow_exceptions=*/true,
                                 /*ignore_comments=*/true);
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(ErrorKind::kUsage, path + ": invalid JSON: " + e.what());
  }
}

void apply_override(nlohmann::json& j, const std::string& assignment) {
  auto eq = assignment.find('=');
  MMPOST_CHECK_USAGE(eq != std::string::npos && eq > 0, "--set \"", assignment,
                     "\": expected key=value (e.g. optim.lr=1e-4)");
  std::string key = assignment.substr(0, eq);
  std::string raw = assignment.substr(eq + 1);
  nlohmann::json value;
  try {
    value = nlohmann::json::parse(raw);
  } catch (const nlohmann::json::parse_error&) {
    value = raw;  // bare strings need no quotes: --set device=cpu
  }
  nlohmann::json* node = &j;
  std::stringstream ss(key);
  std::string part;
  std::vector<std::string> parts;
  while (std::getline(ss, part, '.')) parts.push_back(part);
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    nlohmann::json& next = (*node)[parts[i]];
    if (next.is_null()) next = nlohmann::json::object();
    MMPOST_CHECK_USAGE(next.is_object(), "--set ", key, ": ", parts[i], " is not a section");
    node = &next;
  }
  (*node)[parts.back()] = value;
}

std::string format_table(const std::vector<TableWriter::Row>& rows, bool with_docs) {
  size_t w = 0, wv = 0;
  for (const auto& r : rows) w = std::max(w, r.path.size());
  for (const auto& r : rows) wv = std::max(wv, std::min<size_t>(r.value.size(), 28));
  std::ostringstream os;
  for (const auto& r : rows) {
    os << "  " << r.path << std::string(w - r.path.size() + 2, ' ') << r.value;
    if (with_docs && !r.doc.empty()) {
      // Long values (inline configs) push their description onto the next line.
      if (r.value.size() > wv) os << "\n  " << std::string(w + 2, ' ') << std::string(wv, ' ');
      else os << std::string(wv - r.value.size(), ' ');
      os << "  # " << r.doc;
    }
    os << "\n";
  }
  return os.str();
}

}  // namespace mmpost::config
