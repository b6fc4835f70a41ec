// mmpost generate: sampled completions for a JSONL of prompts (the rollout half of GRPO/RLOO as a
// command). Each prompt is repeated --num-generations times; every completion is one JSON object
// on stdout, flushed per batch so the output streams into pipelines (`| head -1` ends it
// quietly); logs and progress go to stderr.
#include <algorithm>
#include <csignal>
#include <sstream>
#include <tuple>
#include <filesystem>
#include <iostream>

#include "mmpost/cli_common.h"
#include "mmpost/stage_common.h"
#include "mmpost/core/check.h"
#include "mmpost/core/device.h"
#include "mmpost/core/log.h"
#include "mmpost/data/chat_template.h"
#include "mmpost/data/collate.h"
#include "mmpost/data/loader.h"
#include "mmpost/data/sft_dataset.h"
#include "mmpost/hub/hf_folder.h"
#include "mmpost/io/jsonl.h"
#include "mmpost/model/generation.h"

namespace mmpost::cli {
namespace fs = std::filesystem;

namespace {
struct GenerateArgs {
  std::string model_dir;
  std::string data;
  std::string device = "auto";
  std::string dtype = "float32";
  int64_t max_new_tokens = 64;
  double temperature = 1.0;  // TRL GRPOConfig / vLLM default; 0 = greedy
  double top_p = 1.0;
  int64_t top_k = 0;
  int64_t num_generations = 1;
  std::vector<std::string> stops;
  int64_t seed = 0;
  int64_t batch_size = 8;  // prompts per batch (B * num_generations rows are generated)
  int64_t max_samples = 0;
  int64_t max_length = 2048;
  std::string chat_template = "auto";
  int64_t num_workers = 2;
  std::string on_bad_sample = "error";
  double dist_timeout_s = 300;  // torchrun / srun launches
};

/// A prompt and whether its record carried a reference reply.
struct PromptSample {
  data::SftSample sample;  // messages: the prompt turns only
  bool has_reference = false;
};

// TRL conversational records: a final assistant turn is the reference and is dropped from the
// prompt (as in eval); otherwise every message is prompt. The second case goes through the same
// make_sft_sample prompt path with an empty assistant turn appended, so validation, image loading
// and FILE:LINE errors are eval's.
PromptSample make_prompt_sample(const nlohmann::json& record, int64_t line,
                                const data::SampleContext& ctx) {
  const nlohmann::json* msgs =
      record.is_object() && record.contains("messages") ? &record["messages"] : nullptr;
  const bool open_ended = msgs != nullptr && msgs->is_array() && !msgs->empty() &&
                          msgs->back().is_object() &&
                          !(msgs->back().contains("role") && msgs->back()["role"] == "assistant");
  PromptSample p;
  if (open_ended) {
    nlohmann::json with_reply = record;
    with_reply["messages"].push_back(
        nlohmann::json::object({{"role", "assistant"}, {"content", ""}}));
    p.sample = data::make_sft_sample(with_reply, line, ctx, /*prompt_only=*/true);
    p.sample.reference.clear();
  } else {
    p.sample = data::make_sft_sample(record, line, ctx, /*prompt_only=*/true);
    p.has_reference = true;
  }
  p.sample.messages.pop_back();  // the reference (or the empty placeholder) turn
  return p;
}

void validate(const GenerateArgs& a) {
  MMPOST_CHECK_USAGE(a.on_bad_sample == "error" || a.on_bad_sample == "skip",
                     "--on-bad-sample: \"", a.on_bad_sample, "\" is not one of error, skip");
  MMPOST_CHECK_USAGE(a.max_new_tokens > 0, "--max-new-tokens must be > 0, got ", a.max_new_tokens);
  MMPOST_CHECK_USAGE(a.batch_size > 0, "--batch-size must be > 0, got ", a.batch_size);
  MMPOST_CHECK_USAGE(a.num_generations > 0, "--num-generations must be > 0, got ",
                     a.num_generations);
  MMPOST_CHECK_USAGE(a.num_workers > 0, "--num-workers must be > 0, got ", a.num_workers);
  MMPOST_CHECK_USAGE(a.temperature >= 0.0, "--temperature must be >= 0 (0 = greedy), got ",
                     a.temperature);
  MMPOST_CHECK_USAGE(a.top_p > 0.0 && a.top_p <= 1.0, "--top-p must be in (0, 1], got ", a.top_p);
  MMPOST_CHECK_USAGE(a.top_k >= 0, "--top-k must be >= 0 (0 = off), got ", a.top_k);
  MMPOST_CHECK_USAGE(a.seed >= 0, "--seed must be >= 0, got ", a.seed);
  MMPOST_CHECK_USAGE(a.max_samples >= 0, "--max-samples must be >= 0, got ", a.max_samples);
  for (const auto& s : a.stops) MMPOST_CHECK_USAGE(!s.empty(), "--stop: empty stop string");
  MMPOST_CHECK_USAGE(fs::is_regular_file(a.data), "--data ", a.data, ": no such file");
}

/// Prefixes each of the window's output lines with "line\tsample\t" (lines hold G rows per
/// prompt, in prompt order).
std::string tag_lines(const std::string& lines, const std::vector<PromptSample>& prompts,
                      int64_t G) {
  std::istringstream in(lines);
  std::string out, l;
  for (size_t i = 0; i < prompts.size(); ++i) {
    for (int64_t g = 0; g < G && std::getline(in, l); ++g) {
      out += std::to_string(prompts[i].sample.line) + "\t" + std::to_string(g) + "\t" + l + "\n";
    }
  }
  return out;
}

/// The tagged lines of every rank, ordered by (line, sample), tags removed.
std::string merge_tagged(const std::vector<std::string>& parts) {
  std::vector<std::tuple<int64_t, int64_t, std::string>> rows;
  for (const auto& part : parts) {
    std::istringstream in(part);
    std::string l;
    while (std::getline(in, l)) {
      const auto t1 = l.find('\t'), t2 = l.find('\t', t1 + 1);
      rows.emplace_back(std::stoll(l.substr(0, t1)), std::stoll(l.substr(t1 + 1, t2 - t1 - 1)),
                        l.substr(t2 + 1));
    }
  }
  std::sort(rows.begin(), rows.end());
  std::string out;
  for (const auto& r : rows) out += std::get<2>(r) + "\n";
  return out;
}

int run_generate(GenerateArgs a) {
  // ---- setup -------------------------------------------------------------------------------
  StdinSpool spool(a.data);  // --data -
  validate(a);
  // A closed stdout (`| head`) must end the run, not kill it mid-write: writes then fail with
  // EPIPE, which the loop below checks after each flush.
  std::signal(SIGPIPE, SIG_IGN);
  // Under torchrun / srun each rank generates for its share of the prompts; rank 0 prints every
  // completion, in input order, window by window.
  auto dp = join_process_group(a.device, a.dist_timeout_s, "generate");
  MMPOST_CHECK_USAGE(!dp.pg || a.data != "-", "generate: --data - (stdin) needs one process");
  const bool sharded = dp.pg != nullptr, main_rank = dp.world.rank == 0;
  const torch::Device device = dp.device;
  const torch::Dtype dtype = resolve_dtype(a.dtype, device);
  if (a.num_generations > 1 && a.temperature == 0.0) {
    log_warn("generate: --temperature 0 is greedy: all " + std::to_string(a.num_generations) +
             " completions of a prompt will be identical");
  }

  // ---- model -------------------------------------------------------------------------------
  auto p = hub::load_pretrained(a.model_dir);
  const auto tokenizer_ptr = load_folder_tokenizer(*p.model, p.tokenizer_path, a.model_dir);
  data::Tokenizer& tokenizer = *tokenizer_ptr;
  p.model->to(device, dtype);
  p.model->eval();

  // ---- data --------------------------------------------------------------------------------
  data::SampleContext ctx;
  ctx.tokenizer = &tokenizer;
  ctx.template_options = template_options_for(*p.model, tokenizer, a.chat_template, true);
  ctx.image = p.image;
  ctx.max_length = a.max_length;
  ctx.source = io::display_name(a.data);
  ctx.base_dir = io::relative_base(a.data);
  data::LoaderOptions lo;
  lo.path = a.data;
  lo.batch_size = a.batch_size;
  lo.num_workers = a.num_workers;
  lo.skip_bad = a.on_bad_sample == "skip";
  lo.max_records = a.max_samples;
  lo.rank = dp.world.rank;
  lo.world_size = dp.world.world_size;
  data::StreamingLoader<PromptSample> loader(lo, [&ctx](const nlohmann::json& rec, int64_t line) {
    return make_prompt_sample(rec, line, ctx);
  });
  data::TemplateOptions render_opts = ctx.template_options;
  render_opts.add_generation_prompt = true;

  // ---- generation settings -----------------------------------------------------------------
  model::GenerationConfig gen;
  gen.max_new_tokens = a.max_new_tokens;
  gen.temperature = a.temperature;
  gen.top_p = a.top_p;
  gen.top_k = a.top_k;
  gen.eos_token_ids = {tokenizer.eos_id()};
  gen.pad_token_id = tokenizer.pad_id() >= 0 ? tokenizer.pad_id() : tokenizer.eos_id();
  if (!a.stops.empty()) {
    // HF StopStringCriteria semantics: stop once the decoded completion contains a stop string,
    // keeping it (and the rest of the token that completed it) in the output.
    gen.stop_check = [&tokenizer, &a](const std::vector<int64_t>& ids) {
      const std::string text = tokenizer.decode(ids);
      return std::any_of(a.stops.begin(), a.stops.end(), [&](const std::string& s) {
        return text.find(s) != std::string::npos;
      });
    };
  }
  int64_t total = data::count_records(a.data);
  if (a.max_samples > 0) total = std::min(total, a.max_samples);
  log_info("generate: " + a.model_dir + " on " + io::display_name(a.data) + " (" + std::to_string(total) +
           " prompts x " + std::to_string(a.num_generations) + ", " + describe_device(device) +
           ")");

  // ---- loop: batch -> repeat G times -> generate -> one JSON line per completion -----------
  torch::NoGradGuard no_grad;
  Progress progress("generate", total);
  progress.update(0);  // starts its clock here: tokens/s below covers every batch, the first too
  const int64_t G = a.num_generations;
  int64_t n_prompts = 0, n_completions = 0, n_tokens = 0;
  while (true) {
    auto prompts = loader.next_batch();
    if (!prompts) break;
    // A window whose records were all skipped (or, sharded, other ranks'): nothing to generate,
    // but a sharded rank still joins the window's gather below.
    if (prompts->empty() && !sharded) continue;
    std::string lines;
    if (!prompts->empty()) {
      std::vector<data::SftSample> samples;
      std::vector<int64_t> image_counts;
      for (const auto& q : *prompts) {
        samples.push_back(q.sample);
        image_counts.push_back(q.sample.image_grid_thw.defined() ? q.sample.image_grid_thw.size(0)
                               : q.sample.pixel_values.defined() ? q.sample.pixel_values.size(0)
                                                                 : 0);
      }
      auto batch = data::collate_prompts(samples, gen.pad_token_id).to(device, dtype);
      auto rep = model::repeat_interleave_batch(batch.input_ids, batch.attention_mask,
                                                {batch.pixel_values, batch.image_grid_thw},
                                                image_counts, G);  // [B*G, T]
      // One seed per completion, from (seed, prompt line, sample) only: reruns with the same flags
      // repeat, whatever the batch size or the number of ranks.
      gen.row_seeds.clear();
      for (const auto& q : *prompts) {
        for (int64_t g = 0; g < G; ++g) {
          gen.row_seeds.push_back(data::sample_seed(static_cast<uint64_t>(a.seed), q.sample.line, g));
        }
      }
      auto out = model::generate(p.model, rep.input_ids, rep.attention_mask,
                                 {rep.pixel_values, rep.image_grid_thw}, gen);
      auto seqs_t = out.sequences.cpu();
      auto lens_t = out.lengths.cpu();
      auto reason_t = out.finish_reason.cpu();
      auto logp_sum_t = out.logps.sum(/*dim=*/1).to(torch::kCPU, torch::kFloat64);  // [B*G]
      auto seqs = seqs_t.accessor<int64_t, 2>();

      for (size_t i = 0; i < prompts->size(); ++i) {
        const auto& q = (*prompts)[i];
        const std::string prompt_text =
            data::render_conversation(q.sample.messages, tokenizer, render_opts);
        for (int64_t g = 0; g < G; ++g) {
          const int64_t r = static_cast<int64_t>(i) * G + g;
          const int64_t len = lens_t[r].item<int64_t>();
          std::vector<int64_t> ids(&seqs[r][0], &seqs[r][0] + len);
          nlohmann::json j = {
              {"id", q.sample.id},
              {"sample", g},
              {"prompt", prompt_text},
              {"completion", tokenizer.decode(ids)},
              {"tokens", ids},
              {"n_tokens", len},
              {"logps", logp_sum_t[r].item<double>()},
              {"finish_reason", model::finish_reason_name(
                                    static_cast<model::FinishReason>(reason_t[r].item<int64_t>()))}};
          if (q.has_reference) j["reference"] = q.sample.reference;
          // A cut-off completion can end inside a UTF-8 sequence: replace, don't throw.
          lines += j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
          n_tokens += len;
        }
      }
    }  // this rank's prompts of the window
    const auto n_local = static_cast<int64_t>(prompts->size());
    n_prompts += n_local;
    n_completions += n_local * G;
    if (sharded) {  // rank 0 prints the window's completions of every rank, in line order
      const std::string tagged = tag_lines(lines, *prompts, G);
      auto parts = dp.pg->all_gather_object(tagged);
      lines = main_rank ? merge_tagged(parts) : std::string();
    }
    if (!main_rank) continue;
    std::cout << lines << std::flush;
    if (!std::cout) {
      log_info("generate: stdout closed; stopping after " + std::to_string(n_completions) +
               " completions");
      return 0;
    }
    progress.update(n_prompts, std::to_string(n_completions) + " completions");
  }
  progress.finish();
  const double secs = progress.elapsed_s();
  log_info("generate: " + std::to_string(n_completions) + " completions for " +
           std::to_string(n_prompts) + " prompts, " + std::to_string(n_tokens) + " tokens, " +
           std::to_string(loader.n_skipped()) + " skipped, " +
           std::to_string(secs > 0 ? n_tokens / secs : 0.0) + " tokens/s");
  return 0;
}
}  // namespace

Stage setup_generate(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "generate", "sample completions for JSONL prompts; one JSON object per completion on stdout");
  static GenerateArgs a;
  sub->add_option("--model,-m", a.model_dir, "model folder (HF layout)")->required();
  sub->add_option("--data,-d", a.data,
                  "prompts JSONL (TRL messages; a final assistant turn is the reference); - reads stdin")
      ->required();
  sub->add_option("--max-new-tokens", a.max_new_tokens, "generation budget per completion")
      ->capture_default_str();
  sub->add_option("--temperature", a.temperature, "sampling temperature (0 = greedy)")
      ->capture_default_str();
  sub->add_option("--top-p", a.top_p, "nucleus mass kept (1 = off)")->capture_default_str();
  sub->add_option("--top-k", a.top_k, "keep the k most likely tokens (0 = off)")
      ->capture_default_str();
  sub->add_option("--num-generations", a.num_generations, "completions per prompt")
      ->capture_default_str();
  sub->add_option("--stop", a.stops,
                  "stop a completion once its text contains STR (kept in the output; repeatable)");
  sub->add_option("--seed", a.seed, "sampling seed")->capture_default_str();
  sub->add_option("--batch-size", a.batch_size,
                  "prompts per batch (batch-size x num-generations rows)")
      ->capture_default_str();
  sub->add_option("--max-samples", a.max_samples, "use at most the first N prompt records (0 = all)")
      ->capture_default_str();
  sub->add_option("--max-length", a.max_length, "max prompt tokens")->capture_default_str();
  sub->add_option("--chat-template", a.chat_template,
                  "auto (the model folder's template, else llava) | llava | smollm2 | qwen2_vl | "
                  "llama3")
      ->capture_default_str();
  sub->add_option("--device", a.device, "auto | cpu | cuda | cuda:N")->capture_default_str();
  sub->add_option("--dtype", a.dtype, "float32 | bfloat16")->capture_default_str();
  sub->add_option("--num-workers", a.num_workers, "preprocessing threads")->capture_default_str();
  sub->add_option("--on-bad-sample", a.on_bad_sample, "error | skip")->capture_default_str();
  sub->add_option("--dist-timeout", a.dist_timeout_s,
                  "under torchrun/srun: seconds a rank waits for its peers")->capture_default_str();
  return {sub, [] { return run_generate(a); }};
}

}  // namespace mmpost::cli
