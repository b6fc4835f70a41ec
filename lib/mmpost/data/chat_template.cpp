// Turn-by-turn chat template encoding (see chat_template.h).
#include "mmpost/data/chat_template.h"

#include <utility>

#include "mmpost/core/check.h"

namespace mmpost::data {
namespace {
/// One piece of a rendered conversation: text (or EOS) and whether it is supervised.
struct Segment {
  std::string text;
  bool supervised;
  bool is_eos;
};

/// The checkpoints' own templates (tokenizer_config.json / chat_template.json of
/// llava-hf/llava-1.5-7b-hf, HuggingFaceTB/SmolLM2-135M-Instruct, Qwen/Qwen2-VL-2B-Instruct,
/// meta-llama/Meta-Llama-3-8B-Instruct; sources in scripts/golden/chat_templates/SOURCES.md).
const std::vector<std::pair<ChatTemplate, std::string>>& known_templates() {
  static const std::vector<std::pair<ChatTemplate, std::string>> k = {
    {ChatTemplate::kLlava, R"jinja({% for message in messages %}{% if message['role'] != 'system' %}{{ message['role'].upper() + ': '}}{% endif %}{# Render all images first #}{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>
' }}{% endfor %}{# Render all text next #}{% if message['role'] != 'assistant' %}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] + ' '}}{% endfor %}{% else %}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{% generation %}{{ content['text'] + ' '}}{% endgeneration %}{% endfor %}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %})jinja"},
    {ChatTemplate::kSmolLM2, R"jinja({% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system
You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>
' }}{% endif %}{{'<|im_start|>' + message['role'] + '
' + message['content'] + '<|im_end|>' + '
'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant
' }}{% endif %})jinja"},
    {ChatTemplate::kQwen2Vl, R"jinja({% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}{% for message in messages %}{% if loop.first and message['role'] != 'system' %}<|im_start|>system
You are a helpful assistant.<|im_end|>
{% endif %}<|im_start|>{{ message['role'] }}
{% if message['content'] is string %}{{ message['content'] }}<|im_end|>
{% else %}{% for content in message['content'] %}{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>{% elif content['type'] == 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>
{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %})jinja"},
    {ChatTemplate::kLlama3, R"jinja({% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>

'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>

' }}{% endif %})jinja"},
  };
  return k;
}

std::string without_space(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c != ' ' && c != '\n' && c != '\t' && c != '\r') out += c;
  }
  return out;
}

/// Python's str.strip() (what jinja's |trim calls): Unicode White_Space plus U+001C..U+001F.
std::string py_strip(const std::string& s) {
  auto ws_len = [&](size_t i) -> size_t {  // bytes of a whitespace code point at i, else 0
    const auto u = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
    const unsigned char c = u(i);
    if (c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F)) return 1;
    if (c == 0xC2 && i + 1 < s.size() && (u(i + 1) == 0x85 || u(i + 1) == 0xA0)) return 2;
    if (c == 0xE1 && i + 2 < s.size() && u(i + 1) == 0x9A && u(i + 2) == 0x80) return 3;  // 1680
    if (c == 0xE2 && i + 2 < s.size()) {
      const unsigned b1 = u(i + 1), b2 = u(i + 2);
      if (b1 == 0x80 && (b2 <= 0x8A || b2 == 0xA8 || b2 == 0xA9 || b2 == 0xAF)) return 3;
      if (b1 == 0x81 && b2 == 0x9F) return 3;  // 205F
    }
    if (c == 0xE3 && i + 2 < s.size() && u(i + 1) == 0x80 && u(i + 2) == 0x80) return 3;  // 3000
    return 0;
  };
  size_t b = 0;
  while (b < s.size()) {
    const size_t n = ws_len(b);
    if (n == 0) break;
    b += n;
  }
  size_t e = s.size();
  while (e > b) {  // step back over one code point and test it
    size_t k = e - 1;
    while (k > b && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
    if (ws_len(k) != e - k) break;
    e = k;
  }
  return s.substr(b, e - b);
}

/// Qwen2-VL's image markup for each placeholder ("<image>" and the "\n" after it).
std::string qwen_images(const std::string& content, const std::string& image_text) {
  std::string out;
  const std::string ph = kImagePlaceholder;
  size_t i = 0;
  while (i < content.size()) {
    if (content.compare(i, ph.size(), ph) == 0) {
      out += "<|vision_start|>" + image_text + "<|vision_end|>";
      i += ph.size();
      if (i < content.size() && content[i] == '\n') ++i;
    } else {
      out += content[i++];
    }
  }
  return out;
}

/// Whether content is one or more placeholders and nothing else ("<image>\n<image>\n").
bool images_only(const std::string& content) {
  const std::string ph = kImagePlaceholder;
  size_t i = 0, n = 0;
  while (i < content.size() && content.compare(i, ph.size(), ph) == 0) {
    i += ph.size();
    ++n;
    if (i < content.size() && content[i] == '\n') ++i;
  }
  return n > 0 && i == content.size();
}

class Builder {
 public:
  void masked(const std::string& t) {
    if (!segs.empty() && !segs.back().supervised && !segs.back().is_eos) {
      segs.back().text += t;  // merge consecutive unsupervised text into one chunk
    } else {
      segs.push_back({t, false, false});
    }
  }
  void supervised(const std::string& t) { segs.push_back({t, true, false}); }
  void eos() { segs.push_back({"", true, true}); }
  std::vector<Segment> segs;
};

void check_role(const Message& m) {
  if (m.role != "system" && m.role != "user" && m.role != "assistant") {
    throw Error(ErrorKind::kData, "unknown message role \"" + m.role + "\"",
                "roles: system, user, assistant");
  }
}

/// `image_text`: what a placeholder becomes inside the template's image markup (the
/// placeholder itself when encoding, the checkpoint's token text when rendering).
std::vector<Segment> segments(ChatTemplate t, const std::vector<Message>& messages,
                              bool gen_prompt, const std::string& image_text) {
  Builder b;
  switch (t) {
    case ChatTemplate::kLlava:
      for (const auto& m : messages) {
        check_role(m);
        // As llava-hf's template: text is followed by " ", images alone ("<image>\n") are not.
        const std::string end = images_only(m.content) ? "" : " ";
        if (m.role == "system") {
          b.masked(m.content + end);
        } else if (m.role == "user") {
          b.masked("USER: " + m.content + end);
        } else {
          b.masked("ASSISTANT:");
          b.supervised(" " + m.content);
          b.eos();
        }
      }
      if (gen_prompt) b.masked("ASSISTANT:");
      break;
    case ChatTemplate::kSmolLM2:
    case ChatTemplate::kQwen2Vl: {
      const bool qwen = t == ChatTemplate::kQwen2Vl;
      const std::string system = qwen ? "You are a helpful assistant."
                                      : "You are a helpful AI assistant named SmolLM, trained by "
                                        "Hugging Face";
      for (size_t i = 0; i < messages.size(); ++i) {
        const auto& m = messages[i];
        check_role(m);
        if (i == 0 && m.role != "system") b.masked("<|im_start|>system\n" + system + "<|im_end|>\n");
        const std::string content = qwen ? qwen_images(m.content, image_text) : m.content;
        if (m.role == "assistant") {
          b.masked("<|im_start|>assistant\n");
          b.supervised(content + "<|im_end|>");
          b.masked("\n");
        } else {
          b.masked("<|im_start|>" + m.role + "\n" + content + "<|im_end|>\n");
        }
      }
      if (gen_prompt) b.masked("<|im_start|>assistant\n");
      break;
    }
    case ChatTemplate::kLlama3:
      for (size_t i = 0; i < messages.size(); ++i) {
        const auto& m = messages[i];
        check_role(m);
        const std::string head = std::string(i == 0 ? "<|begin_of_text|>" : "") +
                                 "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n";
        if (m.role == "assistant") {
          b.masked(head);
          b.supervised(py_strip(m.content) + "<|eot_id|>");
        } else {
          b.masked(head + py_strip(m.content) + "<|eot_id|>");
        }
      }
      if (gen_prompt) b.masked("<|start_header_id|>assistant<|end_header_id|>\n\n");
      break;
  }
  return b.segs;
}
}  // namespace

ChatTemplate parse_chat_template(const std::string& name) {
  if (name == "llava") return ChatTemplate::kLlava;
  if (name == "smollm2") return ChatTemplate::kSmolLM2;
  if (name == "qwen2_vl") return ChatTemplate::kQwen2Vl;
  if (name == "llama3") return ChatTemplate::kLlama3;
  throw Error(ErrorKind::kUsage, "chat template \"" + name + "\" is not valid",
              "valid: auto, llava, smollm2, qwen2_vl, llama3");
}

std::string chat_template_name(ChatTemplate t) {
  switch (t) {
    case ChatTemplate::kLlava: return "llava";
    case ChatTemplate::kSmolLM2: return "smollm2";
    case ChatTemplate::kQwen2Vl: return "qwen2_vl";
    case ChatTemplate::kLlama3: return "llama3";
  }
  return "?";
}

std::optional<ChatTemplate> recognize_chat_template(const std::string& jinja) {
  const std::string key = without_space(jinja);
  for (const auto& [t, text] : known_templates()) {
    if (without_space(text) == key) return t;
  }
  return std::nullopt;
}

ChatTemplate resolve_chat_template(const std::string& setting, const Tokenizer& tokenizer) {
  if (setting != "auto") return parse_chat_template(setting);
  if (tokenizer.chat_template().empty()) return ChatTemplate::kLlava;
  if (auto t = recognize_chat_template(tokenizer.chat_template())) return *t;
  throw Error(ErrorKind::kUsage,
              tokenizer.path() + ": the checkpoint's chat template is not one mmpost reproduces "
              "(it recognises those of llava-1.5-hf, SmolLM2, Qwen2-VL and Llama-3 exactly)",
              "set data.chat_template to the format it follows: llava, smollm2, qwen2_vl, llama3");
}

EncodedConversation encode_conversation(const std::vector<Message>& messages,
                                        const Tokenizer& tokenizer, const TemplateOptions& opts) {
  const auto segs = segments(opts.chat_template, messages, opts.add_generation_prompt,
                             opts.image_text);
  EncodedConversation out;
  // A template that writes BOS itself (Llama-3) gets no second one; transformers' processors
  // tokenize such text without special tokens the same way.
  const bool template_bos = opts.chat_template == ChatTemplate::kLlama3 && !messages.empty();
  if (tokenizer.add_bos() && !template_bos) {
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
        // Expand one placeholder into its image's token count; never supervised.
        int64_t n = opts.n_image_tokens;
        if (!opts.image_token_counts.empty()) {
          MMPOST_CHECK_DATA(out.n_images < static_cast<int64_t>(opts.image_token_counts.size()),
                            "the conversation has more image placeholders than the ",
                            opts.image_token_counts.size(), " images given");
          n = opts.image_token_counts[out.n_images];
        }
        ++out.n_images;
        out.input_ids.insert(out.input_ids.end(), n, id);
        out.labels.insert(out.labels.end(), n, algo::kIgnoreIndex);
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
  (void)tokenizer;
  const bool llava = opts.chat_template == ChatTemplate::kLlava;
  std::string out = llava ? "<s>" : "";
  for (const auto& seg : segments(opts.chat_template, messages, opts.add_generation_prompt,
                                  "<|image_pad|>")) {
    out += seg.is_eos ? "</s>" : seg.text;
  }
  return out;
}

}  // namespace mmpost::data
