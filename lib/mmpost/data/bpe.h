// Byte-level BPE (GPT-2 / SmolLM2 / Llama-3 / Qwen2 style) read from a Hugging Face
// tokenizer.json, reproducing the `tokenizers` library: pre-tokenizers (ByteLevel with its GPT-2
// regex, Split with a regex, Digits) run with PCRE2 in UTF + UCP mode, each piece mapped byte by
// byte through GPT-2's bytes_to_unicode table, then merged pairwise by merge rank. Special and
// added tokens are split out by the caller (data::Tokenizer) before this runs.
#pragma once

#include <nlohmann/json.hpp>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace mmpost::data {

/// One pre-tokenization step (tokenizers' pre_tokenizers, "Isolated" behaviour: every regex
/// match and every gap between matches becomes its own piece).
struct PreTokenizerStep {
  enum class Kind { kSplit, kDigits, kByteLevel };
  Kind kind = Kind::kSplit;
  std::string pattern;        // kSplit / kByteLevel (use_regex): the regex
  bool invert = false;        // kSplit: the pieces are the matches' complement
  bool individual = false;    // kDigits: one piece per digit
  bool add_prefix_space = false;  // kByteLevel
  bool use_regex = true;          // kByteLevel
};

/// A compiled PCRE2 pattern (JIT where available); thread-safe matching.
class Regex;

/// Byte-level BPE from tokenizer.json. Thread-safe for encode/decode.
class ByteLevelBpe {
 public:
  /// Reads tokenizer.json's "model" (type BPE: vocab, merges as "a b" strings or [a, b] pairs,
  /// ignore_merges; byte_fallback, dropout, continuing_subword_prefix and end_of_word_suffix must
  /// be off), "normalizer" (null, or NFC as Qwen2's), "pre_tokenizer" (ByteLevel, Split, Digits or a Sequence of
  /// them) and "decoder" (ByteLevel). Anything else throws Error(kUsage) naming `where` and the
  /// JSON path ("tokenizer.json: normalizer.type: NFKC is not reproduced").
  ByteLevelBpe(const nlohmann::json& tokenizer_json, const std::string& where);
  ~ByteLevelBpe();
  ByteLevelBpe(ByteLevelBpe&&) noexcept;

  /// Ids of `text` (no special-token handling, no BOS/EOS), as tokenizers' encode of a segment
  /// that contains no added token.
  std::vector<int64_t> encode(const std::string& text) const;
  /// The bytes the tokens of `ids` stand for (ByteLevel decoder); ids outside the vocabulary are
  /// skipped.
  std::string decode(const std::vector<int64_t>& ids) const;

  int64_t vocab_size() const { return static_cast<int64_t>(id_to_token_.size()); }
  /// The vocabulary string of an id ("Ġthe"), or "" outside it.
  std::string id_to_token(int64_t id) const;
  /// Id of a vocabulary string, or -1.
  int64_t token_to_id(const std::string& token) const;

  /// The pre-tokenization pieces of `text`, before the byte mapping (for tests and inspect).
  std::vector<std::string> pre_tokenize(const std::string& text) const;

  /// Unicode canonical composition (NFC, utf8proc) of UTF-8 text, as the NFC normalizer of
  /// `tokenizers`; invalid UTF-8 is returned unchanged.
  static std::string nfc(const std::string& text);

 private:
  void bpe_word(const std::string& mapped, std::vector<int64_t>& out) const;

  std::vector<PreTokenizerStep> steps_;
  std::vector<std::unique_ptr<Regex>> regexes_;  // one per step (null for kDigits individual)
  std::unordered_map<std::string, int64_t> vocab_;
  std::vector<std::string> id_to_token_;
  std::unordered_map<uint64_t, std::pair<int32_t, int64_t>> merges_;  // (left, right) -> rank, id
  bool ignore_merges_ = false;
  bool nfc_ = false;  // normalizer {"type": "NFC"} (Qwen2)
  std::array<std::string, 256> byte_to_unicode_;          // byte -> UTF-8 of its mapped char
  std::unordered_map<uint32_t, uint8_t> unicode_to_byte_;  // mapped code point -> byte
};

}  // namespace mmpost::data
