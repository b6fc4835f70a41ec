// Chat templates: messages -> input_ids + labels, built turn by turn so the label mask comes from
// the turn structure (never from searching tokens or re-tokenizing rendered text). Image
// placeholders are expanded to the number of image features the vision tower yields.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "mmpost/algo/ignore_index.h"
#include "mmpost/data/tokenizer.h"

namespace mmpost::data {

/// Placeholder text for one image in message content.
inline constexpr const char* kImagePlaceholder = "<image>";

/// Prompt formats. kLlava is LLaVA-1.5's training format: "USER: <image>\n{q} ASSISTANT: {a}</s>
/// USER: ..." (llava-hf's checkpoint template is recognised as it: its prompts render the same,
/// its replies end with " " where this ends them with EOS). The others render exactly what the
/// checkpoint's template gives through transformers' apply_chat_template:
///   kSmolLM2  ChatML, default system "You are a helpful AI assistant named SmolLM, ...";
///   kQwen2Vl  ChatML, default system "You are a helpful assistant.", each image as
///             <|vision_start|><|image_pad|><|vision_end|> (its "\n" after <image> dropped);
///   kLlama3   <|begin_of_text|><|start_header_id|>{role}<|end_header_id|>\n\n{content.strip()}
///             <|eot_id|>, no default system (Meta-Llama-3-8B-Instruct).
enum class ChatTemplate { kLlava, kSmolLM2, kQwen2Vl, kLlama3 };

/// Parses a template name (llava, smollm2, qwen2_vl, llama3); throws Error(kUsage) listing the
/// valid names.
ChatTemplate parse_chat_template(const std::string& name);
std::string chat_template_name(ChatTemplate t);

/// The template a checkpoint's jinja text is (compared with the known checkpoints' templates,
/// whitespace ignored), or nullopt for any other text.
std::optional<ChatTemplate> recognize_chat_template(const std::string& jinja);

/// data.chat_template as a stage resolves it: "auto" takes the tokenizer's checkpoint template
/// when it has one (refused by name with a hint when it is not recognised), else kLlava; any
/// other value names the template and wins. Throws Error(kUsage).
ChatTemplate resolve_chat_template(const std::string& setting, const Tokenizer& tokenizer);

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
  /// The text the template writes for an image, which the tokenizer maps to image_token_id:
  /// "<image>" (LLaVA), "<|image_pad|>" (Qwen2-VL family checkpoints).
  std::string image_text = kImagePlaceholder;
  /// Per-image token counts (Qwen2-VL: t * h * w / merge^2 of each image's grid, in order);
  /// when not empty it replaces n_image_tokens and must have one entry per image.
  std::vector<int64_t> image_token_counts;
};

/// Builds ids turn by turn: [BOS] (when the tokenizer adds one and the template does not write
/// it) then each turn's text; consecutive unsupervised text is tokenized as one chunk (the first
/// with sentencepiece's dummy prefix, later ones without), each assistant reply with its end
/// token as its own supervised chunk: llava " {content}" + EOS, ChatML "{content}<|im_end|>",
/// Llama-3 "{content}<|eot_id|>" (the "\n" after <|im_end|> is not supervised). The end token is
/// labelled even when it is also the pad token (SmolLM2: pad == EOS). Throws Error(kData) for an
/// unknown role.
EncodedConversation encode_conversation(const std::vector<Message>& messages,
                                        const Tokenizer& tokenizer, const TemplateOptions& opts);

/// The text the template renders (for logs, `inspect` and tests): apply_chat_template's text
/// for the checkpoint templates; llava's images stay as "<image>", qwen2_vl's as <|image_pad|>.
std::string render_conversation(const std::vector<Message>& messages, const Tokenizer& tokenizer,
                                const TemplateOptions& opts);

}  // namespace mmpost::data
