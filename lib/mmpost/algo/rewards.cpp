// Rule-based rewards (see rewards.h). Text handling is byte-oriented UTF-8: only the digit
// normalization decodes code points. The external scorer is posix_spawn + an unlinked temp file
// for stdin + a pipe for stdout, so neither side can block the other however large the batch.
#include "mmpost/algo/rewards.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <regex>
#include <utility>

#include "mmpost/core/check.h"

extern char** environ;

namespace mmpost::algo {
namespace {

const std::pair<RewardKind, const char*> kRewardKindNames[] = {
    {RewardKind::kExactMatch, "exact_match"},       {RewardKind::kNumericMatch, "numeric_match"},
    {RewardKind::kChoiceMatch, "choice_match"},     {RewardKind::kFormat, "format"},
    {RewardKind::kLengthPenalty, "length_penalty"}, {RewardKind::kExternal, "external"},
};

std::optional<RewardKind> find_kind(const std::string& name) {
  for (const auto& [kind, n] : kRewardKindNames)
    if (name == n) return kind;
  return std::nullopt;
}

// ---- digits -------------------------------------------------------------------------------------

// Code points of '0' in each run of ten Unicode decimal digits (General Category Nd) we map to
// ASCII: Arabic-Indic, Extended Arabic-Indic, NKo, the Brahmic scripts of India and Sri Lanka,
// Thai, Lao, Tibetan, Myanmar, Khmer, Mongolian, Limbu, Tai, Balinese, Sundanese, Lepcha,
// Ol Chiki, Vai, Saurashtra, Kayah Li, Javanese, Cham, Meetei Mayek, fullwidth, Osmanya and the
// five mathematical digit styles. Other Nd runs (rare in model output) are left as they are.
constexpr char32_t kDigitZeros[] = {
    0x0660, 0x06F0, 0x07C0, 0x0966,  0x09E6,  0x0A66,  0x0AE6,  0x0B66,  0x0BE6,  0x0C66, 0x0CE6,
    0x0D66, 0x0DE6, 0x0E50, 0x0ED0,  0x0F20,  0x1040,  0x1090,  0x17E0,  0x1810,  0x1946, 0x19D0,
    0x1A80, 0x1A90, 0x1B50, 0x1BB0,  0x1C40,  0x1C50,  0xA620,  0xA8D0,  0xA900,  0xA9D0, 0xA9F0,
    0xAA50, 0xABF0, 0xFF10, 0x104A0, 0x1D7CE, 0x1D7D8, 0x1D7E2, 0x1D7EC, 0x1D7F6,
};

// Signs and separators that appear next to such digits.
constexpr std::pair<char32_t, char> kPunct[] = {
    {0x2212, '-'},  // MINUS SIGN
    {0xFF0D, '-'},  // FULLWIDTH HYPHEN-MINUS
    {0xFF0E, '.'},  // FULLWIDTH FULL STOP
    {0xFF0C, ','},  // FULLWIDTH COMMA
    {0x066B, '.'},  // ARABIC DECIMAL SEPARATOR
    {0x066C, ','},  // ARABIC THOUSANDS SEPARATOR
};

/// Decodes the UTF-8 sequence at s[i]; returns its length (0 when invalid) and sets `cp`.
size_t decode_utf8(const std::string& s, size_t i, char32_t& cp) {
  const auto b = static_cast<unsigned char>(s[i]);
  size_t len = b < 0x80 ? 1 : (b >> 5) == 0x6 ? 2 : (b >> 4) == 0xE ? 3 : (b >> 3) == 0x1E ? 4 : 0;
  if (len == 0 || i + len > s.size()) return 0;
  cp = len == 1 ? b : len == 2 ? (b & 0x1F) : len == 3 ? (b & 0x0F) : (b & 0x07);
  for (size_t k = 1; k < len; ++k) {
    const auto c = static_cast<unsigned char>(s[i + k]);
    if ((c >> 6) != 0x2) return 0;
    cp = (cp << 6) | (c & 0x3F);
  }
  return len;
}

std::optional<char> ascii_for(char32_t cp) {
  for (char32_t zero : kDigitZeros)
    if (cp >= zero && cp < zero + 10) return static_cast<char>('0' + (cp - zero));
  for (const auto& [from, to] : kPunct)
    if (cp == from) return to;
  return std::nullopt;
}

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
bool is_alnum(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0;
}

/// Length of the number starting at s[i] (a digit, or '.' before a digit), signs excluded.
size_t scan_number(const std::string& s, size_t i) {
  size_t j = i;
  while (j < s.size() && is_digit(s[j])) ++j;
  // Thousands groups ",ddd" only after a 1-3 digit lead and not followed by a fourth digit.
  if (j > i && j - i <= 3) {
    while (j + 3 < s.size() && s[j] == ',' && is_digit(s[j + 1]) && is_digit(s[j + 2]) &&
           is_digit(s[j + 3]) && (j + 4 >= s.size() || !is_digit(s[j + 4])))
      j += 4;
  }
  if (j + 1 < s.size() && s[j] == '.' && is_digit(s[j + 1])) {
    ++j;
    while (j < s.size() && is_digit(s[j])) ++j;
  }
  if (j < s.size() && (s[j] == 'e' || s[j] == 'E')) {
    size_t k = j + 1;
    if (k < s.size() && (s[k] == '+' || s[k] == '-')) ++k;
    if (k < s.size() && is_digit(s[k])) {
      while (k < s.size() && is_digit(s[k])) ++k;
      j = k;
    }
  }
  return j - i;
}

// ---- choices ------------------------------------------------------------------------------------

std::optional<char> valid_letter(char c, const std::string& choices) {
  c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (choices.find(c) != std::string::npos) return c;
  return std::nullopt;
}

// ---- format -------------------------------------------------------------------------------------

// libstdc++'s std::regex matches recursively, one stack frame chain per input character under
// `[\s\S]*?`: about 50k characters overflow an 8 MiB stack. So the default pattern is matched by
// hand (same language, tested against std::regex), and custom patterns only up to this length.
constexpr size_t kMaxRegexInput = 8192;

/// regex_match of kDefaultFormatPattern: starts with <think>, ends with </answer>, and some
/// </think> is followed by optional whitespace and an <answer> that ends before the final tag.
bool matches_default_format(const std::string& s) {
  static const std::string kThinkOpen = "<think>", kThinkClose = "</think>",
                           kAnswerOpen = "<answer>", kAnswerClose = "</answer>";
  if (s.compare(0, kThinkOpen.size(), kThinkOpen) != 0 || s.size() < kAnswerClose.size() ||
      s.compare(s.size() - kAnswerClose.size(), kAnswerClose.size(), kAnswerClose) != 0)
    return false;
  const size_t last = s.size() - kAnswerClose.size();
  for (size_t p = s.find(kThinkClose, kThinkOpen.size()); p != std::string::npos;
       p = s.find(kThinkClose, p + 1)) {
    size_t q = p + kThinkClose.size();
    while (q < s.size() && std::isspace(static_cast<unsigned char>(s[q]))) ++q;
    if (s.compare(q, kAnswerOpen.size(), kAnswerOpen) == 0 && q + kAnswerOpen.size() <= last)
      return true;
  }
  return false;
}

bool format_matches(const std::string& completion, const std::string& pattern,
                    const std::regex& re) {
  if (pattern == kDefaultFormatPattern) return matches_default_format(completion);
  if (completion.size() > kMaxRegexInput) return false;
  return std::regex_match(completion, re);
}

// ---- external -----------------------------------------------------------------------------------

std::string quote_command(const std::string& command) {
  return "`" + (command.size() > 200 ? command.substr(0, 200) + "..." : command) + "`";
}

/// An unlinked, close-on-exec temp file holding `data`, rewound to the start.
int temp_file_with(const std::string& data, const std::string& command) {
  const char* dir = std::getenv("TMPDIR");
  std::string tmpl = std::string(dir && *dir ? dir : "/tmp") + "/mmpost-reward-XXXXXX";
  int fd = mkostemp(tmpl.data(), O_CLOEXEC);
  MMPOST_CHECK(fd >= 0, "external reward ", quote_command(command),
               ": cannot create a temp file in ", tmpl, ": ", std::strerror(errno));
  unlink(tmpl.c_str());
  for (size_t off = 0; off < data.size();) {
    ssize_t n = write(fd, data.data() + off, data.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = errno;
      close(fd);
      MMPOST_CHECK(false, "external reward ", quote_command(command),
                   ": cannot write its input: ", std::strerror(err));
    }
    off += static_cast<size_t>(n);
  }
  lseek(fd, 0, SEEK_SET);
  return fd;
}

/// Reads `fd` to EOF; returns false when `deadline` passes first.
bool read_all(int fd, std::string& out,
              std::optional<std::chrono::steady_clock::time_point> deadline) {
  char buf[65536];
  for (;;) {
    int wait_ms = -1;
    if (deadline) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                      *deadline - std::chrono::steady_clock::now())
                      .count();
      if (left <= 0) return false;
      wait_ms = static_cast<int>(std::min<int64_t>(left, 1 << 30));
    }
    pollfd p{fd, POLLIN, 0};
    int r = poll(&p, 1, wait_ms);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) return false;
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return true;
    out.append(buf, static_cast<size_t>(n));
  }
}

int wait_child(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

std::string trim(const std::string& s) {
  const char* ws = " \t\r\n\f\v";
  size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

// ---- spec parsing -------------------------------------------------------------------------------

enum class ParamType { kNumber, kInt, kString };
struct ParamInfo {
  const char* name;
  ParamType type;
  bool required;
};

std::vector<ParamInfo> params_of(RewardKind kind) {
  switch (kind) {
    case RewardKind::kExactMatch: return {};
    case RewardKind::kNumericMatch:
      return {{"abs_tol", ParamType::kNumber, false}, {"rel_tol", ParamType::kNumber, false}};
    case RewardKind::kChoiceMatch: return {{"choices", ParamType::kString, false}};
    case RewardKind::kFormat: return {{"pattern", ParamType::kString, false}};
    case RewardKind::kLengthPenalty:
      return {{"max_len", ParamType::kInt, true}, {"cache_len", ParamType::kInt, true}};
    case RewardKind::kExternal:
      return {{"command", ParamType::kString, true}, {"timeout_s", ParamType::kNumber, false}};
  }
  return {};
}

[[noreturn]] void fail(const std::string& path, const std::string& msg,
                       const std::string& hint = "") {
  throw Error(ErrorKind::kUsage, path + ": " + msg, hint);
}

std::string names_of(const std::vector<ParamInfo>& infos) {
  std::string out;
  for (const auto& p : infos) out += (out.empty() ? "" : ", ") + std::string(p.name);
  return out.empty() ? "(none)" : out;
}

void read_param(RewardParams& p, const ParamInfo& info, const nlohmann::json& v,
                const std::string& path) {
  const std::string name = info.name;
  if (info.type == ParamType::kString) {
    if (!v.is_string()) fail(path, "expected a string");
    const auto s = v.get<std::string>();
    (name == "choices" ? p.choices : name == "pattern" ? p.pattern : p.command) = s;
  } else if (info.type == ParamType::kInt) {
    if (!v.is_number_integer()) fail(path, "expected an integer");
    (name == "max_len" ? p.max_len : p.cache_len) = v.get<int64_t>();
  } else {
    if (!v.is_number()) fail(path, "expected a number");
    const double d = v.get<double>();
    (name == "abs_tol" ? p.abs_tol : name == "rel_tol" ? p.rel_tol : p.timeout_s) = d;
  }
}

void validate_params(const RewardSpec& s, const std::string& path) {
  const auto& p = s.p;
  switch (s.kind) {
    case RewardKind::kExactMatch: break;
    case RewardKind::kNumericMatch:
      if (!(p.abs_tol >= 0)) fail(path + ".abs_tol", "must be >= 0");
      if (!(p.rel_tol >= 0)) fail(path + ".rel_tol", "must be >= 0");
      break;
    case RewardKind::kChoiceMatch:
      if (p.choices.empty()) fail(path + ".choices", "must name at least one letter");
      for (char c : p.choices)
        if (c < 'A' || c > 'Z')
          fail(path + ".choices", "must be upper-case letters A-Z, like \"ABCD\"");
      break;
    case RewardKind::kFormat: try { std::regex re(p.pattern, std::regex::ECMAScript);
      } catch (const std::regex_error& e) {
        fail(path + ".pattern", "not a valid ECMAScript regex: " + std::string(e.what()));
      }
      break;
    case RewardKind::kLengthPenalty:
      if (p.max_len <= 0) fail(path + ".max_len", "must be > 0 (tokens)");
      if (p.cache_len <= 0 || p.cache_len > p.max_len)
        fail(path + ".cache_len", "must be in [1, max_len]",
             "DAPO (arXiv:2503.14476) uses max_len 20480 with cache_len 4096");
      break;
    case RewardKind::kExternal:
      if (p.command.empty()) fail(path + ".command", "must not be empty");
      if (!(p.timeout_s >= 0)) fail(path + ".timeout_s", "must be >= 0 (0: no limit)");
      break;
  }
}

RewardSpec parse_spec(const nlohmann::json& j, const std::string& path) {
  if (!j.is_object())
    fail(path,
         "expected an object like {\"name\": \"numeric_match\", \"weight\": 1.0, \"params\": {}}");
  for (const auto& [key, v] : j.items())
    if (key != "name" && key != "weight" && key != "params")
      fail(path + "." + key, "unknown key", "valid keys: name, weight, params");
  if (!j.contains("name") || !j.at("name").is_string())
    fail(path + ".name", "expected a string", "valid names: " + reward_kind_names());
  RewardSpec s;
  s.name = j.at("name").get<std::string>();
  auto kind = find_kind(s.name);
  if (!kind)
    fail(path + ".name", "unknown reward '" + s.name + "'", "valid names: " + reward_kind_names());
  s.kind = *kind;
  if (j.contains("weight")) {
    const auto& w = j.at("weight");
    if (!w.is_number() || !std::isfinite(w.get<double>()))
      fail(path + ".weight", "expected a finite number");
    s.weight = w.get<double>();
  }
  const auto infos = params_of(s.kind);
  if (j.contains("params")) {
    s.params = j.at("params");
    if (!s.params.is_object()) fail(path + ".params", "expected an object");
    for (const auto& [key, v] : s.params.items()) {
      auto it = std::find_if(infos.begin(), infos.end(),
                             [&](const ParamInfo& p) { return key == p.name; });
      if (it == infos.end())
        fail(path + ".params." + key, "unknown param of reward '" + s.name + "'",
             "valid params: " + names_of(infos));
      read_param(s.p, *it, v, path + ".params." + key);
    }
  }
  for (const auto& info : infos)
    if (info.required && !s.params.contains(info.name))
      fail(path + ".params." + info.name, "required by reward '" + s.name + "'",
           "params of " + s.name + ": " + names_of(infos));
  validate_params(s, path + ".params");
  return s;
}

}  // namespace

// ---- registry -----------------------------------------------------------------------------------

RewardKind parse_reward_kind(const std::string& name) {
  auto kind = find_kind(name);
  MMPOST_CHECK_USAGE(kind.has_value(), "unknown reward '", name,
                     "'; valid names: ", reward_kind_names());
  return *kind;
}

std::string to_string(RewardKind kind) {
  for (const auto& [k, n] : kRewardKindNames)
    if (k == kind) return n;
  return "?";
}

std::string reward_kind_names() {
  std::string out;
  for (const auto& [k, n] : kRewardKindNames) out += (out.empty() ? "" : ", ") + std::string(n);
  return out;
}

std::vector<RewardSpec> parse_reward_specs(const nlohmann::json& j, const std::string& path) {
  if (!j.is_array() || j.empty())
    fail(path, "expected a non-empty array of rewards",
         "e.g. [{\"name\": \"numeric_match\", \"weight\": 1.0}, {\"name\": \"format\", \"weight\": "
         "0.2}]; "
         "valid names: " +
             reward_kind_names());
  std::vector<RewardSpec> specs;
  for (size_t k = 0; k < j.size(); ++k)
    specs.push_back(parse_spec(j[k], path + "[" + std::to_string(k) + "]"));
  return specs;
}

// ---- text helpers -------------------------------------------------------------------------------

std::optional<std::string> extract_answer(const std::string& text) {
  static const std::string kOpen = "<answer>", kClose = "</answer>";
  std::optional<std::string> last;
  for (size_t from = 0;;) {
    size_t b = text.find(kOpen, from);
    if (b == std::string::npos) break;
    size_t e = text.find(kClose, b + kOpen.size());
    if (e == std::string::npos) break;
    last = text.substr(b + kOpen.size(), e - b - kOpen.size());
    from = e + kClose.size();
  }
  return last;
}

std::string normalize_whitespace(const std::string& text) {
  std::string out;
  bool space = false;
  for (char c : text) {
    if (std::isspace(static_cast<unsigned char>(c))) {
      space = !out.empty();
    } else {
      if (space) out += ' ';
      out += c;
      space = false;
    }
  }
  return out;
}

std::string normalize_digits(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    char32_t cp = 0;
    size_t len = decode_utf8(text, i, cp);
    if (len > 1) {
      if (auto c = ascii_for(cp)) {
        out += *c;
        i += len;
        continue;
      }
    }
    len = std::max<size_t>(len, 1);  // ASCII or invalid byte: copy through
    out.append(text, i, len);
    i += len;
  }
  return out;
}

std::optional<double> parse_last_number(const std::string& text) {
  const std::string s = normalize_digits(text);
  std::optional<double> last;
  for (size_t i = 0; i < s.size();) {
    const bool starts = is_digit(s[i]) || (s[i] == '.' && i + 1 < s.size() && is_digit(s[i + 1]));
    if (!starts) {
      ++i;
      continue;
    }
    size_t len = scan_number(s, i);
    // A sign counts unless it follows a letter, digit or ')' ("5-3" is a minus, "x=-3" a sign).
    size_t b = i;
    if (i > 0 && (s[i - 1] == '-' || s[i - 1] == '+') &&
        (i == 1 || !(is_alnum(s[i - 2]) || s[i - 2] == ')' || s[i - 2] == '.')))
      b = i - 1;
    std::string num;
    for (size_t k = b; k < i + len; ++k)
      if (s[k] != ',') num += s[k];
    double v = std::strtod(num.c_str(), nullptr);
    if (std::isfinite(v)) last = v;
    i += len;
  }
  return last;
}

std::optional<char> extract_choice(const std::string& text, const std::string& choices) {
  const std::string s = normalize_whitespace(text);
  // 1. The whole text is one letter, maybe wrapped: "B", "b", "(B)", "B.", "B)".
  static const std::regex kAlone(R"(^\(?([A-Za-z])\)?[.:)]?$)");
  // 2. The last "answer [is] [:] X" / "answer: (x)", any case.
  static const std::regex kAnswer(R"(\banswer\b(?:\s+is)?\s*:?\s*\(?([A-Za-z])\)?(?![A-Za-z]))",
                                  std::regex::ECMAScript | std::regex::icase);
  // 3. A leading "(B) ...", "B. ...", "B) ...", "B: ..." (upper case only: "A cat" is no answer).
  static const std::regex kLeading(R"(^(?:\(([A-Z])\)|([A-Z])[.:)](?=\s|$)))");
  // 4. The last "(B)" anywhere.
  static const std::regex kParen(R"(\(([A-Z])\))");
  std::smatch m;
  if (std::regex_match(s, m, kAlone)) return valid_letter(m[1].str()[0], choices);
  std::optional<char> found;
  for (auto it = std::sregex_iterator(s.begin(), s.end(), kAnswer); it != std::sregex_iterator();
       ++it)
    if (auto c = valid_letter((*it)[1].str()[0], choices)) found = c;
  if (found) return found;
  if (std::regex_search(s, m, kLeading))
    return valid_letter((m[1].matched ? m[1] : m[2]).str()[0], choices);
  for (auto it = std::sregex_iterator(s.begin(), s.end(), kParen); it != std::sregex_iterator();
       ++it)
    if (auto c = valid_letter((*it)[1].str()[0], choices)) found = c;
  return found;
}

// ---- verifiers ----------------------------------------------------------------------------------

float exact_match(const std::string& completion, const std::string& reference) {
  const std::string answer = extract_answer(completion).value_or(completion);
  return normalize_whitespace(answer) == normalize_whitespace(reference) ? 1.0f : 0.0f;
}

float numeric_match(const std::string& completion, const std::string& reference, double abs_tol,
                    double rel_tol) {
  auto ref = parse_last_number(reference);
  MMPOST_CHECK_DATA(ref.has_value(), "numeric_match: reference '", reference, "' holds no number");
  auto pred = parse_last_number(extract_answer(completion).value_or(completion));
  if (!pred) return 0.0f;
  return std::abs(*pred - *ref) <= std::max(abs_tol, rel_tol * std::abs(*ref)) ? 1.0f : 0.0f;
}

float choice_match(const std::string& completion, const std::string& reference,
                   const std::string& choices) {
  auto ref = extract_choice(reference, choices);
  MMPOST_CHECK_DATA(ref.has_value(), "choice_match: reference '", reference,
                    "' names no letter of ", choices);
  auto pred = extract_choice(extract_answer(completion).value_or(completion), choices);
  return pred == ref ? 1.0f : 0.0f;
}

float format_reward(const std::string& completion, const std::string& pattern) {
  const std::regex re(pattern == kDefaultFormatPattern ? "" : pattern, std::regex::ECMAScript);
  return format_matches(completion, pattern, re) ? 1.0f : 0.0f;
}

float overlong_penalty(int64_t n_tokens, int64_t max_len, int64_t cache_len) {
  MMPOST_CHECK_USAGE(max_len > 0 && cache_len > 0 && cache_len <= max_len,
                     "length_penalty: need max_len > 0 and cache_len in [1, max_len], got max_len ",
                     max_len, ", cache_len ", cache_len);
  const int64_t soft = max_len - cache_len;
  if (n_tokens <= soft) return 0.0f;
  if (n_tokens <= max_len)
    return static_cast<float>(static_cast<double>(soft - n_tokens) / cache_len);
  return -1.0f;
}

std::vector<float> external_scores(const std::string& command,
                                   const std::vector<ExternalItem>& items, double timeout_s) {
  const std::string cmd = quote_command(command);
  std::string input;
  for (const auto& it : items) {
    nlohmann::json j = {{"id", it.id},
                        {"prompt", it.prompt},
                        {"completion", it.completion},
                        {"reference", it.reference}};
    // Sampled completions can hold invalid UTF-8 (byte-fallback tokens): replace, don't throw.
    input += j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  }
  const int in_fd = temp_file_with(input, command);
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) {
    int err = errno;
    close(in_fd);
    MMPOST_CHECK(false, "external reward ", cmd, ": pipe failed: ", std::strerror(err));
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in_fd, 0);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  std::string arg0 = "sh", arg1 = "-c", arg2 = command;
  char* argv[] = {arg0.data(), arg1.data(), arg2.data(), nullptr};
  pid_t pid = 0;
  // Its own process group, so a timeout kills the whole pipeline, not just the shell.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  const int rc = posix_spawn(&pid, "/bin/sh", &fa, &attr, argv, environ);
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&fa);
  close(in_fd);
  close(out[1]);
  if (rc != 0) {
    close(out[0]);
    MMPOST_CHECK(false, "external reward ", cmd, ": cannot start /bin/sh: ", std::strerror(rc));
  }

  std::string output;
  std::optional<std::chrono::steady_clock::time_point> deadline;
  if (timeout_s > 0)
    deadline = std::chrono::steady_clock::now() +
               std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  const bool finished = read_all(out[0], output, deadline);
  close(out[0]);
  if (!finished) kill(-pid, SIGKILL);
  const int status = wait_child(pid);
  MMPOST_CHECK(finished, "external reward ", cmd, ": no result after ", timeout_s, " s; killed it");
  if (WIFSIGNALED(status))
    MMPOST_CHECK(false, "external reward ", cmd, ": killed by signal ", WTERMSIG(status));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw Error(ErrorKind::kRuntime,
                detail::cat("external reward ", cmd, ": exited with status ", WEXITSTATUS(status)),
                "its stderr is above; it reads JSONL {id, prompt, completion, reference} on stdin "
                "and must print one number per line");

  std::vector<float> scores;
  size_t line_no = 0;
  for (size_t b = 0; b < output.size();) {
    size_t e = output.find('\n', b);
    if (e == std::string::npos) e = output.size();
    const std::string line = trim(output.substr(b, e - b));
    ++line_no;
    char* end = nullptr;
    const double v = line.empty() ? NAN : std::strtod(line.c_str(), &end);
    if (line.empty() || *end != '\0' || !std::isfinite(v))
      throw Error(
          ErrorKind::kRuntime,
          detail::cat("external reward ", cmd, ": stdout line ", line_no, " is '",
                      line.substr(0, 100), "', expected one finite number"),
          "print exactly one number per completion, in input order, and nothing else on stdout");
    scores.push_back(static_cast<float>(v));
    b = e + 1;
  }
  MMPOST_CHECK(scores.size() == items.size(), "external reward ", cmd, ": printed ", scores.size(),
               " lines for ", items.size(), " completions (expected one number per line)");
  return scores;
}

// ---- batch --------------------------------------------------------------------------------------

float score_one(const RewardSpec& spec, const std::string& completion, const std::string& reference,
                const std::string& prompt, int64_t n_tokens) {
  const auto& p = spec.p;
  switch (spec.kind) {
    case RewardKind::kExactMatch: return exact_match(completion, reference);
    case RewardKind::kNumericMatch:
      return numeric_match(completion, reference, p.abs_tol, p.rel_tol);
    case RewardKind::kChoiceMatch: return choice_match(completion, reference, p.choices);
    case RewardKind::kFormat: return format_reward(completion, p.pattern);
    // DAPO, arXiv:2503.14476, Eq. 13.
    case RewardKind::kLengthPenalty: return overlong_penalty(n_tokens, p.max_len, p.cache_len);
    case RewardKind::kExternal:
      return external_scores(p.command, {{"0", prompt, completion, reference}}, p.timeout_s).at(0);
  }
  return 0.0f;
}

RewardScores score_all(const std::vector<RewardSpec>& specs,
                       const std::vector<std::string>& completions,
                       const std::vector<std::string>& references,
                       const std::vector<std::string>& prompts,
                       const std::vector<int64_t>& token_counts) {
  const size_t n = completions.size();
  MMPOST_CHECK(references.size() == n && prompts.size() == n, "score_all: ", n, " completions but ",
               references.size(), " references and ", prompts.size(), " prompts");
  RewardScores out;
  out.total = torch::zeros({static_cast<int64_t>(n)}, torch::kFloat32);
  std::map<std::string, int> seen;
  for (const auto& spec : specs) {
    const int k = ++seen[spec.name];
    out.names.push_back(k == 1 ? spec.name : spec.name + "_" + std::to_string(k));
    std::vector<float> v(n);
    if (spec.kind == RewardKind::kExternal) {
      std::vector<ExternalItem> items(n);
      for (size_t i = 0; i < n; ++i)
        items[i] = {std::to_string(i), prompts[i], completions[i], references[i]};
      v = external_scores(spec.p.command, items, spec.p.timeout_s);
    } else if (spec.kind == RewardKind::kFormat) {
      const std::regex re(spec.p.pattern, std::regex::ECMAScript);  // compiled once per batch
      for (size_t i = 0; i < n; ++i)
        v[i] = format_matches(completions[i], spec.p.pattern, re) ? 1.0f : 0.0f;
    } else {
      MMPOST_CHECK(spec.kind != RewardKind::kLengthPenalty || token_counts.size() == n,
                   "score_all: length_penalty needs ", n, " token counts, got ",
                   token_counts.size());
      for (size_t i = 0; i < n; ++i) {
        try {
          v[i] = score_one(spec, completions[i], references[i], prompts[i],
                           token_counts.empty() ? 0 : token_counts[i]);
        } catch (const Error& e) {
          throw Error(e.kind(),
                      detail::cat("reward ", out.names.back(), ", row ", i, ": ", e.message()),
                      e.hint());
        }
      }
    }
    auto t = torch::tensor(v, torch::kFloat32);
    out.total += spec.weight * t;
    out.values.push_back(t);
  }
  return out;
}

}  // namespace mmpost::algo
