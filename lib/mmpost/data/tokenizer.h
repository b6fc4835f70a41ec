// Sentencepiece tokenizer with the special tokens a VLM chat template needs. Special tokens that
// live outside the sentencepiece model (HF "added tokens" such as LLaVA's <image> = 32000) are
// split out of the text before encoding, so both project-trained and HF tokenizers work.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace mmpost::data {

class ByteLevelBpe;

/// Wraps sentencepiece::SentencePieceProcessor (libsentencepiece). Thread-safe for encode/decode.
class Tokenizer {
 public:
  /// Loads a tokenizer.model. Its normalizer (NFKC charsmap, remove_extra_whitespaces) is
  /// replaced by the identity, as transformers' LlamaTokenizer (tokenizers conversion, 5.x)
  /// ignores it: ids then equal transformers' for any text (normalizer_note() says what was
  /// dropped). Throws Error(kUsage) naming the path if it cannot be read or parsed.
  /// A path ending in ".json" is a Hugging Face tokenizer.json with a byte-level BPE model
  /// (data::ByteLevelBpe): its added tokens are registered as specials, and BOS/EOS/PAD/UNK
  /// start unset (-1) and add_bos() false until the hub sets them from tokenizer_config.json.
  explicit Tokenizer(const std::string& model_path);
  /// "sentencepiece" or "bpe".
  std::string kind() const { return bpe_ ? "bpe" : "sentencepiece"; }
  /// Empty, or what the model's own normalizer would have done that mmpost (as transformers)
  /// does not, for a warning.
  const std::string& normalizer_note() const { return normalizer_note_; }
  ~Tokenizer();

  /// Registers a special token (e.g. "<image>") with a fixed id; if the sentencepiece model
  /// already has the piece, its own id must match (else Error(kUsage)).
  void add_special_token(const std::string& text, int64_t id);

  /// Encodes text. Registered special tokens in `text` become their ids. With
  /// `add_dummy_prefix == false` the leading "▁" sentencepiece would add is suppressed (for text
  /// that continues a sequence). Matches transformers' LlamaTokenizer with legacy=False (5.x,
  /// Metaspace prepend_scheme "first"): only the first chunk, before any special token, gets the
  /// "▁" prefix, and not when it already starts with a space. No BOS/EOS.
  std::vector<int64_t> encode(const std::string& text, bool add_dummy_prefix = true) const;

  /// Decodes ids to text; special control ids (BOS/EOS/PAD) are dropped, registered special
  /// tokens print as their text.
  std::string decode(const std::vector<int64_t>& ids) const;

  /// The piece string of one id (for debugging and `inspect`).
  std::string id_to_piece(int64_t id) const;
  /// Id of a piece, or -1.
  int64_t piece_to_id(const std::string& piece) const;

  /// Registered special tokens whose ids lie beyond the sentencepiece model (HF "added tokens",
  /// e.g. LLaVA's <image> = 32000), as (id, text), ascending by id.
  std::vector<std::pair<int64_t, std::string>> added_tokens() const;
  int64_t vocab_size() const;  // sentencepiece pieces plus registered specials beyond them
  int64_t bos_id() const { return bos_id_; }
  int64_t eos_id() const { return eos_id_; }
  int64_t pad_id() const { return pad_id_; }
  int64_t unk_id() const { return unk_id_; }
  /// transformers' LlamaTokenizer `legacy` flag (tokenizer_config.json): false (default,
  /// Metaspace prepend_scheme "first") gives only the first text chunk the "▁" prefix; true
  /// ("always") gives every chunk between special tokens one, unless it starts with a space.
  void set_legacy(bool legacy) { legacy_ = legacy; }
  /// Whether a conversation starts with BOS (tokenizer.json's post_processor: [<s>, $A] yes,
  /// [$A] or none no). Default true, as transformers' conversion of a tokenizer.model.
  void set_add_bos(bool add_bos) { add_bos_ = add_bos; }
  bool add_bos() const { return add_bos_; }
  bool legacy() const { return legacy_; }
  /// Overrides the pad id (HF checkpoints often define <pad> as an added token).
  void set_pad_id(int64_t id) { pad_id_ = id; }
  void set_bos_id(int64_t id) { bos_id_ = id; }
  void set_eos_id(int64_t id) { eos_id_ = id; }
  void set_unk_id(int64_t id) { unk_id_ = id; }
  /// The checkpoint's chat template (jinja text from tokenizer_config.json "chat_template" or
  /// chat_template.jinja), empty when it has none; written back when the folder is saved.
  void set_chat_template(std::string jinja) { chat_template_ = std::move(jinja); }
  const std::string& chat_template() const { return chat_template_; }
  const std::string& path() const { return path_; }
  /// The tokenizer.model bytes as loaded. Model folders are written from these, never re-read
  /// from path(): a run's checkpoints are pruned, and the file it came from may be gone.
  const std::string& model_bytes() const { return model_bytes_; }

 private:
  std::vector<int64_t> encode_plain(const std::string& text, bool add_dummy_prefix) const;
  void load_tokenizer_json();
  int64_t model_size() const;  // pieces of the sentencepiece model / BPE vocabulary

  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  std::unique_ptr<ByteLevelBpe> bpe_;
  std::string path_;
  std::string model_bytes_;
  std::string normalizer_note_;
  std::string chat_template_;
  bool legacy_ = false;
  bool add_bos_ = true;
  std::map<std::string, int64_t> specials_;  // text -> id
  std::map<int64_t, std::string> special_text_;
  int64_t bos_id_ = 1, eos_id_ = 2, pad_id_ = -1, unk_id_ = 0;
  int64_t n_unk_pieces_ = 0;  // pieces that encode("<unk>") yields (for prefix suppression)
};

}  // namespace mmpost::data
