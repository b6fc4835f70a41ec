// Sentencepiece tokenizer wrapper (see tokenizer.h).
#include "mmpost/data/tokenizer.h"

#include <sentencepiece_processor.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "mmpost/core/check.h"

namespace mmpost::data {

Tokenizer::Tokenizer(const std::string& model_path)
    : sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()), path_(model_path) {
  MMPOST_CHECK_USAGE(std::filesystem::is_regular_file(model_path), model_path,
                     ": tokenizer model not found");
  {
    std::ifstream in(model_path, std::ios::binary);
    MMPOST_CHECK_USAGE(in.good(), model_path, ": cannot read tokenizer model");
    model_bytes_.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  auto status = sp_->LoadFromSerializedProto(model_bytes_);
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

Tokenizer::~Tokenizer() = default;

void Tokenizer::add_special_token(const std::string& text, int64_t id) {
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
    auto ids = encode_plain(chunk, first && add_dummy_prefix);
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
    sp_->Decode(run, &s);
    out += s;
    run.clear();
  };
  for (int64_t id : ids) {
    auto it = special_text_.find(id);
    if (it != special_text_.end()) {
      flush();
      out += it->second;
    } else if (id == bos_id_ || id == eos_id_ || id == pad_id_) {
      continue;
    } else if (id >= 0 && id < sp_->GetPieceSize()) {
      run.push_back(static_cast<int>(id));
    }
  }
  flush();
  return out;
}

std::string Tokenizer::id_to_piece(int64_t id) const {
  auto it = special_text_.find(id);
  if (it != special_text_.end()) return it->second;
  if (id < 0 || id >= sp_->GetPieceSize()) return "<id " + std::to_string(id) + ">";
  return sp_->IdToPiece(static_cast<int>(id));
}

int64_t Tokenizer::piece_to_id(const std::string& piece) const {
  auto it = specials_.find(piece);
  if (it != specials_.end()) return it->second;
  int id = sp_->PieceToId(piece);
  if (id == sp_->unk_id() && piece != sp_->IdToPiece(sp_->unk_id())) return -1;
  return id;
}

std::vector<std::pair<int64_t, std::string>> Tokenizer::added_tokens() const {
  std::vector<std::pair<int64_t, std::string>> out;
  for (const auto& [id, text] : special_text_) {
    if (id >= sp_->GetPieceSize()) out.emplace_back(id, text);
  }
  return out;
}

int64_t Tokenizer::vocab_size() const {
  int64_t n = sp_->GetPieceSize();
  for (const auto& kv : special_text_) n = std::max(n, kv.first + 1);
  return n;
}

}  // namespace mmpost::data
