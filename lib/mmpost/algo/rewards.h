// Rule-based rewards for RLHF/GRPO (`mmpost rlhf`): a small registry of verifiers (exact,
// numeric and multiple-choice answers, a format regex, DAPO's overlong penalty, an external
// command) that a recipe selects and weights. Verifiers are pure functions of text; score_all
// runs a spec list over a batch and returns each function's scores plus the weighted total.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

namespace mmpost::algo {

/// One verifier; names (parse/to_string) are the recipe's `name` strings.
enum class RewardKind {
  kExactMatch,
  kNumericMatch,
  kChoiceMatch,
  kFormat,
  kLengthPenalty,
  kExternal
};

/// "exact_match" -> kExactMatch, ... Throws Error(kUsage) listing the valid names.
RewardKind parse_reward_kind(const std::string& name);
std::string to_string(RewardKind kind);
/// All valid names, comma-separated, in enum order (for errors and --help).
std::string reward_kind_names();

/// DeepSeek-R1-style "<think>...</think> <answer>...</answer>" (ECMAScript, whole completion).
inline constexpr const char* kDefaultFormatPattern =
    R"(^<think>[\s\S]*?</think>\s*<answer>[\s\S]*?</answer>$)";

/// Every verifier's parameters with their defaults; a spec reads only its own kind's keys.
struct RewardParams {
  double abs_tol = 1e-6;         // numeric_match: |pred - ref| <= max(abs_tol, rel_tol * |ref|)
  double rel_tol = 0.0;          // numeric_match
  std::string choices = "ABCD";  // choice_match: valid option letters (upper case)
  std::string pattern = kDefaultFormatPattern;  // format: std::regex, ECMAScript, full match
  int64_t max_len = 0;     // length_penalty: DAPO L_max in tokens (required, > 0)
  int64_t cache_len = 0;   // length_penalty: DAPO L_cache in tokens (required, 1..max_len)
  std::string command;     // external: run as `/bin/sh -c command` (required)
  double timeout_s = 600;  // external: kill the command after this many seconds (0: none)
};

/// One weighted verifier of a recipe: {"name": "numeric_match", "weight": 1, "params": {...}}.
struct RewardSpec {
  std::string name;  // registry name, as written
  RewardKind kind = RewardKind::kExactMatch;
  double weight = 1.0;
  nlohmann::json params = nlohmann::json::object();  // as written (for the resolved recipe)
  RewardParams p;                                    // params resolved over the defaults
};

/// Parses a JSON array of specs strictly: unknown reward names, unknown keys or params, wrong
/// types, missing required params and bad values (a regex that does not compile, cache_len >
/// max_len) throw Error(kUsage) naming the JSON path, e.g. "rewards[1].params.abs_tol", and
/// listing the valid names. An empty list is an error.
std::vector<RewardSpec> parse_reward_specs(const nlohmann::json& j,
                                           const std::string& path = "rewards");

// ---- text helpers (exposed for tests and for eval's answer extraction) --------------------------

/// Text of the last complete <answer>...</answer> pair, or nullopt when there is none.
std::optional<std::string> extract_answer(const std::string& text);
/// Trims and collapses every run of ASCII whitespace to one space.
std::string normalize_whitespace(const std::string& text);
/// Maps Unicode decimal digits (Nd: Arabic-Indic, Devanagari, fullwidth, ... see rewards.cpp) to
/// ASCII '0'..'9', and the minus sign U+2212, fullwidth '－' '．' '，' and the Arabic decimal and
/// thousands separators to '-', '.', ','. Other text (and invalid UTF-8) passes through unchanged.
std::string normalize_digits(const std::string& text);
/// The last number in `text` after normalize_digits: [+-] digits with optional thousands groups
/// ("1,234"), optional fraction (".5", "3.25") and exponent ("1e-3"). "3,5" is two numbers.
std::optional<double> parse_last_number(const std::string& text);
/// The option letter a completion picks ("(B)", "B.", "answer: b", "The answer is C"), upper
/// case, or nullopt. Only letters in `choices` count.
std::optional<char> extract_choice(const std::string& text, const std::string& choices = "ABCD");

// ---- verifiers: (completion, reference[, params]) -> reward
// --------------------------------------

/// 1 if the <answer> text (else the whole completion) equals `reference`, both whitespace-
/// normalized (case-sensitive), else 0.
float exact_match(const std::string& completion, const std::string& reference);
/// 1 if the last number of the <answer> text (else the completion) is within tolerance of the
/// last number of `reference`, else 0 (also 0 when the completion has no number). Throws
/// Error(kData) when the reference holds no number.
float numeric_match(const std::string& completion, const std::string& reference,
                    double abs_tol = 1e-6, double rel_tol = 0.0);
/// 1 if extract_choice of the <answer> text (else the completion) equals the reference's letter.
/// Throws Error(kData) when the reference names no valid letter.
float choice_match(const std::string& completion, const std::string& reference,
                   const std::string& choices = "ABCD");
/// 1 if the whole completion matches `pattern` (ECMAScript std::regex_match), else 0. The default
/// pattern is matched by equivalent hand-written code (any length); custom patterns score 0 on
/// completions over 8 KiB, where libstdc++'s recursive std::regex could overflow the stack.
float format_reward(const std::string& completion,
                    const std::string& pattern = kDefaultFormatPattern);
/// DAPO soft overlong punishment, Yu et al. 2025, arXiv:2503.14476, Eq. 13, on token counts:
/// 0 for n <= L_max - L_cache; ((L_max - L_cache) - n) / L_cache in (L_max - L_cache, L_max];
/// -1 for n > L_max.
float overlong_penalty(int64_t n_tokens, int64_t max_len, int64_t cache_len);

/// One completion as the external scorer sees it (one JSON object per line on its stdin).
struct ExternalItem {
  std::string id, prompt, completion, reference;
};
/// Runs `/bin/sh -c command` with `items` as JSONL on stdin (written from a temp file, so large
/// batches cannot deadlock) and reads one float per line from stdout. Throws Error(kRuntime)
/// naming the command when it cannot start, exits non-zero, is killed, times out, prints a
/// line that is not a finite number (quoting line number and text) or the wrong number of lines.
/// The command runs in its own process group (killed as a whole on timeout); its stderr is ours.
std::vector<float> external_scores(const std::string& command,
                                   const std::vector<ExternalItem>& items, double timeout_s = 600);

/// One spec on one completion (every kind but external). `n_tokens` is read by length_penalty.
float score_one(const RewardSpec& spec, const std::string& completion, const std::string& reference,
                const std::string& prompt, int64_t n_tokens);

struct RewardScores {
  std::vector<std::string> names;     // one per spec; repeats get "_2", "_3" ("external_2")
  std::vector<torch::Tensor> values;  // per spec [N] float32, unweighted
  torch::Tensor total;                // [N] float32, sum_k weight_k * values[k]
};

/// Scores N completions with every spec. `references` and `prompts` have N entries;
/// `token_counts` has N entries or is empty when no spec is length_penalty. Throws
/// Error(kRuntime) for mismatched sizes and whatever the verifiers throw (with the row index).
RewardScores score_all(const std::vector<RewardSpec>& specs,
                       const std::vector<std::string>& completions,
                       const std::vector<std::string>& references,
                       const std::vector<std::string>& prompts,
                       const std::vector<int64_t>& token_counts);

}  // namespace mmpost::algo
