// Exact-match evaluation by greedy generation (see evaluate.h).
#include "mmpost/train/evaluate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <sstream>

#include "mmpost/algo/sft_loss.h"
#include "mmpost/core/check.h"
#include "mmpost/core/log.h"
#include "mmpost/data/collate.h"
#include "mmpost/data/loader.h"
#include "mmpost/model/generation.h"

namespace mmpost::train {

std::string trim(const std::string& s) {
  const char* ws = " \t\r\n\f\v";
  auto b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  auto e = s.find_last_not_of(ws);
  return s.substr(b, e - b + 1);
}

namespace {
/// Loader settings of an evaluation pass over `path`: each rank of opts.pg reads its share.
template <class Options>
data::LoaderOptions eval_loader_options(const std::string& path, const Options& opts) {
  data::LoaderOptions lo;
  lo.path = path;
  lo.batch_size = opts.batch_size;
  lo.num_workers = opts.num_workers;
  lo.skip_bad = opts.skip_bad;
  lo.max_records = opts.max_samples;
  if (opts.pg != nullptr && opts.pg->world_size() > 1) {
    lo.rank = opts.pg->rank();
    lo.world_size = opts.pg->world_size();
  }
  return lo;
}
}  // namespace

ExactMatchResult evaluate_exact_match(model::Vlm& model, const data::SampleContext& ctx,
                                      const std::string& path, const ExactMatchOptions& opts,
                                      const torch::Device& device, torch::Dtype dtype,
                                      io::JsonlWriter* preds) {
  auto start = std::chrono::steady_clock::now();
  data::SampleContext c = ctx;
  c.source = io::display_name(path);
  c.base_dir = io::relative_base(path);
  const auto lo = eval_loader_options(path, opts);
  const bool sharded = lo.world_size > 1;
  std::vector<std::pair<int64_t, std::string>> rows;  // sharded: (line, prediction row) to gather
  data::StreamingLoader<data::SftSample> loader(
      lo, [&c](const nlohmann::json& rec, int64_t line) {
        return data::make_sft_sample(rec, line, c, /*prompt_only=*/true);
      });
  int64_t total = data::count_records(path);
  if (opts.max_samples > 0) total = std::min(total, opts.max_samples);
  Progress progress("eval", total);

  const auto& tok = *ctx.tokenizer;
  model::GenerationConfig gen;
  gen.max_new_tokens = opts.max_new_tokens;
  gen.eos_token_ids = {tok.eos_id()};
  gen.pad_token_id = tok.pad_id() >= 0 ? tok.pad_id() : tok.eos_id();

  bool was_training = model->is_training();
  model->eval();
  torch::NoGradGuard no_grad;
  ExactMatchResult r;
  std::vector<double> reward_sums(opts.rewards.size(), 0.0);
  std::vector<std::string> reward_names;
  while (true) {
    auto samples = loader.next_batch();
    if (!samples) break;
    if (samples->empty()) continue;  // a window whose records were all skipped (or other ranks')
    auto batch = data::collate_prompts(*samples, gen.pad_token_id).to(device, dtype);
    auto out = model::generate(model, batch.input_ids, batch.attention_mask,
                               {batch.pixel_values, batch.image_grid_thw}, gen);
    auto seqs_t = out.sequences.cpu();
    auto lens_t = out.lengths.cpu();
    auto seqs = seqs_t.accessor<int64_t, 2>();
    auto lens = lens_t.accessor<int64_t, 1>();
    std::vector<std::string> texts, refs, prompts;
    std::vector<int64_t> n_tokens;
    for (size_t i = 0; i < samples->size(); ++i) {
      std::vector<int64_t> ids;
      for (int64_t k = 0; k < lens[i]; ++k) ids.push_back(seqs[i][k]);
      std::string pred = trim(tok.decode(ids));
      bool correct = pred == trim((*samples)[i].reference);
      r.n_correct += correct ? 1 : 0;
      ++r.n;
      const std::string& ref = (*samples)[i].reference;
      texts.push_back(pred);
      // The verifiers' reference: the record's "answer" (as rlhf uses), else the <answer> of the
      // final assistant turn, else that turn's text.
      refs.push_back(!(*samples)[i].answer.empty() ? (*samples)[i].answer
                                                   : algo::extract_answer(ref).value_or(ref));
      auto msgs = (*samples)[i].messages;  // the prompt the model saw, without the reference
      if (!msgs.empty() && msgs.back().role == "assistant") msgs.pop_back();
      data::TemplateOptions po = ctx.template_options;
      po.add_generation_prompt = true;
      prompts.push_back(data::render_conversation(msgs, tok, po));
      n_tokens.push_back(lens[i]);
      if (preds != nullptr || (sharded && opts.gather_predictions)) {
        nlohmann::json row = {{"id", (*samples)[i].id},
                              {"prediction", pred},
                              {"prediction_ids", ids},
                              {"reference", (*samples)[i].reference},
                              {"correct", correct}};
        if (sharded) {
          rows.emplace_back((*samples)[i].line, row.dump());
        } else {
          preds->write(row);
        }
      }
    }
    if (!opts.rewards.empty()) {
      auto scores = algo::score_all(opts.rewards, texts, refs, prompts, n_tokens);
      reward_names = scores.names;
      for (size_t k = 0; k < scores.values.size(); ++k) {
        reward_sums[k] += scores.values[k].sum().item<double>();
      }
    }
    if (opts.show_progress) {
      progress.update(r.n, "acc " + std::to_string(r.n ? double(r.n_correct) / r.n : 0.0));
    }
  }
  progress.finish();
  if (was_training) model->train();
  r.n_skipped = loader.n_skipped();
  if (sharded) {  // sum the counts, gather the predictions to rank 0 in line order
    std::vector<double> sums = {static_cast<double>(r.n), static_cast<double>(r.n_correct),
                                static_cast<double>(r.n_skipped)};
    sums.insert(sums.end(), reward_sums.begin(), reward_sums.end());
    sums = dist::sum_over_ranks(opts.pg, std::move(sums));
    r.n = static_cast<int64_t>(sums[0]);
    r.n_correct = static_cast<int64_t>(sums[1]);
    r.n_skipped = static_cast<int64_t>(sums[2]);
    std::copy(sums.begin() + 3, sums.end(), reward_sums.begin());
    if (opts.gather_predictions) {
      std::string mine;
      for (const auto& [line, row] : rows) mine += std::to_string(line) + "\t" + row + "\n";
      auto parts = opts.pg->all_gather_object(mine);
      if (preds != nullptr) {
        std::vector<std::pair<int64_t, std::string>> all;
        for (const auto& part : parts) {
          std::istringstream in(part);
          std::string l;
          while (std::getline(in, l)) {
            auto tab = l.find('\t');
            all.emplace_back(std::stoll(l.substr(0, tab)), l.substr(tab + 1));
          }
        }
        std::sort(all.begin(), all.end());
        for (const auto& [line, row] : all) preds->write(nlohmann::json::parse(row));
      }
    }
    if (reward_names.empty() && !opts.rewards.empty()) {  // this rank scored nothing
      std::map<std::string, int> seen;  // algo::score_all's names: repeats get _2, _3, ...
      for (const auto& spec : opts.rewards) {
        const int k = ++seen[spec.name];
        reward_names.push_back(k == 1 ? spec.name : spec.name + "_" + std::to_string(k));
      }
    }
  }
  r.accuracy = r.n > 0 ? static_cast<double>(r.n_correct) / r.n : 0.0;
  for (size_t k = 0; k < reward_names.size(); ++k) {
    r.reward_means[reward_names[k]] = r.n > 0 ? reward_sums[k] / r.n : 0.0;
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.samples_per_s = r.seconds > 0 ? r.n / r.seconds : 0.0;
  return r;
}

LossEvalResult evaluate_loss(model::Vlm& model, const data::SampleContext& ctx,
                             const std::string& path, const LossEvalOptions& opts,
                             const torch::Device& device, torch::Dtype dtype) {
  auto start = std::chrono::steady_clock::now();
  data::SampleContext c = ctx;
  c.source = io::display_name(path);
  c.base_dir = io::relative_base(path);
  const auto lo = eval_loader_options(path, opts);
  const bool sharded = lo.world_size > 1;
  data::StreamingLoader<data::SftSample> loader(
      lo, [&c](const nlohmann::json& rec, int64_t line) {
        return data::make_sft_sample(rec, line, c, /*prompt_only=*/false);
      });
  int64_t total = data::count_records(path);
  if (opts.max_samples > 0) total = std::min(total, opts.max_samples);
  Progress progress("eval", total);
  const auto& tok = *ctx.tokenizer;
  const int64_t pad = tok.pad_id() >= 0 ? tok.pad_id() : tok.eos_id();
  const bool was_training = model->is_training();
  model->eval();
  torch::NoGradGuard no_grad;
  LossEvalResult r;
  double loss_sum = 0.0;
  while (true) {
    auto samples = loader.next_batch();
    if (!samples) break;
    if (samples->empty()) continue;
    auto batch = data::collate(*samples, pad).to(device, dtype);
    auto logits = model->forward(batch.input_ids, {batch.pixel_values, batch.image_grid_thw},
                                 batch.attention_mask);
    loss_sum += algo::sft_loss_sum(logits, batch.labels).item<double>();
    r.n_tokens += algo::n_supervised_targets(batch.labels);
    r.n += static_cast<int64_t>(samples->size());
    if (opts.show_progress) {
      progress.update(r.n, "loss " + std::to_string(r.n_tokens ? loss_sum / r.n_tokens : 0.0));
    }
  }
  progress.finish();
  if (was_training) model->train();
  r.n_skipped = loader.n_skipped();
  if (sharded) {
    auto sums = dist::sum_over_ranks(
        opts.pg, {loss_sum, static_cast<double>(r.n_tokens), static_cast<double>(r.n),
                  static_cast<double>(r.n_skipped)});
    loss_sum = sums[0];
    r.n_tokens = static_cast<int64_t>(sums[1]);
    r.n = static_cast<int64_t>(sums[2]);
    r.n_skipped = static_cast<int64_t>(sums[3]);
  }
  MMPOST_CHECK_DATA(r.n_tokens > 0, io::display_name(path),
                    ": no supervised token (no assistant reply) to compute a loss on");
  r.loss = loss_sum / static_cast<double>(r.n_tokens);
  r.perplexity = std::exp(r.loss);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

}  // namespace mmpost::train
