// Chat templates: messages -> input_ids + labels, built turn by turn so the label mask comes from
// the turn structure (never from searching tokens or re-tokenizing rendered text). Image
// placeholders are expanded to the number of image features the vision tower yields.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mmpost/algo/ignore_index.h"
#include "mmpost/data/tokenizer.h"

namespace mmpost::data {

/// Placeholder text for one image in message content.
inline constexpr const char* kImagePlaceholder = "<image>";

/// Prompt formats. kLlava is LLaVA-1.5's: "USER: <image>\n{q} ASSISTANT: {a}</s>USER: ...".
enum class ChatTemplate { kLlava };

/// Parses a template name; throws Error(kUsage) listing the valid names.
ChatTemplate parse_chat_template(const std::string& name);

/// One conversation turn; role is "system", "user" or "assistant".
struct Message {
  std::string role;
  std::string content;
};

/// Token ids of a conversation. `labels[i]` is input_ids[i] on assistant replies and their EOS,
/// algo::kIgnoreIndex elsewhere (BOS, system/user turns, role markers, image tokens).
struct EncodedConversation {
  std::vector<int64_t> input_ids;
  std::vector<int64_t> labels;
  int64_t n_images = 0;  // <image> placeholders found (each expanded to n_image_tokens ids)
};

/// Options for encode_conversation.
struct TemplateOptions {
  ChatTemplate chat_template = ChatTemplate::kLlava;
  int64_t image_token_id = -1;    // id that <image> maps to (the model's image_token_index)
  int64_t n_image_tokens = 1;     // features per image (vision patches, +1 with "full")
  bool add_generation_prompt = false;  // append the assistant marker ("ASSISTANT:") at the end
};

/// Builds ids turn by turn: [BOS] then each turn's text; consecutive unsupervised text is
/// tokenized as one chunk (the first with sentencepiece's dummy prefix, later ones without), each
/// assistant reply " {content}" + EOS as its own supervised chunk. TORCH_CHECKs nothing; throws
/// Error(kData) for an unknown role.
EncodedConversation encode_conversation(const std::vector<Message>& messages,
                                        const Tokenizer& tokenizer, const TemplateOptions& opts);

/// The text the template renders (for logs, `inspect` and tests); images stay as "<image>".
std::string render_conversation(const std::vector<Message>& messages, const Tokenizer& tokenizer,
                                const TemplateOptions& opts);

}  // namespace mmpost::data
