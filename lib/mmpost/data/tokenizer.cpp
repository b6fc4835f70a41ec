// Sentencepiece tokenizer wrapper (see tokenizer.h).
#include "mmpost/data/tokenizer.h"

#include <sentencepiece_processor.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "mmpost/core/check.h"
#include "mmpost/data/bpe.h"

#include <nlohmann/json.hpp>

namespace mmpost::data {
namespace {

// ---- sentencepiece ModelProto, read and rewritten at the protobuf wire level ----------------
// (sentencepiece_model.proto: ModelProto field 3 is the NormalizerSpec; in it 1 name,
// 2 precompiled_charsmap, 3 add_dummy_prefix, 4 remove_extra_whitespaces, 5 escape_whitespaces,
// 6 normalization_rule_tsv.) libsentencepiece does not install the generated protobuf headers.

/// Reads a base-128 varint at `pos`; false when the bytes end first.
bool read_varint(const std::string& b, size_t& pos, uint64_t& v) {
  v = 0;
  for (int shift = 0; shift < 64 && pos < b.size(); shift += 7) {
    const auto byte = static_cast<uint8_t>(b[pos++]);
    v |= static_cast<uint64_t>(byte & 0x7f) << shift;
    if (!(byte & 0x80)) return true;
  }
  return false;
}

void write_varint(std::string& out, uint64_t v) {
  do {
    uint8_t byte = v & 0x7f;
    v >>= 7;
    out.push_back(static_cast<char>(v ? byte | 0x80 : byte));
  } while (v);
}

/// One field of a protobuf message: number, wire type, and its bytes [begin, end) in the
/// message (the whole field, key included) plus the payload of a length-delimited field.
struct Field {
  uint32_t number = 0, wire = 0;
  size_t begin = 0, end = 0;
  uint64_t varint = 0;
  std::string payload;
};

/// The top-level fields of a message; throws std::runtime_error on a malformed encoding.
std::vector<Field> parse_fields(const std::string& b) {
  std::vector<Field> out;
  size_t pos = 0;
  while (pos < b.size()) {
    Field f;
    f.begin = pos;
    uint64_t key = 0;
    if (!read_varint(b, pos, key)) throw std::runtime_error("truncated field key");
    f.number = static_cast<uint32_t>(key >> 3);
    f.wire = static_cast<uint32_t>(key & 7);
    if (f.wire == 0) {
      if (!read_varint(b, pos, f.varint)) throw std::runtime_error("truncated varint");
    } else if (f.wire == 2) {
      uint64_t len = 0;
      if (!read_varint(b, pos, len) || len > b.size() - pos) throw std::runtime_error("truncated bytes");
      f.payload = b.substr(pos, len);
      pos += len;
    } else if (f.wire == 1 || f.wire == 5) {
      pos += f.wire == 1 ? 8 : 4;
      if (pos > b.size()) throw std::runtime_error("truncated fixed field");
    } else {
      throw std::runtime_error("unsupported wire type " + std::to_string(f.wire));
    }
    f.end = pos;
    out.push_back(std::move(f));
  }
  return out;
}

/// What a model's NormalizerSpec asks for (proto defaults where a field is absent).
struct NormalizerSpec {
  std::string name;
  bool has_charsmap = false, has_rule_tsv = false;
  bool add_dummy_prefix = true, remove_extra_whitespaces = true, escape_whitespaces = true;
  bool changes_text() const { return has_charsmap || has_rule_tsv || remove_extra_whitespaces; }
};

NormalizerSpec read_normalizer(const std::string& payload) {
  NormalizerSpec n;
  for (const Field& f : parse_fields(payload)) {
    if (f.number == 1 && f.wire == 2) n.name = f.payload;
    if (f.number == 2 && f.wire == 2) n.has_charsmap = !f.payload.empty();
    if (f.number == 6 && f.wire == 2) n.has_rule_tsv = !f.payload.empty();
    if (f.number == 3 && f.wire == 0) n.add_dummy_prefix = f.varint != 0;
    if (f.number == 4 && f.wire == 0) n.remove_extra_whitespaces = f.varint != 0;
    if (f.number == 5 && f.wire == 0) n.escape_whitespaces = f.varint != 0;
  }
  return n;
}

/// `model` with its NormalizerSpec replaced by the identity (no charsmap, no whitespace removal),
/// keeping add_dummy_prefix and escape_whitespaces: what transformers' Llama tokenizer conversion
/// applies, whatever the sentencepiece model was trained with. Sets `*was` to the old spec.
std::string with_identity_normalizer(const std::string& model, NormalizerSpec* was) {
  std::string out;
  bool replaced = false;
  for (const Field& f : parse_fields(model)) {
    if (f.number != 3 || f.wire != 2) {
      out.append(model, f.begin, f.end - f.begin);
      continue;
    }
    *was = read_normalizer(f.payload);
    std::string spec;
    spec.push_back(static_cast<char>((1 << 3) | 2));  // name = "identity"
    write_varint(spec, 8);
    spec += "identity";
    for (auto [number, value] : {std::pair<int, bool>{3, was->add_dummy_prefix},
                                 {4, false}, {5, was->escape_whitespaces}}) {
      spec.push_back(static_cast<char>(number << 3));
      spec.push_back(value ? 1 : 0);
    }
    out.push_back(static_cast<char>((3 << 3) | 2));
    write_varint(out, spec.size());
    out += spec;
    replaced = true;
  }
  if (!replaced) *was = NormalizerSpec{};  // no spec: proto defaults (whitespace removal on)
  return out;
}

}  // namespace

Tokenizer::Tokenizer(const std::string& model_path) : path_(model_path) {
  MMPOST_CHECK_USAGE(std::filesystem::is_regular_file(model_path), model_path,
                     ": tokenizer model not found");
  {
    std::ifstream in(model_path, std::ios::binary);
    MMPOST_CHECK_USAGE(in.good(), model_path, ": cannot read tokenizer model");
    model_bytes_.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  if (std::filesystem::path(model_path).extension() == ".json") {
    load_tokenizer_json();
    return;
  }
  sp_ = std::make_unique<sentencepiece::SentencePieceProcessor>();
  // transformers reads a Llama tokenizer.model through its tokenizers conversion, which applies
  // no normalizer (neither the NFKC charsmap nor sentencepiece's whitespace squeezing); encode
  // the same way, or ids drift from the reference on such text.
  std::string effective;
  NormalizerSpec spec;
  try {
    effective = with_identity_normalizer(model_bytes_, &spec);
  } catch (const std::exception& e) {
    throw Error(ErrorKind::kUsage, model_path + ": not a sentencepiece model (" + e.what() + ")");
  }
  if (spec.changes_text()) {
    normalizer_note_ = "normalizer \"" + (spec.name.empty() ? std::string("nmt_nfkc") : spec.name) +
                       "\"" + (spec.remove_extra_whitespaces ? " with remove_extra_whitespaces" : "") +
                       " not applied: transformers' LlamaTokenizer conversion ignores it, and "
                       "mmpost encodes as transformers does";
  }
  auto status = sp_->LoadFromSerializedProto(effective);
  MMPOST_CHECK_USAGE(status.ok(), model_path, ": cannot load sentencepiece model: ",
                     status.ToString());
  bos_id_ = sp_->bos_id();
  eos_id_ = sp_->eos_id();
  pad_id_ = sp_->pad_id();
  unk_id_ = sp_->unk_id();
  std::vector<int> unk_ids;
  sp_->Encode(sp_->IdToPiece(static_cast<int>(unk_id_)), &unk_ids);
  n_unk_pieces_ = static_cast<int64_t>(unk_ids.size());
  // Pieces the model defines as user symbols (e.g. <image>) are treated as specials too.
  for (int i = 0; i < sp_->GetPieceSize(); ++i) {
    if (sp_->IsControl(i) || sp_->IsUnknown(i) || sp_->IsByte(i)) continue;
    const std::string& piece = sp_->IdToPiece(i);
    if (piece.size() > 2 && piece.front() == '<' && piece.back() == '>') {
      std::vector<int> ids;
      sp_->Encode(piece, &ids);  // user-defined symbols encode to themselves (after "▁")
      bool atomic = !ids.empty() && ids.back() == i;
      if (atomic) {
        specials_[piece] = i;
        special_text_[i] = piece;
      }
    }
  }
}

void Tokenizer::load_tokenizer_json() {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(model_bytes_);
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(ErrorKind::kUsage, path_ + ": invalid JSON: " + e.what());
  }
  bpe_ = std::make_unique<ByteLevelBpe>(j, path_);
  // Added tokens (special or not) are split out of the text before the model runs, as
  // tokenizers does; their ids may lie inside or beyond the BPE vocabulary.
  try {
    for (const auto& t : j.value("added_tokens", nlohmann::json::array())) {
      const int64_t id = t.at("id").get<int64_t>();
      const auto content = t.at("content").get<std::string>();
      specials_[content] = id;
      special_text_[id] = content;
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorKind::kUsage, path_ + ": added_tokens: " + e.what());
  }
  bos_id_ = eos_id_ = pad_id_ = unk_id_ = -1;  // set from tokenizer_config.json (hub)
  add_bos_ = false;
}

Tokenizer::~Tokenizer() = default;

void Tokenizer::add_special_token(const std::string& text, int64_t id) {
  if (bpe_) {
    const auto it = specials_.find(text);
    const int64_t own = it != specials_.end() ? it->second : bpe_->token_to_id(text);
    MMPOST_CHECK_USAGE(own < 0 || own == id, path_, ": special token ", text, " has id ", own,
                       " in the tokenizer but ", id, " in the model config");
    specials_[text] = id;
    special_text_[id] = text;
    return;
  }
  int own = sp_->PieceToId(text);
  bool known = own != sp_->unk_id() || text == sp_->IdToPiece(sp_->unk_id());
  MMPOST_CHECK_USAGE(!known || own == id, path_, ": special token ", text, " has id ", own,
                     " in the tokenizer but ", id, " in the model config");
  specials_[text] = id;
  special_text_[id] = text;
}

std::vector<int64_t> Tokenizer::encode_plain(const std::string& text, bool add_dummy_prefix) const {
  std::vector<int> ids;
  if (text.empty()) return {};
  if (bpe_) return bpe_->encode(text);  // byte-level: no dummy prefix
  // transformers' Llama tokenizer (Metaspace, prepend_scheme "first") prepends "▁" only when the
  // text does not already start with a space; sentencepiece itself would give "▁▁...".
  if (add_dummy_prefix && text.front() != ' ') {
    sp_->Encode(text, &ids);
    return {ids.begin(), ids.end()};
  }
  // Suppress the dummy prefix: encode "<unk>" + text and drop the pieces "<unk>" yields
  // (transformers LlamaTokenizer, legacy=False).
  sp_->Encode(sp_->IdToPiece(static_cast<int>(unk_id_)) + text, &ids);
  return {ids.begin() + std::min<int64_t>(n_unk_pieces_, ids.size()), ids.end()};
}

std::vector<int64_t> Tokenizer::encode(const std::string& text, bool add_dummy_prefix) const {
  std::vector<int64_t> out;
  size_t pos = 0;
  bool first = true;
  while (pos <= text.size()) {
    // Find the earliest special token at or after pos.
    size_t best = std::string::npos;
    const std::pair<const std::string, int64_t>* hit = nullptr;
    for (const auto& kv : specials_) {
      size_t f = text.find(kv.first, pos);
      if (f != std::string::npos && (f < best || (f == best && kv.first.size() > hit->first.size()))) {
        best = f;
        hit = &kv;
      }
    }
    std::string chunk = text.substr(pos, best == std::string::npos ? std::string::npos : best - pos);
    auto ids = encode_plain(chunk, (first || legacy_) && add_dummy_prefix);
    out.insert(out.end(), ids.begin(), ids.end());
    if (hit == nullptr) break;
    out.push_back(hit->second);
    pos = best + hit->first.size();
    first = false;
  }
  return out;
}

std::string Tokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string out;
  std::vector<int> run;
  auto flush = [&] {
    if (run.empty()) return;
    std::string s;
    if (bpe_) {
      s = bpe_->decode(std::vector<int64_t>(run.begin(), run.end()));
    } else {
      sp_->Decode(run, &s);
    }
    out += s;
    run.clear();
  };
  for (int64_t id : ids) {
    auto it = special_text_.find(id);
    if (id == bos_id_ || id == eos_id_ || id == pad_id_) {
      continue;  // a tokenizer.json's BOS/EOS are added tokens too: dropped all the same
    } else if (it != special_text_.end()) {
      flush();
      out += it->second;
    } else if (id >= 0 && id < model_size()) {
      run.push_back(static_cast<int>(id));
    }
  }
  flush();
  return out;
}

std::string Tokenizer::id_to_piece(int64_t id) const {
  auto it = special_text_.find(id);
  if (it != special_text_.end()) return it->second;
  if (id < 0 || id >= model_size()) return "<id " + std::to_string(id) + ">";
  if (bpe_) return bpe_->id_to_token(id);
  return sp_->IdToPiece(static_cast<int>(id));
}

int64_t Tokenizer::piece_to_id(const std::string& piece) const {
  auto it = specials_.find(piece);
  if (it != specials_.end()) return it->second;
  if (bpe_) return bpe_->token_to_id(piece);
  int id = sp_->PieceToId(piece);
  if (id == sp_->unk_id() && piece != sp_->IdToPiece(sp_->unk_id())) return -1;
  return id;
}

std::vector<std::pair<int64_t, std::string>> Tokenizer::added_tokens() const {
  std::vector<std::pair<int64_t, std::string>> out;
  for (const auto& [id, text] : special_text_) {
    if (id >= model_size()) out.emplace_back(id, text);
  }
  return out;
}

int64_t Tokenizer::model_size() const {
  return bpe_ ? bpe_->vocab_size() : sp_->GetPieceSize();
}

int64_t Tokenizer::vocab_size() const {
  int64_t n = model_size();
  for (const auto& kv : special_text_) n = std::max(n, kv.first + 1);
  return n;
}

}  // namespace mmpost::data
