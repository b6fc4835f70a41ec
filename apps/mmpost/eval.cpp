// mmpost eval: greedy generation with the KV cache over a JSONL split, exact-match accuracy of
// the trimmed prediction against the final assistant turn. Per-sample predictions go to --out;
// the last line on stdout is one JSON object {"n", "accuracy", "samples_per_s", ...}.
// On preference JSONL (records with "chosen") it reports instead the reward accuracy and mean
// margin of the policy against --ref-model (rewards beta * log pi/ref, as DPO defines them).
#include <chrono>
#include <filesystem>
#include <iostream>

#include "mmpost/cli_common.h"
#include "mmpost/core/check.h"
#include "mmpost/core/device.h"
#include "mmpost/core/log.h"
#include "mmpost/data/chat_template.h"
#include "mmpost/hub/hf_folder.h"
#include "mmpost/io/jsonl.h"
#include "mmpost/train/evaluate.h"
#include "mmpost/stage_common.h"
#include "mmpost/train/preference.h"

namespace mmpost::cli {
namespace fs = std::filesystem;

namespace {
struct EvalArgs {
  std::string model_dir;
  std::string data;
  std::string out;
  std::string device = "auto";
  std::string dtype = "float32";
  int64_t max_new_tokens = 16;
  int64_t batch_size = 32;
  int64_t max_samples = 0;
  int64_t max_length = 2048;
  std::string chat_template = "auto";
  std::string metric = "exact_match";  // exact_match | perplexity
  int64_t num_workers = 2;
  int64_t num_threads = 0;
  std::string on_bad_sample = "error";
  std::string ref_model;   // preference data: reference policy (empty = reference-free)
  double beta = 0.1;       // preference data: DPO beta of the implicit reward
  std::vector<std::string> rewards;  // reward functions scored on each prediction
  double dist_timeout_s = 300;       // torchrun / srun launches
};

/// True when the first well-formed record of `path` is a preference pair (has "chosen").
bool is_preference_file(const std::string& path) {
  io::JsonlReader reader(path);
  io::JsonlRecord rec;
  while (reader.next(rec)) {
    if (rec.error.empty()) return rec.value.contains("chosen");
  }
  return false;
}

/// Reward accuracy / margins of the policy vs a reference on preference pairs.
int run_preference_eval(const EvalArgs& a, hub::Pretrained& p, data::SampleContext& ctx,
                        const torch::Device& device, torch::Dtype dtype, dist::ProcessGroup* pg) {
  MMPOST_CHECK_USAGE(a.beta > 0, "--beta: must be > 0, got ", a.beta);
  MMPOST_CHECK_USAGE(a.rewards.empty(), "--reward applies to prompt data; ", a.data,
                     " holds preference pairs");
  model::Vlm ref{nullptr};
  if (!a.ref_model.empty()) {
    ref = hub::load_pretrained(a.ref_model).model;
    MMPOST_CHECK_USAGE(ref->is_qwen2_vl() == p.model->is_qwen2_vl(), "--ref-model ",
                       a.ref_model, ": a ", ref->is_qwen2_vl() ? "Qwen2-VL family" : "LLaVA-style",
                       " model, but ", a.model_dir, " is not (both must read the same inputs)");
    ref->to(device, dtype);
    ref->eval();
  }
  train::PreferenceEvalOptions o;
  o.beta = a.beta;
  o.batch_size = a.batch_size;
  o.max_samples = a.max_samples;
  o.num_workers = a.num_workers;
  o.skip_bad = a.on_bad_sample == "skip";
  o.limits.max_length = a.max_length;
  o.pg = pg;  // torchrun / srun: each rank scores its share, every rank gets the sums
  log_info("eval: preference pairs in " + io::display_name(a.data) + "; policy " + a.model_dir + ", reference " +
           (a.ref_model.empty() ? std::string("none (reference-free)") : a.ref_model));
  auto start = std::chrono::steady_clock::now();
  auto r = train::evaluate_preferences(p.model, ref ? &ref : nullptr, ctx, a.data, o, device,
                                       dtype);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  log_info("eval: rewards/accuracies " + std::to_string(r.accuracy) + " rewards/margins " +
           std::to_string(r.margin) + " (" + std::to_string(r.n) + " pairs, " +
           std::to_string(r.n_skipped) + " skipped)");
  nlohmann::json result = {{"n", r.n},
                           {"rewards/accuracies", r.accuracy},
                           {"rewards/margins", r.margin},
                           {"rewards/chosen", r.reward_chosen},
                           {"rewards/rejected", r.reward_rejected},
                           {"logps/chosen", r.logps_chosen},
                           {"logps/rejected", r.logps_rejected},
                           {"n_skipped", r.n_skipped},
                           {"beta", a.beta},
                           {"samples_per_s", secs > 0 ? r.n / secs : 0.0},
                           {"model", a.model_dir},
                           {"ref_model", a.ref_model.empty() ? nlohmann::json() : nlohmann::json(a.ref_model)},
                           {"data", io::display_name(a.data)}};
  if (pg == nullptr || pg->rank() == 0) std::cout << result.dump() << std::endl;
  return 0;
}

int run_eval(EvalArgs a) {
  StdinSpool spool(a.data);  // --data -
  // ---- setup -------------------------------------------------------------------------------
  MMPOST_CHECK_USAGE(a.on_bad_sample == "error" || a.on_bad_sample == "skip",
                     "--on-bad-sample: \"", a.on_bad_sample, "\" is not one of error, skip");
  MMPOST_CHECK_USAGE(a.metric == "exact_match" || a.metric == "perplexity", "--metric: \"",
                     a.metric, "\" is not one of exact_match, perplexity");
  MMPOST_CHECK_USAGE(a.max_new_tokens > 0 && a.batch_size > 0 && a.num_workers > 0,
                     "--max-new-tokens, --batch-size and --num-workers must be > 0");
  if (a.num_threads > 0) torch::set_num_threads(static_cast<int>(a.num_threads));
  // Under torchrun / srun: each rank evaluates its share, rank 0 writes predictions and summary.
  auto dp = join_process_group(a.device, a.dist_timeout_s, "eval");
  const torch::Device device = dp.device;
  const torch::Dtype dtype = resolve_dtype(a.dtype, device);
  const bool main_rank = dp.world.rank == 0;

  // ---- model -------------------------------------------------------------------------------
  auto p = hub::load_pretrained(a.model_dir);
  const auto tokenizer_ptr = load_folder_tokenizer(*p.model, p.tokenizer_path, a.model_dir);
  data::Tokenizer& tokenizer = *tokenizer_ptr;
  p.model->to(device, dtype);
  p.model->eval();

  // ---- data + loop -------------------------------------------------------------------------
  data::SampleContext ctx;
  ctx.tokenizer = &tokenizer;
  ctx.template_options = template_options_for(*p.model, tokenizer, a.chat_template, true);
  ctx.image = p.image;
  ctx.max_length = a.max_length;
  if (is_preference_file(a.data)) {
    return run_preference_eval(a, p, ctx, device, dtype, dp.pg.get());
  }
  MMPOST_CHECK_USAGE(a.ref_model.empty(), "--ref-model applies to preference data; ", a.data,
                     " holds no \"chosen\"/\"rejected\" pairs");
  if (a.metric == "perplexity") {  // teacher-forced loss on the assistant turns
    MMPOST_CHECK_USAGE(a.rewards.empty() && a.out.empty(),
                       "--reward and --out apply to --metric exact_match");
    ctx.template_options.add_generation_prompt = false;
    train::LossEvalOptions lo;
    lo.batch_size = a.batch_size;
    lo.max_samples = a.max_samples;
    lo.num_workers = a.num_workers;
    lo.skip_bad = a.on_bad_sample == "skip";
    lo.pg = dp.pg.get();
    log_info("eval: perplexity of " + a.model_dir + " on " + io::display_name(a.data));
    auto r = train::evaluate_loss(p.model, ctx, a.data, lo, device, dtype);
    log_info("eval: loss " + std::to_string(r.loss) + " perplexity " +
             std::to_string(r.perplexity) + " (" + std::to_string(r.n_tokens) + " tokens of " +
             std::to_string(r.n) + " conversations, " + std::to_string(r.n_skipped) + " skipped)");
    if (main_rank) {
      std::cout << nlohmann::json({{"n", r.n}, {"n_tokens", r.n_tokens}, {"loss", r.loss},
                                   {"perplexity", r.perplexity}, {"n_skipped", r.n_skipped},
                                   {"model", a.model_dir}, {"data", io::display_name(a.data)}})
                       .dump()
                << std::endl;
    }
    return 0;
  }
  std::unique_ptr<io::JsonlWriter> preds;
  if (!main_rank) {
    // rank 0 writes
  } else if (a.out == "-") {  // predictions on stdout; the summary object stays the last line
    preds = std::make_unique<io::JsonlWriter>("-");
  } else if (!a.out.empty()) {
    if (fs::path(a.out).has_parent_path()) fs::create_directories(fs::path(a.out).parent_path());
    preds = std::make_unique<io::JsonlWriter>(a.out, io::JsonlWriter::Mode::kTruncate);
  }
  train::ExactMatchOptions eo;
  eo.batch_size = a.batch_size;
  eo.max_new_tokens = a.max_new_tokens;
  eo.max_samples = a.max_samples;
  eo.num_workers = a.num_workers;
  eo.skip_bad = a.on_bad_sample == "skip";
  eo.pg = dp.pg.get();
  eo.gather_predictions = !a.out.empty();
  if (!a.rewards.empty()) {
    nlohmann::json specs = nlohmann::json::array();
    for (const auto& name : a.rewards) {
      try {
        specs.push_back(name.front() == '{' ? nlohmann::json::parse(name)
                                            : nlohmann::json{{"name", name}});
      } catch (const nlohmann::json::exception& e) {
        throw Error(ErrorKind::kUsage, "--reward " + name + ": " + e.what());
      }
    }
    eo.rewards = algo::parse_reward_specs(specs, "--reward");
  }
  log_info("eval: " + a.model_dir + " on " + io::display_name(a.data) + " (" + describe_device(device) + ")");
  auto r = train::evaluate_exact_match(p.model, ctx, a.data, eo, device, dtype, preds.get());
  log_info("eval: accuracy " + std::to_string(r.accuracy) + " (" + std::to_string(r.n_correct) +
           "/" + std::to_string(r.n) + "), " + std::to_string(r.n_skipped) + " skipped, " +
           std::to_string(r.samples_per_s) + " samples/s");
  nlohmann::json result = {{"n", r.n},
                           {"accuracy", r.accuracy},
                           {"n_correct", r.n_correct},
                           {"n_skipped", r.n_skipped},
                           {"samples_per_s", r.samples_per_s},
                           {"model", a.model_dir},
                           {"data", io::display_name(a.data)}};
  for (const auto& [name, mean] : r.reward_means) {
    result["rewards/" + name] = mean;
    log_info("eval: rewards/" + name + " " + std::to_string(mean));
  }
  if (main_rank) std::cout << result.dump() << std::endl;
  return 0;
}
}  // namespace

Stage setup_eval(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "eval", "exact-match accuracy (+ rewards) of greedy generation; reward accuracy on pairs");
  static EvalArgs a;
  sub->add_option("--model,-m", a.model_dir, "model folder (HF layout)")->required();
  sub->add_option("--data,-d", a.data, "JSONL to evaluate (last assistant turn = reference); - reads stdin")
      ->required();
  sub->add_option("--out", a.out, "write per-sample predictions (JSONL) here; - writes them to stdout, before the "
                  "summary object (always the last stdout line)");
  sub->add_option("--max-new-tokens", a.max_new_tokens, "generation budget per sample")
      ->capture_default_str();
  sub->add_option("--batch-size", a.batch_size, "prompts per generation batch")
      ->capture_default_str();
  sub->add_option("--dist-timeout", a.dist_timeout_s,
                  "under torchrun/srun: seconds a rank waits for its peers")->capture_default_str();
  sub->add_option("--max-samples", a.max_samples, "evaluate at most the first N records (0 = all)")
      ->capture_default_str();
  sub->add_option("--max-length", a.max_length, "max prompt tokens")->capture_default_str();
  sub->add_option("--chat-template", a.chat_template,
                  "auto (the model folder's template, else llava) | llava | smollm2 | qwen2_vl | "
                  "llama3")
      ->capture_default_str();
  sub->add_option("--metric", a.metric,
                  "exact_match (greedy generation vs the final reply) | perplexity (teacher-"
                  "forced loss on every assistant reply: {loss, perplexity, n_tokens})")
      ->capture_default_str();
  sub->add_option("--device", a.device, "auto | cpu | cuda | cuda:N")->capture_default_str();
  sub->add_option("--dtype", a.dtype, "float32 | bfloat16")->capture_default_str();
  sub->add_option("--num-workers", a.num_workers, "preprocessing threads")->capture_default_str();
  sub->add_option("--num-threads", a.num_threads, "torch CPU threads (0 = default)")
      ->capture_default_str();
  sub->add_option("--on-bad-sample", a.on_bad_sample, "error | skip")->capture_default_str();
  sub->add_option("--reward", a.rewards,
                  "also score predictions with a reward function (repeatable): a name such as "
                  "numeric_match | format | exact_match, or a JSON spec {\"name\":..,\"params\":..}");
  sub->add_option("--ref-model", a.ref_model,
                  "preference data: reference model folder (default: reference-free rewards)");
  sub->add_option("--beta", a.beta, "preference data: beta of the implicit reward")
      ->capture_default_str();
  return {sub, [] { return run_eval(a); }};
}

}  // namespace mmpost::cli
