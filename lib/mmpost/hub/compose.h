// A LLaVA-style model on a pretrained language model (`mmpost init`): the decoder, its embedding
// and tokenizer come from a LlamaForCausalLM folder (e.g. SmolLM2-135M-Instruct), the vision
// tower and projector are new (seeded random) or taken from another LLaVA folder. The result is
// an ordinary LLaVA model folder that every stage, transformers and vLLM load.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "mmpost/hub/hf_folder.h"

namespace mmpost::hub {

/// What compose_vlm builds from.
struct ComposeOptions {
  std::filesystem::path language_model;  // LlamaForCausalLM folder: config.json, safetensors,
                                         // tokenizer.model or tokenizer.json (+ its config)
  /// LLaVA config.json fields besides text_config / image_token_index / image_seq_length (which
  /// come from the language model): vision_config, projector_hidden_act,
  /// vision_feature_layer, vision_feature_select_strategy, multimodal_projector_bias. HF names.
  nlohmann::json vlm_config = nlohmann::json::object();
  std::filesystem::path vision_from;  // optional LLaVA folder: its vision tower (its vision_config
                                      // and feature settings) and, when the shapes fit, projector
  int64_t seed = 0;
};

/// The composed model (float32, CPU) with its tokenizer and what was done, for the log.
struct Composed {
  Pretrained pretrained;  // config, model, image settings (tokenizer_path: the LM's file)
  std::unique_ptr<data::Tokenizer> tokenizer;
  std::vector<std::string> notes;  // e.g. "added <image> = 49152; embeddings 49152 -> 49153 rows"
};

/// Builds a LLaVA model whose language model is the pretrained one, bit for bit: with no image
/// in the input its logits equal LlamaForCausalLM's on the first vocab_size ids. `<image>` is the
/// tokenizer's own token if it has one, else a new token at id len(tokenizer); the embedding
/// (and an untied lm_head) then grows by rows equal to the mean of the pretrained rows, as
/// transformers' resize_token_embeddings(mean_resizing=True) centres them (without its
/// covariance sampling). Throws Error(kUsage) naming the file or field (missing folder, not a
/// Llama config, a vlm_config key that belongs to the language model, unknown keys) and
/// Error(kData) for weights that do not fit the config (listed).
Composed compose_vlm(const ComposeOptions& opts);

}  // namespace mmpost::hub
