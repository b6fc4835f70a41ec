// A VLM on a pretrained causal LM with a byte-level BPE tokenizer.json (issue 12), end to end on
// the real binary with a tiny stand-in for SmolLM2: `mmpost init` keeps the language model bit
// for bit and adds <image>; text-only and image samples then run in every stage (sft, dpo, rm,
// rlhf, eval, generate) through the checkpoint's ChatML template, and saved folders keep the
// tokenizer.json and the template.
#include <cmath>
#include <filesystem>
#include <fstream>

#include "catch.h"
#include "e2e_util.h"
#include "mmpost/io/safetensors.h"
#include "mmpost/model/hf.h"
#include "mmpost/model/vlm.h"
#include "test_util.h"

namespace e2e_test_pretrained_lm_cli {

using namespace mmpost;
using namespace mmpost::testing;
namespace fs = std::filesystem;

namespace {
const fs::path kBpe = fs::path(MMPOST_SOURCE_DIR) / "tests/golden/fixtures/bpe/smollm/tokenizer.json";
const fs::path kSmolTemplate =
    fs::path(MMPOST_SOURCE_DIR) / "tests/golden/fixtures/chat_templates/smollm2.jinja";

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

nlohmann::json read_json(const fs::path& p) { return nlohmann::json::parse(slurp(p)); }

/// A LlamaForCausalLM folder as transformers saves one (tied embeddings, 600-token BPE vocabulary
/// with SmolLM2's specials, SmolLM2's ChatML template, pad == EOS), random weights.
fs::path write_causal_lm(const fs::path& dir) {
  fs::create_directories(dir);
  const nlohmann::json cfg = {
      {"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"vocab_size", 600},
      {"hidden_size", 32}, {"intermediate_size", 64}, {"num_hidden_layers", 1},
      {"num_attention_heads", 2}, {"num_key_value_heads", 1}, {"head_dim", 16},
      {"max_position_embeddings", 256}, {"rms_norm_eps", 1e-5}, {"tie_word_embeddings", true},
      {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 100000.0}}},
      {"bos_token_id", 1}, {"eos_token_id", 2}, {"pad_token_id", 2}, {"unk_token_id", 0},
      {"hidden_act", "silu"}, {"transformers_version", "5.24.0"}, {"dtype", "float32"}};
  std::ofstream(dir / "config.json") << cfg.dump(2);
  model::VlmConfig vc = tiny_vlm_config(600, 599);
  vc.text_config = model::causal_lm_config_from_json(cfg, "lm/config.json");
  vc.tie_word_embeddings = true;
  torch::manual_seed(3);
  model::Vlm m(vc);
  std::map<std::string, torch::Tensor> lm;
  for (auto& [name, t] : model::hf_state_dict(m)) {
    const std::string pre = "language_model.";
    if (name.rfind(pre, 0) == 0) lm[name.substr(pre.size())] = t;  // model.*, as LlamaForCausalLM
  }
  io::save_safetensors(dir / "model.safetensors", lm);
  fs::copy_file(kBpe, dir / "tokenizer.json");
  const nlohmann::json tok_cfg = {{"tokenizer_class", "TokenizersBackend"},
                                  {"bos_token", "<|im_start|>"}, {"eos_token", "<|im_end|>"},
                                  {"pad_token", "<|im_end|>"}, {"unk_token", "<|endoftext|>"}};
  std::ofstream(dir / "tokenizer_config.json") << tok_cfg.dump(2);
  fs::copy_file(kSmolTemplate, dir / "chat_template.jinja");
  return dir;
}

const char* kVision = R"('{"vision_config": {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "image_size": 8, "patch_size": 4}, "vision_feature_layer": -1}')";

fs::path init_vlm(const fs::path& dir) {
  const auto lm = write_causal_lm(dir / "lm");
  auto r = run_cli("init --language-model " + lm.string() + " --config " + kVision + " --out " +
                       (dir / "vlm").string(),
                   dir / "log_init");
  INFO(r.err);
  REQUIRE(r.code == 0);
  // The digits are the tower's 8 px: the processor only normalises them.
  std::ofstream(dir / "vlm/preprocessor_config.json") << R"({"image_processor_type": "CLIPImageProcessor",
    "size": {"shortest_edge": 8}, "crop_size": {"height": 8, "width": 8},
    "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]})";
  return dir / "vlm";
}

std::string digit_image(int i) {
  return (kDigitsDir / "images" / (std::string(i < 10 ? "000" : "00") + std::to_string(i) + ".png")).string();
}
}  // namespace

TEST_CASE("init: a LLaVA folder on a pretrained causal LM keeps its weights and adds <image>",
          "[e2e][init]") {
  TempDir tmp("init_lm");
  const auto vlm = init_vlm(tmp.path);
  const auto lm_w = io::load_safetensors(tmp.path / "lm");
  const auto vlm_w = io::load_safetensors(vlm);
  int compared = 0;
  for (const auto& [name, t] : lm_w) {
    const auto it = vlm_w.find("language_model." + name);
    REQUIRE(it != vlm_w.end());
    if (name == "model.embed_tokens.weight") {
      REQUIRE(it->second.size(0) == 601);  // + <image>
      CHECK(torch::equal(it->second.slice(0, 0, 600), t));
      CHECK(torch::allclose(it->second[600], t.mean(0), 0, 1e-6));
    } else {
      CHECK(torch::equal(it->second, t));
    }
    ++compared;
  }
  CHECK(compared == static_cast<int>(lm_w.size()));
  CHECK(vlm_w.count("language_model.lm_head.weight") == 0);  // tied, as transformers saves it
  const auto cfg = read_json(vlm / "config.json");
  CHECK(cfg["image_token_index"] == 600);
  CHECK(cfg["text_config"]["vocab_size"] == 601);
  CHECK(cfg["tie_word_embeddings"] == true);
  const auto tok = read_json(vlm / "tokenizer.json");
  CHECK(tok["added_tokens"].back()["content"] == "<image>");
  CHECK(tok["added_tokens"].back()["id"] == 600);
  const auto tok_cfg = read_json(vlm / "tokenizer_config.json");
  CHECK(tok_cfg["eos_token"] == "<|im_end|>");
  CHECK(tok_cfg["pad_token"] == "<|im_end|>");
  CHECK(tok_cfg["chat_template"] == slurp(kSmolTemplate));

  SECTION("--vision-from takes another folder's tower and projector bit for bit") {
    auto r = run_cli("init --language-model " + (tmp.path / "lm").string() + " --vision-from " +
                         vlm.string() + " --seed 9 --out " + (tmp.path / "again").string(),
                     tmp.path / "log_again");
    INFO(r.err);
    REQUIRE(r.code == 0);
    CHECK_THAT(r.err, Catch::Matchers::Contains("projector too"));
    const auto again = io::load_safetensors(tmp.path / "again");
    int n_vision = 0;
    for (const auto& [name, t] : vlm_w) {
      INFO(name);
      REQUIRE(again.count(name) == 1);
      CHECK(torch::equal(again.at(name), t));  // seed 9 would have drawn other weights
      n_vision += name.rfind("vision_tower.", 0) == 0 ? 1 : 0;
    }
    CHECK(n_vision > 0);
    // The tower's preprocessing comes along (the 0.5 mean/std written above, not CLIP's).
    CHECK(read_json(tmp.path / "again/preprocessor_config.json")["image_mean"] ==
          nlohmann::json({0.5, 0.5, 0.5}));
  }
  SECTION("what belongs to the language model is refused in --config, by name") {
    auto r = run_cli("init --language-model " + (tmp.path / "lm").string() +
                         R"( --config '{"text_config": {}, "vision_config": {}}' --out )" +
                         (tmp.path / "x").string(),
                     tmp.path / "log_bad");
    CHECK(r.code == 2);
    CHECK_THAT(r.err, Catch::Matchers::Contains("text_config: comes from the language model"));
  }
  SECTION("a causal LM that is not a Llama is refused, naming the file") {
    auto c = read_json(tmp.path / "lm/config.json");
    c["architectures"] = {"GPT2LMHeadModel"};
    std::ofstream(tmp.path / "lm/config.json") << c.dump();
    auto r = run_cli("init --language-model " + (tmp.path / "lm").string() + " --config " +
                         kVision + " --out " + (tmp.path / "y").string(),
                     tmp.path / "log_gpt2");
    CHECK(r.code == 2);
    CHECK_THAT(r.err, Catch::Matchers::Contains("lm/config.json: architectures: unsupported"));
    CHECK_THAT(r.err, Catch::Matchers::Contains("GPT2LMHeadModel"));
  }
}

TEST_CASE("text-only and image samples run in every stage on a tokenizer.json model",
          "[e2e][init]") {
  TempDir tmp("text_only_stages");
  const auto vlm = init_vlm(tmp.path);
  // SFT data: text-only conversations mixed with image ones.
  const auto sft_data = tmp.path / "mixed.jsonl";
  {
    std::ofstream out(sft_data);
    for (int i = 0; i < 8; ++i) {
      out << nlohmann::json{{"messages", {{{"role", "user"}, {"content", "What is " + std::to_string(i) + " + 1?"}},
                                          {{"role", "assistant"}, {"content", std::to_string(i + 1)}}}}}
                 .dump()
          << "\n";
      out << nlohmann::json{{"images", {digit_image(i)}},
                            {"messages", {{{"role", "user"}, {"content", "<image>\nWhich digit?"}},
                                          {{"role", "assistant"}, {"content", std::to_string(i)}}}}}
                 .dump()
          << "\n";
    }
  }
  const auto pairs = tmp.path / "pairs.jsonl";
  {
    std::ofstream out(pairs);
    for (int i = 0; i < 8; ++i) {
      out << nlohmann::json{{"prompt", {{{"role", "user"}, {"content", "Say " + std::to_string(i)}}}},
                            {"chosen", {{{"role", "assistant"}, {"content", std::to_string(i)}}}},
                            {"rejected", {{{"role", "assistant"}, {"content", "no"}}}}}
                 .dump()
          << "\n";
    }
  }
  const std::string common = " --set model.path=" + vlm.string() +
                             " --set data.max_length=256 --set data.eval= --no-resume";
  auto run = [&](const std::string& name, const std::string& args) {
    auto r = run_cli(args, tmp.path / ("log_" + name));
    INFO(name << ": " << r.err);
    REQUIRE(r.code == 0);
    return r;
  };
  const auto sft_out = tmp.path / "sft";
  run("sft", "sft -r recipes/tiny/sft-tiny.json --set model.tokenizer= "
             "--set data.train=" + sft_data.string() + " --set train.max_steps=2 --set "
             "train.batch_size=8 --output " + sft_out.string() + common);
  const auto rows = train_rows(sft_out / "metrics.jsonl");
  REQUIRE(!rows.empty());
  CHECK(std::isfinite(rows.back()["loss"].get<double>()));
  CHECK(fs::exists(sft_out / "tokenizer.json"));
  CHECK(read_json(sft_out / "tokenizer_config.json")["chat_template"] == slurp(kSmolTemplate));

  const auto dpo_out = tmp.path / "dpo";
  run("dpo", "dpo -r recipes/tiny/dpo-tiny.json --set data.train=" + pairs.string() +
                 " --set train.max_steps=1 --set train.batch_size=8 --set train.log_every_n_steps=1"
                 " --output " + dpo_out.string() + common);
  const auto dpo_rows = train_rows(dpo_out / "metrics.jsonl");
  REQUIRE(!dpo_rows.empty());
  CHECK(std::abs(dpo_rows.front()["loss"].get<double>() - std::log(2.0)) < 1e-6);  // policy == ref

  run("rm", "rm -r recipes/tiny/rm-tiny.json --set data.train=" + pairs.string() +
                " --set train.max_steps=1 --set train.batch_size=8 --output " +
                (tmp.path / "rm").string() + common);
  const auto prompts = tmp.path / "prompts.jsonl";
  {
    std::ofstream out(prompts);
    for (int i = 0; i < 4; ++i) {
      out << nlohmann::json{{"messages", {{{"role", "user"}, {"content", "Say " + std::to_string(i)}},
                                          {{"role", "assistant"}, {"content", std::to_string(i)}}}}}
                 .dump()
          << "\n";
    }
  }
  run("rlhf", "rlhf -r recipes/tiny/grpo-tiny.json --set data.train=" + prompts.string() +
                  " --set train.max_steps=1 --set train.batch_size=2 --set rlhf.num_generations=2"
                  " --output " + (tmp.path / "grpo").string() + common);
  auto ev = run("eval", "eval --model " + sft_out.string() + " --data " + sft_data.string());
  const auto last = nlohmann::json::parse(ev.out.substr(ev.out.rfind('{')));
  CHECK(last["n"] == 16);
  auto ppl = run("ppl", "eval --metric perplexity --model " + sft_out.string() + " --data " +
                            sft_data.string());
  const auto p = nlohmann::json::parse(ppl.out.substr(ppl.out.rfind('{')));
  CHECK(p["n"] == 16);
  // Each reply is one digit token (SmolLM2 splits digits) and its <|im_end|>: 16 x 2 targets.
  CHECK(p["n_tokens"] == 32);
  CHECK(std::abs(p["perplexity"].get<double>() - std::exp(p["loss"].get<double>())) < 1e-9);
  auto gen = run("generate", "generate --model " + sft_out.string() + " --data " + prompts.string() +
                                 " --max-new-tokens 3 --temperature 0");
  CHECK_THAT(gen.out, Catch::Matchers::Contains("<|im_start|>system\\nYou are a helpful AI assistant named SmolLM"));
}

}  // namespace e2e_test_pretrained_lm_cli
