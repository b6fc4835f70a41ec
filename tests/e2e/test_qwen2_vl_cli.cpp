// A Qwen2-VL model through the CLI: a hub folder (random tiny weights, the Qwen2 byte-level BPE
// tokenizer with the vision tokens) trained by `mmpost sft` on real photos of different sizes
// (several images per sample, multi-turn), then `eval` (exact match, perplexity) and `generate`
// on the saved folder. The first step's loss must equal the loss of the start model computed
// here in-process on the same samples (all of them form the first batch). Then the preference
// and RL stages (dpo, eval on pairs, rm, rlhf with a function and a Qwen2-VL reward model), and
// the invariants their shared forwards rest on: a concatenated preference batch (one vision pass
// per pair, M-RoPE positions from the repeated grids) gives each row the log-probs of that row
// run alone; the teacher-forced forward over left-padded prompts + sampled completions gives
// the log-probs the KV-cached sampling saw.
#include "catch.h"
#include "e2e_util.h"
#include "test_util.h"

#include "mmpost/algo/logprobs.h"
#include "mmpost/algo/sft_loss.h"
#include "mmpost/data/preference_dataset.h"
#include "mmpost/hub/reward_model_folder.h"
#include "mmpost/train/preference.h"
#include "mmpost/train/rollout.h"
#include "mmpost/data/collate.h"
#include "mmpost/data/sft_dataset.h"
#include "mmpost/hub/hf_folder.h"
#include "mmpost/hub/qwen2_vl_folder.h"
#include "mmpost/io/checkpoint.h"
#include "mmpost/io/safetensors.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace e2e_test_qwen2_vl_cli {

using namespace mmpost;
using namespace mmpost::testing;
namespace fs = std::filesystem;

namespace {
constexpr int64_t kVisionStart = 600, kVisionEnd = 601, kImagePad = 602, kVideoPad = 603;

// DIR/tok: the Qwen2 BPE fixture (600 ids) plus the vision tokens, EOS <|im_end|>.
fs::path write_tokenizer(const fs::path& dir) {
  const auto tok = dir / "tok";
  fs::create_directories(tok);
  auto j = read_json_file(kGoldenFixtures / "bpe/qwen2/tokenizer.json");
  int64_t id = kVisionStart;
  for (const char* t : {"<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"}) {
    j["added_tokens"].push_back({{"id", id++}, {"content", t}, {"single_word", false},
                                 {"lstrip", false}, {"rstrip", false}, {"normalized", false},
                                 {"special", true}});
  }
  io::write_text_atomic(tok / "tokenizer.json", j.dump());
  io::write_text_atomic(tok / "tokenizer_config.json",
                        nlohmann::json{{"eos_token", "<|im_end|>"}, {"pad_token", "<|endoftext|>"},
                                       {"tokenizer_class", "Qwen2Tokenizer"}}
                            .dump());
  return tok;
}

data::Qwen2VLImageConfig image_config() {
  data::Qwen2VLImageConfig c;
  c.patch_size = 14;
  c.merge_size = 2;
  c.temporal_patch_size = 2;
  c.min_pixels = 28 * 28 * 4;
  c.max_pixels = 28 * 28 * 12;  // at most 12 merged tokens per image
  return c;
}

// DIR/start: a tiny random Qwen2-VL folder (the golden fixture's sizes, 608 ids);
// `fixture` "qwen2_5_vl_tiny" gives a Qwen2.5-VL one (window attention, SwiGLU vision blocks).
fs::path write_start_model(const fs::path& dir, const std::string& fixture = "qwen2_vl_tiny") {
  auto cj = read_json_file(kGoldenFixtures / fixture / "config.json");
  cj["text_config"]["vocab_size"] = 608;
  cj["text_config"]["eos_token_id"] = 2;
  cj["image_token_id"] = kImagePad;
  cj["video_token_id"] = kVideoPad;
  cj["vision_start_token_id"] = kVisionStart;
  cj["vision_end_token_id"] = kVisionEnd;
  const auto cfg = model::qwen2_vl_config_from_json(cj);
  torch::manual_seed(3);
  auto m = model::build_qwen2_vl(cfg);
  const auto out = dir / "start";
  hub::save_qwen2_vl_pretrained(out, *m, image_config(), write_tokenizer(dir));
  return out;
}

nlohmann::json message(const std::string& role, const std::string& content) {
  return {{"role", role}, {"content", content}};
}

// Real photos of different sizes and aspect ratios; one sample has two images over two turns.
fs::path write_data(const fs::path& dir) {
  const auto photos = kGoldenFixtures / "qwen2_vl_processor";
  auto img = [&](const char* name) { return (photos / name).string(); };
  const auto path = dir / "photos.jsonl";
  std::ofstream out(path);
  out << nlohmann::json{{"images", {img("chelsea.png")}},
                        {"messages", {message("user", "<image>\nWhat animal is this?"),
                                      message("assistant", "a cat")}}}
             .dump()
      << "\n";
  out << nlohmann::json{{"images", {img("rocket.png"), img("astronaut.png")}},
                        {"messages", {message("user", "<image>\nWhat is this?"),
                                      message("assistant", "a rocket"),
                                      message("user", "<image>And this?"),
                                      message("assistant", "an astronaut")}}}
             .dump()
      << "\n";
  out << nlohmann::json{{"images", {img("coffee.png")}},
                        {"messages", {message("user", "<image>\nWhat drink?"),
                                      message("assistant", "coffee")}}}
             .dump()
      << "\n";
  out << nlohmann::json{{"messages", {message("user", "Say hi"), message("assistant", "hi")}}}
             .dump()
      << "\n";
  return path;
}

// Preference pairs on real photos: a two-image, multi-turn prompt; one image; text only.
fs::path write_photo_prefs(const fs::path& dir) {
  const auto photos = kGoldenFixtures / "qwen2_vl_processor";
  auto img = [&](const char* name) { return (photos / name).string(); };
  const auto path = dir / "prefs.jsonl";
  std::ofstream out(path);
  out << nlohmann::json{{"images", {img("rocket.png"), img("astronaut.png")}},
                        {"prompt", {message("user", "<image>\nWhat is this?"),
                                    message("assistant", "a rocket"),
                                    message("user", "<image>And this?")}},
                        {"chosen", {message("assistant", "an astronaut")}},
                        {"rejected", {message("assistant", "a cat on a rocket")}}}
             .dump()
      << "\n";
  out << nlohmann::json{{"images", {img("chelsea.png")}},
                        {"prompt", {message("user", "<image>\nWhat animal is this?")}},
                        {"chosen", {message("assistant", "a cat")}},
                        {"rejected", {message("assistant", "coffee")}}}
             .dump()
      << "\n";
  out << nlohmann::json{{"prompt", "Say hi"}, {"chosen", "hi"}, {"rejected", "go away now"}}.dump()
      << "\n";
  return path;
}

// DIR/NAME.json, the recipe these tests run: CPU, one thread, constant lr without weight decay, a
// metrics row per step, no checkpoints, on `start` and `train` (and `eval` when not empty);
// `extra` holds further top-level sections, e.g. {"lora": {...}}.
std::string write_recipe(const fs::path& dir, const std::string& name, const fs::path& start,
                         const fs::path& train, double lr, int64_t batch_size, int64_t max_steps,
                         const std::string& eval = "", const nlohmann::json& extra = {}) {
  nlohmann::json j = {
      {"seed", 1}, {"device", "cpu"}, {"num_threads", 1},
      {"model", {{"path", start.string()}}},
      {"data", {{"train", train.string()}, {"max_length", 256}, {"num_workers", 1}}},
      {"optim", {{"lr", lr}, {"weight_decay", 0.0}}},
      {"scheduler", {{"name", "constant"}, {"warmup_steps", 0}}},
      {"train", {{"batch_size", batch_size}, {"max_steps", max_steps}, {"log_every_n_steps", 1},
                 {"save_every_n_steps", 0}}}};
  if (!eval.empty()) j["data"]["eval"] = eval;
  if (extra.is_object()) j.update(extra);
  const auto path = dir / (name + ".json");
  io::write_text_atomic(path, j.dump(2));
  return path.string();
}

// The sample context the stages build for the start model's folder.
data::SampleContext qwen_context(const hub::Pretrained& p, const data::Tokenizer& tok,
                                 const fs::path& source) {
  data::SampleContext ctx;
  ctx.tokenizer = &tok;
  ctx.template_options.chat_template = data::ChatTemplate::kQwen2Vl;
  ctx.template_options.image_token_id = kImagePad;
  ctx.template_options.image_text = "<|image_pad|>";
  ctx.image.qwen = p.image.qwen;
  ctx.max_length = 256;
  ctx.source = source.string();
  return ctx;
}

std::vector<data::SftSample> read_samples(const fs::path& path, const data::SampleContext& ctx,
                                          bool prompt_only = false) {
  std::vector<data::SftSample> out;
  io::JsonlReader in(path);
  io::JsonlRecord rec;
  while (in.next(rec)) out.push_back(data::make_sft_sample(rec.value, rec.line, ctx, prompt_only));
  return out;
}

std::vector<data::PreferenceSample> read_prefs(const fs::path& path,
                                               const data::SampleContext& ctx) {
  std::vector<data::PreferenceSample> out;
  io::JsonlReader in(path);
  io::JsonlRecord rec;
  while (in.next(rec)) out.push_back(data::make_preference_sample(rec.value, rec.line, ctx, {}));
  return out;
}
}  // namespace

TEST_CASE("sft, eval and generate run a Qwen2-VL hub folder on real photos", "[e2e][qwen2vl]") {
  TempDir tmp("qwen2vl_cli");
  const auto start = write_start_model(tmp.path);
  const auto data_path = write_data(tmp.path);
  const auto sft_out = tmp.path / "sft";
  auto run = [&](const std::string& name, const std::string& args) {
    auto r = run_cli(args, tmp.path / ("log_" + name));
    INFO(name << ": " << r.err);
    REQUIRE(r.code == 0);
    return r;
  };
  const auto recipe = write_recipe(tmp.path, "sft", start, data_path, 1e-3, 4, 3);
  run("sft", "sft -r " + recipe + " --output " + sft_out.string());

  // The step-1 loss is the start model's loss on all four samples.
  auto p = hub::load_pretrained(start);
  REQUIRE(p.model->is_qwen2_vl());
  REQUIRE(p.image.qwen.has_value());
  auto tok = hub::load_tokenizer(p.tokenizer_path);
  const auto samples = read_samples(data_path, qwen_context(p, *tok, data_path));
  REQUIRE(samples.size() == 4);
  CHECK(samples[1].image_grid_thw.size(0) == 2);
  auto b = data::collate(samples, 0);
  torch::Tensor expected_loss;
  {
    torch::NoGradGuard ng;
    p.model->eval();
    auto logits = p.model->forward(b.input_ids, {b.pixel_values, b.image_grid_thw}, b.attention_mask);
    expected_loss = algo::sft_loss_sum(logits, b.labels) /
                    static_cast<double>(algo::n_supervised_targets(b.labels));
  }
  const auto rows = train_rows(sft_out / "metrics.jsonl");
  REQUIRE(rows.size() == 3);
  CHECK(rows[0]["loss"].get<double>() ==
        Approx(expected_loss.item<double>()).epsilon(1e-5));
  CHECK(rows[2]["loss"].get<double>() < rows[0]["loss"].get<double>());

  // Packed (data.packing): the four samples share rows, each with its own M-RoPE positions and
  // attention; step 1 has the same loss, with less padding.
  const auto packed_out = tmp.path / "sft_packed";
  run("sft_packed", "sft -r " + recipe +
                        " --set data.packing=true train.max_steps=1 --output " +
                        packed_out.string());
  const auto packed_rows = train_rows(packed_out / "metrics.jsonl");
  REQUIRE(packed_rows.size() == 1);
  CHECK(packed_rows[0]["loss"].get<double>() ==
        Approx(expected_loss.item<double>()).epsilon(1e-5));
  CHECK(packed_rows[0]["padding_fraction"].get<double>() <
        rows[0]["padding_fraction"].get<double>());

  // train.cpu_shards: two row shards at once on two threads (plain and packed), the same step 1.
  for (const std::string packing : {"false", "true"}) {
    INFO("packing " << packing);
    const auto sharded_out = tmp.path / ("sft_sharded_" + packing);
    auto r = run("sft_sharded", "sft -r " + recipe + " --set num_threads=2 train.cpu_shards=2" +
                                    " data.packing=" + packing + " train.max_steps=1 --output " +
                                    sharded_out.string());
    CHECK(r.err.find("train.cpu_shards 2: each micro-batch runs as 2 row shards") !=
          std::string::npos);
    const auto sharded_rows = train_rows(sharded_out / "metrics.jsonl");
    REQUIRE(sharded_rows.size() == 1);
    CHECK(sharded_rows[0]["loss"].get<double>() ==
          Approx(expected_loss.item<double>()).epsilon(1e-5));
    CHECK(sharded_rows[0]["grad_norm"].get<double>() ==
          Approx(rows[0]["grad_norm"].get<double>()).epsilon(1e-4));
  }

  // The saved folder is a Qwen2-VL hub folder with new weights and the same tokenizer files.
  CHECK(hub::is_qwen2_vl_folder(sft_out));
  CHECK(read_all(sft_out / "tokenizer.json") == read_all(start / "tokenizer.json"));
  auto before = io::load_safetensors(start);
  auto after = io::load_safetensors(sft_out);
  REQUIRE(before.size() == after.size());
  CHECK(!torch::equal(before.at("model.embed_tokens.weight"), after.at("model.embed_tokens.weight")));

  // eval: exact match and perplexity over the four conversations; generate never emits vision
  // tokens.
  auto ev = run("eval", "eval --model " + sft_out.string() + " --data " + data_path.string() +
                            " --max-new-tokens 4");
  const auto em = nlohmann::json::parse(ev.out.substr(ev.out.rfind('{')));
  CHECK(em["n"] == 4);
  auto ppl = run("ppl", "eval --metric perplexity --model " + sft_out.string() + " --data " +
                            data_path.string());
  const auto pj = nlohmann::json::parse(ppl.out.substr(ppl.out.rfind('{')));
  CHECK(pj["n"] == 4);
  CHECK(pj["n_tokens"] == algo::n_supervised_targets(b.labels));
  auto gen = run("generate", "generate --model " + sft_out.string() + " --data " +
                                 data_path.string() + " --max-new-tokens 6 --temperature 1" +
                                 " --num-generations 2 --seed 5");
  int n_lines = 0;
  std::istringstream lines(gen.out);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] != '{') continue;
    ++n_lines;
    const auto j = nlohmann::json::parse(line);
    for (const auto& id : j.at("tokens")) {
      CHECK(id.get<int64_t>() != kImagePad);
      CHECK(id.get<int64_t>() != kVisionStart);
    }
  }
  CHECK(n_lines == 8);
}

TEST_CASE("Qwen2-VL preference and rollout forwards equal each row run alone", "[e2e][qwen2vl]") {
  TempDir tmp("qwen2vl_forwards");
  const auto start = write_start_model(tmp.path);
  auto p = hub::load_pretrained(start);
  auto tok = hub::load_tokenizer(p.tokenizer_path);
  p.model->eval();
  torch::NoGradGuard no_grad;

  // Preference batch: rows [chosen x3, rejected x3], right padded, images once per pair.
  const auto prefs_path = write_photo_prefs(tmp.path);
  const auto ctx = qwen_context(p, *tok, prefs_path);
  const auto pairs = read_prefs(prefs_path, ctx);
  REQUIRE(pairs.size() == 3);
  CHECK(pairs[0].n_images == 2);
  CHECK(pairs[0].image_grid_thw.size(0) == 2);
  CHECK(pairs[2].n_images == 0);
  auto b = data::collate_preference(pairs, 0);
  REQUIRE(b.image_grid_thw.size(0) == 3);
  auto batched = train::preference_forward(p.model, b, false, false).logps;
  auto padding_free = train::preference_forward(p.model, b, false, false, true).logps;
  // Each row alone through the plain forward (vision tower on that pair's images only).
  int64_t image = 0, patch = 0;
  for (int64_t i = 0; i < 3; ++i) {
    const auto& s = pairs[i];
    model::Images images;
    if (s.n_images > 0) images = {s.pixel_values, s.image_grid_thw};
    for (int side = 0; side < 2; ++side) {
      const auto& c_ids = side == 0 ? s.chosen_ids : s.rejected_ids;
      const auto& c_lab = side == 0 ? s.chosen_labels : s.rejected_labels;
      std::vector<int64_t> ids = s.prompt_ids, labels(s.prompt_ids.size(), algo::kIgnoreIndex);
      ids.insert(ids.end(), c_ids.begin(), c_ids.end());
      labels.insert(labels.end(), c_lab.begin(), c_lab.end());
      auto t_ids = torch::tensor(ids, torch::kInt64).unsqueeze(0);
      auto logits = p.model->forward(t_ids, images, torch::ones_like(t_ids));
      auto alone = algo::token_stats(logits, torch::tensor(labels, torch::kInt64).unsqueeze(0),
                                     false).logps.sum().item<double>();
      const auto& got = side == 0 ? batched.chosen : batched.rejected;
      const auto& got_free = side == 0 ? padding_free.chosen : padding_free.rejected;
      INFO("pair " << i << (side == 0 ? " chosen" : " rejected"));
      CHECK(got[i].item<double>() == Approx(alone).margin(1e-4));
      CHECK(got_free[i].item<double>() == Approx(alone).margin(1e-4));
    }
    image += s.n_images;
    patch += s.pixel_values.defined() ? s.pixel_values.size(0) : 0;
  }
  CHECK(image == 3);
  CHECK(patch == b.pixel_values.size(0));

  // Rollouts: 4 prompts of different lengths (left padded; two images in one, none in another),
  // G = 2 sampled completions each. The teacher-forced forward (M-RoPE over prompt + completion)
  // must give the log-probs the KV-cached sampling computed (prompt positions, then the rope
  // delta), and selecting prompts must keep each one's patches and grids.
  const auto data_path = write_data(tmp.path);
  auto sctx = qwen_context(p, *tok, data_path);
  const auto prompts = read_samples(data_path, sctx, /*prompt_only=*/true);
  REQUIRE(prompts.size() == 4);
  model::GenerationConfig gen;
  gen.max_new_tokens = 6;
  gen.temperature = 1.0;
  gen.seed = 11;
  gen.eos_token_ids = {tok->eos_id()};
  auto r = train::sample_rollout(p.model, prompts, {0, 1, 2, 3}, 2, gen, 0, torch::kCPU,
                                 torch::kFloat32);
  p.model->eval();
  REQUIRE(r.image_grid_thw.size(0) == 4);
  REQUIRE(r.row_image_grid_thw.size(0) == 8);
  CHECK(r.mask.sum().item<double>() > 8);
  auto teacher = train::completion_forward(p.model, r, 0, r.P).logps * r.mask;
  CHECK((teacher - r.old_logps).abs().max().item<double>() < 1e-4);
  auto sub = train::select_prompts(r, {1, 3});
  CHECK(sub.image_grid_thw.size(0) == 2);
  auto sub_teacher = train::completion_forward(p.model, sub, 0, sub.P).logps * sub.mask;
  auto rows = torch::tensor(std::vector<int64_t>{2, 3, 6, 7}, torch::kInt64);
  CHECK((sub_teacher - teacher.index_select(0, rows)).abs().max().item<double>() < 1e-5);
}

TEST_CASE("dpo, preference eval, rm and rlhf run a Qwen2-VL hub folder", "[e2e][qwen2vl]") {
  TempDir tmp("qwen2vl_stages");
  const auto start = write_start_model(tmp.path);
  const auto prefs = write_photo_prefs(tmp.path);
  const auto photos = write_data(tmp.path);
  auto run = [&](const std::string& name, const std::string& args) {
    auto r = run_cli(args, tmp.path / ("log_" + name));
    INFO(name << ": " << r.err);
    REQUIRE(r.code == 0);
    return r;
  };
  auto recipe = [&](const std::string& name, const fs::path& data, const nlohmann::json& stage) {
    return write_recipe(tmp.path, name, start, data, 1e-3, 3, 2, data.string(), stage);
  };

  // dpo: the reference is the start model, so step 1 has every reward at 0 and loss ln 2.
  const auto dpo_out = tmp.path / "dpo";
  run("dpo", "dpo -r " + recipe("dpo", prefs, {{"dpo", {{"beta", 0.1}}}}) +
                 " --output " + dpo_out.string());
  auto dpo_rows = train_rows(dpo_out / "metrics.jsonl");
  REQUIRE(dpo_rows.size() == 2);
  CHECK(dpo_rows[0]["loss"].get<double>() == Approx(std::log(2.0)).margin(1e-6));
  CHECK(dpo_rows[0]["rewards/margins"].get<double>() == Approx(0.0).margin(1e-6));
  CHECK(hub::is_qwen2_vl_folder(dpo_out));

  // eval on pairs: the trained policy against the start model; n = 3 pairs.
  auto ev = run("eval_pairs", "eval --model " + dpo_out.string() + " --data " + prefs.string() +
                                  " --ref-model " + start.string());
  const auto ej = nlohmann::json::parse(ev.out.substr(ev.out.rfind('{')));
  CHECK(ej["n"] == 3);

  // rm: a Bradley-Terry head on the Qwen2-VL backbone; the folder loads back as a Qwen2-VL reward
  // model whose rewards are the ones the run's final eval reported.
  const auto rm_out = tmp.path / "rm";
  run("rm", "rm -r " + recipe("rm", prefs, {{"rm", nlohmann::json::object()}}) + " --output " +
                rm_out.string());
  auto rm_eval = read_lines_with(rm_out / "metrics.jsonl", "eval/accuracy");
  REQUIRE(!rm_eval.empty());
  CHECK(rm_eval.back()["eval/n"] == 3);
  auto loaded = hub::load_reward_model(rm_out);
  REQUIRE(loaded.model->model->is_qwen2_vl());
  {
    auto p = hub::load_pretrained(rm_out);
    auto tok = hub::load_tokenizer(p.tokenizer_path);
    const auto ctx = qwen_context(p, *tok, prefs);
    auto b = data::collate_preference(read_prefs(prefs, ctx), 0);
    torch::NoGradGuard no_grad;
    auto rewards = loaded.model->forward(
        b.input_ids,
        {b.pixel_values.repeat({2, 1}), torch::cat({b.image_grid_thw, b.image_grid_thw})},
        b.attention_mask);  // [6]
    CHECK(rewards.narrow(0, 0, 3).mean().item<double>() ==
          Approx(rm_eval.back()["eval/rewards/chosen"].get<double>()).margin(1e-4));
    CHECK(rewards.narrow(0, 3, 3).mean().item<double>() ==
          Approx(rm_eval.back()["eval/rewards/rejected"].get<double>()).margin(1e-4));
  }

  // rlhf: GRPO on the photo prompts with a reward function plus the Qwen2-VL reward model.
  const auto rl_out = tmp.path / "rlhf";
  run("rlhf", "rlhf -r " +
                  recipe("rlhf", photos,
                         {{"rlhf",
                           {{"algorithm", "grpo"}, {"num_generations", 2},
                            {"max_completion_length", 4}, {"temperature", 1.0},
                            {"rewards", {{{"name", "exact_match"}}}},
                            {"reward_model", rm_out.string()}}}}) +
                  " --set data.eval= train.batch_size=4 --output " + rl_out.string());
  auto rl_rows = train_rows(rl_out / "metrics.jsonl");
  REQUIRE(rl_rows.size() == 2);
  CHECK(rl_rows[0].contains("rewards/reward_model/mean"));
  CHECK(hub::is_qwen2_vl_folder(rl_out));

  // A LLaVA reference for a Qwen2-VL policy is refused by name.
  auto bad = run_cli("eval --model " + dpo_out.string() + " --data " + prefs.string() +
                         " --ref-model " + (kGoldenFixtures / "llava_tiny_hub").string(),
                     tmp.path / "log_bad_ref");
  CHECK(bad.code == 2);
}

TEST_CASE("LoRA on a Qwen2-VL folder: PEFT loads the adapter onto the transformers model with "
          "mmpost's logits", "[e2e][qwen2vl][hf]") {
  const fs::path python = fs::path(MMPOST_SOURCE_DIR) / ".venv" / "bin" / "python";
  if (std::system((python.string() + " -c 'import transformers, peft' > /dev/null 2>&1").c_str()) !=
      0) {
    MMPOST_SKIP(python.string() + " cannot import transformers, peft (run scripts/setup.sh)");
  }
  TempDir tmp("qwen2vl_lora");
  const auto start = write_start_model(tmp.path);
  const auto data_path = write_data(tmp.path);
  const auto out = tmp.path / "lora";
  const auto lora_recipe = write_recipe(
      tmp.path, "lora", start, data_path, 1e-2, 4, 3, "",
      {{"lora", {{"r", 4}, {"alpha", 8}, {"target_modules", {"q_proj", "v_proj", "qkv"}}}}});
  auto r = run_cli("sft -r " + lora_recipe + " --output " + out.string(),
                   tmp.path / "log_lora");
  INFO(r.err);
  REQUIRE(r.code == 0);
  // The base weights are the start model's; the adapter names follow transformers' paths.
  CHECK(hub::is_qwen2_vl_folder(out));
  auto base = io::load_safetensors(start);
  auto saved = io::load_safetensors(out);
  for (const auto& [name, t] : base) {
    INFO(name);
    CHECK(torch::equal(t, saved.at(name)));
  }
  auto adapter = io::load_safetensors(out / "adapter_model.safetensors");
  CHECK(adapter.count("base_model.model.model.visual.blocks.0.attn.qkv.lora_A.weight") == 1);
  CHECK(adapter.count(
            "base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_B.weight") == 1);

  // mmpost's logits of the folder (the adapter merged on load) on a two-image sample.
  auto p = hub::load_pretrained(out);
  auto tok = hub::load_tokenizer(p.tokenizer_path);
  auto ctx = qwen_context(p, *tok, data_path);
  const auto samples = read_samples(data_path, ctx);
  auto b = data::collate({samples[1]}, 0);
  torch::Tensor logits;
  {
    torch::NoGradGuard ng;
    p.model->eval();
    logits = p.model->forward(b.input_ids, {b.pixel_values, b.image_grid_thw}, b.attention_mask);
  }
  const auto io_file = tmp.path / "io.safetensors";
  io::save_safetensors(io_file, {{"input_ids", b.input_ids},
                                 {"attention_mask", b.attention_mask},
                                 {"pixel_values", b.pixel_values},
                                 {"image_grid_thw", b.image_grid_thw},
                                 {"logits", logits}});
  const auto log = tmp.path / "peft.log";
  const int rc = std::system((python.string() + " " +
                              (fs::path(MMPOST_SOURCE_DIR) / "scripts/golden/check_qwen2_vl_lora.py")
                                  .string() +
                              " " + start.string() + " " + out.string() + " " + io_file.string() +
                              " > " + log.string() + " 2>&1")
                                 .c_str());
  const auto text = read_all(log);
  INFO(text);
  CHECK(rc == 0);
  CHECK(text.find("\"ok\": true") != std::string::npos);

  // dpo with LoRA on the family: the reference is the policy with its adapters off (no copy),
  // so step 1's loss is ln 2.
  const auto prefs = write_photo_prefs(tmp.path);
  const auto dpo_out = tmp.path / "dpo_lora";
  auto d = run_cli("dpo -r " + lora_recipe + " --set data.train=" +
                       prefs.string() + " train.batch_size=3 train.max_steps=1 --output " +
                       dpo_out.string(),
                   tmp.path / "log_dpo_lora");
  INFO(d.err);
  REQUIRE(d.code == 0);
  CHECK_THAT(d.err, Catch::Matchers::Contains("adapters off"));
  auto rows = train_rows(dpo_out / "metrics.jsonl");
  REQUIRE(rows.size() == 1);
  CHECK(rows[0]["loss"].get<double>() == Approx(std::log(2.0)).margin(1e-6));
}

TEST_CASE("a Qwen2.5-VL hub folder runs sft (packed and unpacked), dpo and rlhf", "[e2e][qwen2vl]") {
  TempDir tmp("qwen25vl_stages");
  const auto start = write_start_model(tmp.path, "qwen2_5_vl_tiny");
  const auto data_path = write_data(tmp.path);
  const auto prefs = write_photo_prefs(tmp.path);
  auto p = hub::load_pretrained(start);
  REQUIRE(p.model->is_qwen2_vl());
  REQUIRE(p.model->qwen2_vl->config().variant == model::Qwen2VLVariant::kQwen2_5VL);
  auto tok = hub::load_tokenizer(p.tokenizer_path);
  auto b = data::collate(read_samples(data_path, qwen_context(p, *tok, data_path)), 0);
  double expected = 0;
  {
    torch::NoGradGuard ng;
    p.model->eval();
    auto logits = p.model->forward(b.input_ids, {b.pixel_values, b.image_grid_thw}, b.attention_mask);
    expected = (algo::sft_loss_sum(logits, b.labels) /
                static_cast<double>(algo::n_supervised_targets(b.labels)))
                   .item<double>();
  }
  const auto recipe = write_recipe(tmp.path, "r", start, data_path, 1e-3, 4, 1);
  auto run = [&](const std::string& name, const std::string& args) {
    auto r = run_cli(args + " --output " + (tmp.path / name).string(), tmp.path / ("log_" + name));
    INFO(name << ": " << r.err);
    REQUIRE(r.code == 0);
    return train_rows(tmp.path / name / "metrics.jsonl");
  };
  for (const char* packing : {"false", "true"}) {
    INFO("packing " << packing);
    auto rows = run(std::string("sft_") + packing,
                    "sft -r " + recipe + " --set data.packing=" + packing);
    REQUIRE(rows.size() == 1);
    CHECK(rows[0]["loss"].get<double>() == Approx(expected).epsilon(1e-5));
  }
  auto dpo = run("dpo", "dpo -r " + recipe + " --set data.train=" + prefs.string() +
                            " train.batch_size=3");
  REQUIRE(dpo.size() == 1);
  CHECK(dpo[0]["loss"].get<double>() == Approx(std::log(2.0)).margin(1e-6));
  auto rl = run("rlhf", "rlhf -r " + recipe +
                          " --set rlhf.num_generations=2 rlhf.max_completion_length=4"
                          " rlhf.temperature=1.0 rlhf.rewards='[{\"name\": \"exact_match\"}]'");
  REQUIRE(rl.size() == 1);
  CHECK(hub::is_qwen2_vl_folder(tmp.path / "rlhf"));
}

}  // namespace e2e_test_qwen2_vl_cli
