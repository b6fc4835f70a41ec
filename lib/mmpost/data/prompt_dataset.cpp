// Prompt datasets for online RL (see prompt_dataset.h).
#include "mmpost/data/prompt_dataset.h"

#include "mmpost/core/check.h"
#include "mmpost/core/log.h"
#include "mmpost/io/jsonl.h"

namespace mmpost::data {

SftSample make_prompt_sample(nlohmann::json rec, int64_t line, const SampleContext& ctx) {
  if (rec.is_object() && rec.contains("messages") && rec["messages"].is_array() &&
      !rec["messages"].empty() && rec["messages"].back().value("role", "") != "assistant") {
    rec["messages"].push_back({{"role", "assistant"}, {"content", ""}});
  }
  return make_sft_sample(rec, line, ctx, /*prompt_only=*/true);
}

std::string reference_of(const nlohmann::json& rec, const SftSample& s) {
  if (rec.contains("answer")) {
    const auto& a = rec["answer"];
    MMPOST_CHECK_DATA(a.is_string() || a.is_number(), "answer: expected a string or a number, got ",
                      a.type_name());
    return s.answer;
  }
  return algo::extract_answer(s.reference).value_or(s.reference);
}

PromptPool load_prompts(const std::string& path, const SampleContext& ctx, bool skip_bad,
                        const std::vector<algo::RewardSpec>& specs) {
  PromptPool pool;
  SampleContext c = ctx;
  c.load_images = false;  // schema and length checks now; images are decoded per batch
  io::JsonlReader reader(path);
  io::JsonlRecord rec;
  while (reader.next(rec)) {
    try {
      MMPOST_CHECK_DATA(rec.error.empty(), rec.error);
      auto s = make_prompt_sample(rec.value, rec.line, c);
      int64_t d = 0;
      if (rec.value.contains("difficulty")) {
        MMPOST_CHECK_DATA(rec.value["difficulty"].is_number_integer(), io::location(path, rec.line),
                          ": difficulty: expected an integer");
        d = rec.value["difficulty"].get<int64_t>();
      }
      std::string ref;
      try {
        ref = reference_of(rec.value, s);
      } catch (const Error& e) {
        throw Error(e.kind(), io::location(path, rec.line) + ": " + e.message());
      }
      for (const auto& spec : specs) {  // a reference a verifier cannot read fails here, located
        if (spec.kind != algo::RewardKind::kNumericMatch &&
            spec.kind != algo::RewardKind::kChoiceMatch) {
          continue;
        }
        try {
          algo::score_one(spec, "", ref, "", 0);
        } catch (const Error& e) {
          throw Error(ErrorKind::kData, io::location(path, rec.line) + ": reference \"" + ref +
                                            "\": " + e.message());
        }
      }
      pool.references.push_back(ref);
      pool.records.push_back(std::move(rec.value));
      pool.lines.push_back(rec.line);
      pool.difficulty.push_back(d);
    } catch (const Error& e) {
      if (!skip_bad || e.kind() != ErrorKind::kData) throw;
      ++pool.n_skipped;
      log_warn(std::string("rlhf: skipping bad prompt: ") + e.what());
    }
  }
  MMPOST_CHECK_DATA(!pool.records.empty(), path, ": no usable prompts");
  return pool;
}

}  // namespace mmpost::data
