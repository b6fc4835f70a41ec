// Byte-level BPE (see bpe.h). Pre-tokenizer regexes are PCRE2 (UTF + UCP, JIT): the patterns
// these tokenizers ship use \p{L}, \p{N} and lookahead, which std::regex and RE2 lack.
#include "mmpost/data/bpe.h"

#include <utf8proc.h>

#include <cstdlib>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <climits>
#include <limits>

#include "mmpost/core/check.h"

namespace mmpost::data {

// ---- PCRE2 ------------------------------------------------------------------------------------

class Regex {
 public:
  Regex(const std::string& pattern, const std::string& where) {
    int err = 0;
    PCRE2_SIZE offset = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                          PCRE2_UTF | PCRE2_UCP, &err, &offset, nullptr);
    if (code_ == nullptr) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      throw Error(ErrorKind::kUsage, where + ": regex does not compile at offset " +
                                         std::to_string(offset) + ": " +
                                         reinterpret_cast<const char*>(msg));
    }
    pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if absent
  }
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  /// Splits `s` into matches and the gaps between them, in order ("Isolated").
  void split_isolated(const std::string& s, std::vector<std::string>& out) const {
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
    size_t pos = 0, gap = 0;
    while (pos <= s.size()) {
      const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), pos,
                                 pos == 0 ? 0 : PCRE2_NO_UTF_CHECK, md, nullptr);
      if (rc < 0) break;  // PCRE2_ERROR_NOMATCH (or an error: the rest is one gap)
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      const size_t b = ov[0], e = ov[1];
      if (e == b) {  // an empty match: step over one UTF-8 character
        pos = b + 1;
        while (pos < s.size() && (static_cast<uint8_t>(s[pos]) & 0xC0) == 0x80) ++pos;
        if (b >= s.size()) break;
        continue;
      }
      if (b > gap) out.push_back(s.substr(gap, b - gap));
      out.push_back(s.substr(b, e - b));
      gap = pos = e;
    }
    if (gap < s.size()) out.push_back(s.substr(gap));
    pcre2_match_data_free(md);
  }

 private:
  pcre2_code* code_ = nullptr;
};

namespace {

// tokenizers' ByteLevel regex (GPT-2's), pre_tokenizers/byte_level.rs.
const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    s.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    s.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    s.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    s.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    s.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return s;
}

/// Length of the UTF-8 character starting with byte `c` (1 for stray continuation bytes).
size_t utf8_len(uint8_t c) {
  return c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
}

uint32_t decode_cp(const std::string& s, size_t i, size_t n) {
  const auto c = static_cast<uint8_t>(s[i]);
  if (n == 1) return c;
  uint32_t cp = c & (0xFF >> (n + 1));
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<uint8_t>(s[i + k]) & 0x3F);
  return cp;
}

uint64_t pair_key(int64_t a, int64_t b) {
  return (static_cast<uint64_t>(a) << 32) | static_cast<uint64_t>(b);
}

std::string type_of(const nlohmann::json& j) {
  return j.is_object() ? j.value("type", std::string()) : std::string();
}

}  // namespace

ByteLevelBpe::ByteLevelBpe(const nlohmann::json& j, const std::string& where) {
  auto refuse = [&](const std::string& path, const std::string& what) {
    throw Error(ErrorKind::kUsage, where + ": " + path + ": " + what + " is not reproduced",
                "mmpost reads byte-level BPE tokenizers (GPT-2, SmolLM2, Llama-3, Qwen2 "
                "families); sentencepiece models load from tokenizer.model");
  };
  try {
    // GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the rest to U+0100+.
    std::vector<int> bs;
    for (int b = '!'; b <= '~'; ++b) bs.push_back(b);
    for (int b = 0xA1; b <= 0xAC; ++b) bs.push_back(b);
    for (int b = 0xAE; b <= 0xFF; ++b) bs.push_back(b);
    std::vector<bool> direct(256, false);
    for (int b : bs) direct[b] = true;
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const uint32_t cp = direct[b] ? static_cast<uint32_t>(b) : next++;
      byte_to_unicode_[b] = utf8(cp);
      unicode_to_byte_[cp] = static_cast<uint8_t>(b);
    }

    const auto& model = j.at("model");
    if (type_of(model) != "BPE") refuse("model.type", type_of(model));
    for (const char* off : {"byte_fallback", "fuse_unk"}) {
      if (model.value(off, false)) refuse(std::string("model.") + off, "true");
    }
    if (!model.value("dropout", nlohmann::json()).is_null()) refuse("model.dropout", "a dropout");
    for (const char* affix : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      const auto v = model.value(affix, nlohmann::json());
      if (!v.is_null() && !v.get<std::string>().empty()) refuse(std::string("model.") + affix, v.dump());
    }
    ignore_merges_ = model.value("ignore_merges", false);
    for (const auto& [token, id] : model.at("vocab").items()) {
      const int64_t i = id.get<int64_t>();
      MMPOST_CHECK_USAGE(i >= 0, where, ": model.vocab: negative id for ", token);
      if (static_cast<size_t>(i) >= id_to_token_.size()) id_to_token_.resize(i + 1);
      id_to_token_[i] = token;
      vocab_[token] = i;
    }
    int32_t rank = 0;
    for (const auto& m : model.at("merges")) {
      std::string a, b;
      if (m.is_string()) {
        const auto s = m.get<std::string>();
        const size_t sp = s.find(' ');
        MMPOST_CHECK_USAGE(sp != std::string::npos, where, ": model.merges[", rank, "]: \"", s,
                           "\" is not \"left right\"");
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else {
        a = m.at(0).get<std::string>();
        b = m.at(1).get<std::string>();
      }
      const auto ia = vocab_.find(a), ib = vocab_.find(b), iab = vocab_.find(a + b);
      MMPOST_CHECK_USAGE(ia != vocab_.end() && ib != vocab_.end() && iab != vocab_.end(), where,
                         ": model.merges[", rank, "]: ", a, " + ", b, " is not in the vocabulary");
      merges_.emplace(pair_key(ia->second, ib->second), std::make_pair(rank, iab->second));
      ++rank;
    }

    const auto normalizer = j.value("normalizer", nlohmann::json());
    if (type_of(normalizer) == "NFC") {
      nfc_ = true;  // Qwen2: canonical composition before pre-tokenization
    } else if (!normalizer.is_null()) {
      refuse("normalizer.type", type_of(normalizer));
    }

    const auto pre = j.value("pre_tokenizer", nlohmann::json());
    std::vector<std::pair<nlohmann::json, std::string>> list;
    if (type_of(pre) == "Sequence") {
      for (size_t i = 0; i < pre.at("pretokenizers").size(); ++i) {
        list.emplace_back(pre["pretokenizers"][i], "pre_tokenizer.pretokenizers[" + std::to_string(i) + "]");
      }
    } else if (!pre.is_null()) {
      list.emplace_back(pre, "pre_tokenizer");
    }
    for (size_t i = 0; i < list.size(); ++i) {
      const auto& [p, path] = list[i];
      PreTokenizerStep s;
      const std::string t = type_of(p);
      if (t == "ByteLevel") {
        s.kind = PreTokenizerStep::Kind::kByteLevel;
        s.add_prefix_space = p.value("add_prefix_space", false);
        s.use_regex = p.value("use_regex", true);
        s.pattern = kGpt2Pattern;
        if (i + 1 != list.size()) refuse(path, "ByteLevel before another pre-tokenizer");
      } else if (t == "Split") {
        s.kind = PreTokenizerStep::Kind::kSplit;
        const auto& pat = p.at("pattern");
        if (pat.contains("Regex")) {
          s.pattern = pat["Regex"].get<std::string>();
        } else {
          refuse(path + ".pattern", "a String pattern");
        }
        if (p.value("behavior", std::string()) != "Isolated") {
          refuse(path + ".behavior", p.value("behavior", std::string("?")));
        }
        if (p.value("invert", false)) refuse(path + ".invert", "true");
      } else if (t == "Digits") {
        s.kind = PreTokenizerStep::Kind::kDigits;
        s.individual = p.value("individual_digits", false);
        // Rust's char::is_numeric: Unicode general categories Nd, Nl and No.
        s.pattern = s.individual ? "\\p{N}" : "\\p{N}+";
      } else {
        refuse(path + ".type", t.empty() ? "null" : t);
      }
      steps_.push_back(s);
    }
    MMPOST_CHECK_USAGE(!steps_.empty() && steps_.back().kind == PreTokenizerStep::Kind::kByteLevel,
                       where, ": pre_tokenizer: no ByteLevel step (not a byte-level tokenizer)");
    for (const auto& s : steps_) {
      const bool regex = s.kind != PreTokenizerStep::Kind::kByteLevel || s.use_regex;
      regexes_.push_back(regex ? std::make_unique<Regex>(s.pattern, where + ": pre_tokenizer")
                               : nullptr);
    }
    const auto decoder = j.value("decoder", nlohmann::json());
    if (type_of(decoder) != "ByteLevel") {
      refuse("decoder.type", decoder.is_null() ? "null" : type_of(decoder));
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorKind::kUsage, where + ": " + e.what());
  }
}

ByteLevelBpe::~ByteLevelBpe() = default;
ByteLevelBpe::ByteLevelBpe(ByteLevelBpe&&) noexcept = default;

std::vector<std::string> ByteLevelBpe::pre_tokenize(const std::string& text) const {
  std::vector<std::string> pieces = {text}, next;
  for (size_t i = 0; i < steps_.size(); ++i) {
    const auto& s = steps_[i];
    next.clear();
    for (auto& piece : pieces) {
      if (s.kind == PreTokenizerStep::Kind::kByteLevel && s.add_prefix_space &&
          (piece.empty() || piece.front() != ' ')) {
        piece.insert(piece.begin(), ' ');
      }
      if (regexes_[i]) {
        regexes_[i]->split_isolated(piece, next);
      } else if (!piece.empty()) {
        next.push_back(piece);
      }
    }
    pieces.swap(next);
  }
  return pieces;
}

void ByteLevelBpe::bpe_word(const std::string& mapped, std::vector<int64_t>& out) const {
  if (ignore_merges_) {
    const auto it = vocab_.find(mapped);
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  std::vector<int64_t> ids;
  for (size_t i = 0; i < mapped.size();) {
    const size_t n = utf8_len(static_cast<uint8_t>(mapped[i]));
    const auto it = vocab_.find(mapped.substr(i, n));
    MMPOST_CHECK_DATA(it != vocab_.end(), "byte-level BPE: the vocabulary lacks the byte symbol \"",
                      mapped.substr(i, n), "\"");
    ids.push_back(it->second);
    i += n;
  }
  // Merge the lowest-rank adjacent pair, leftmost first, until none is in the merges (the order
  // tokenizers' Word::merge_all's heap of (rank, position) takes).
  while (ids.size() > 1) {
    int32_t best_rank = std::numeric_limits<int32_t>::max();
    size_t best = 0;
    int64_t merged = -1;
    for (size_t i = 0; i + 1 < ids.size(); ++i) {
      const auto it = merges_.find(pair_key(ids[i], ids[i + 1]));
      if (it != merges_.end() && it->second.first < best_rank) {
        best_rank = it->second.first;
        best = i;
        merged = it->second.second;
      }
    }
    if (merged < 0) break;
    ids[best] = merged;
    ids.erase(ids.begin() + static_cast<std::ptrdiff_t>(best) + 1);
  }
  out.insert(out.end(), ids.begin(), ids.end());
}

std::vector<int64_t> ByteLevelBpe::encode(const std::string& text) const {
  std::vector<int64_t> out;
  for (const auto& piece : pre_tokenize(nfc_ ? nfc(text) : text)) {
    std::string mapped;
    for (unsigned char c : piece) mapped += byte_to_unicode_[c];
    bpe_word(mapped, out);
  }
  return out;
}

std::string ByteLevelBpe::nfc(const std::string& text) {
  if (text.empty()) return text;
  utf8proc_uint8_t* out = nullptr;
  const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                              static_cast<utf8proc_ssize_t>(text.size()), &out,
                              static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) return text;  // invalid UTF-8 goes through as bytes, as the byte-level model takes it
  std::string s(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
  std::free(out);
  return s;
}

std::string ByteLevelBpe::decode(const std::vector<int64_t>& ids) const {
  std::string joined, out;
  for (int64_t id : ids) {
    if (id >= 0 && id < vocab_size()) joined += id_to_token_[id];
  }
  for (size_t i = 0; i < joined.size();) {
    const size_t n = std::min(utf8_len(static_cast<uint8_t>(joined[i])), joined.size() - i);
    const auto it = unicode_to_byte_.find(decode_cp(joined, i, n));
    if (it != unicode_to_byte_.end()) {
      out.push_back(static_cast<char>(it->second));
    } else {
      out.append(joined, i, n);
    }
    i += n;
  }
  return out;
}

std::string ByteLevelBpe::id_to_token(int64_t id) const {
  return id >= 0 && id < vocab_size() ? id_to_token_[id] : std::string();
}

int64_t ByteLevelBpe::token_to_id(const std::string& token) const {
  const auto it = vocab_.find(token);
  return it == vocab_.end() ? -1 : it->second;
}

}  // namespace mmpost::data
