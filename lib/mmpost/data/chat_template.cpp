// Turn-by-turn chat template encoding (see chat_template.h).
#include "mmpost/data/chat_template.h"

#include "mmpost/core/check.h"

namespace mmpost::data {
namespace {
/// One piece of a rendered conversation: text (or EOS) and whether it is supervised.
struct Segment {
  std::string text;
  bool supervised;
  bool is_eos;
};

std::vector<Segment> segments_llava(const std::vector<Message>& messages, bool gen_prompt) {
  std::vector<Segment> segs;
  auto masked = [&](const std::string& t) {
    if (!segs.empty() && !segs.back().supervised && !segs.back().is_eos) {
      segs.back().text += t;  // merge consecutive unsupervised text into one chunk
    } else {
      segs.push_back({t, false, false});
    }
  };
  for (const auto& m : messages) {
    if (m.role == "system") {
      masked(m.content + " ");
    } else if (m.role == "user") {
      masked("USER: " + m.content + " ");
    } else if (m.role == "assistant") {
      masked("ASSISTANT:");
      segs.push_back({" " + m.content, true, false});
      segs.push_back({"", true, true});
    } else {
      throw Error(ErrorKind::kData, "unknown message role \"" + m.role + "\"",
                  "roles: system, user, assistant");
    }
  }
  if (gen_prompt) masked("ASSISTANT:");
  return segs;
}
}  // namespace

ChatTemplate parse_chat_template(const std::string& name) {
  if (name == "llava") return ChatTemplate::kLlava;
  throw Error(ErrorKind::kUsage, "chat template \"" + name + "\" is not valid", "valid: llava");
}

EncodedConversation encode_conversation(const std::vector<Message>& messages,
                                        const Tokenizer& tokenizer, const TemplateOptions& opts) {
  std::vector<Segment> segs;
  switch (opts.chat_template) {
    case ChatTemplate::kLlava: segs = segments_llava(messages, opts.add_generation_prompt); break;
  }
  EncodedConversation out;
  if (tokenizer.add_bos()) {
    out.input_ids.push_back(tokenizer.bos_id());
    out.labels.push_back(algo::kIgnoreIndex);
  }
  bool first_text = true;
  for (const auto& seg : segs) {
    std::vector<int64_t> ids;
    if (seg.is_eos) {
      ids = {tokenizer.eos_id()};
    } else {
      ids = tokenizer.encode(seg.text, /*add_dummy_prefix=*/first_text);
      first_text = false;
    }
    for (int64_t id : ids) {
      if (id == opts.image_token_id) {
        // Expand one placeholder into n_image_tokens ids; never supervised.
        ++out.n_images;
        out.input_ids.insert(out.input_ids.end(), opts.n_image_tokens, id);
        out.labels.insert(out.labels.end(), opts.n_image_tokens, algo::kIgnoreIndex);
        continue;
      }
      out.input_ids.push_back(id);
      out.labels.push_back(seg.supervised ? id : algo::kIgnoreIndex);
    }
  }
  return out;
}

std::string render_conversation(const std::vector<Message>& messages, const Tokenizer& tokenizer,
                                const TemplateOptions& opts) {
  std::string out = "<s>";
  for (const auto& seg : segments_llava(messages, opts.add_generation_prompt)) {
    out += seg.is_eos ? "</s>" : seg.text;
  }
  return out;
}

}  // namespace mmpost::data
