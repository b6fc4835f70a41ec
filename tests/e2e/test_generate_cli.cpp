// End-to-end: `mmpost generate` on a tiny random model folder (written with hub::save_pretrained,
// no training needed). JSONL on stdout, one object per completion in grouped order; seeded runs
// repeat; --stop ends completions at the stop text; `| head -1` exits quietly; bad data exits 3
// naming FILE:LINE and bad flags exit 2.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "catch.h"
#include "mmpost/hub/hf_folder.h"
#include "mmpost/model/config.h"
#include "test_util.h"

namespace e2e_test_generate_cli {

namespace fs = std::filesystem;

namespace {
struct RunResult {
  int code;
  std::string out, err;
};

/// Runs `mmpost ARGS` from the repo root with stdout and stderr captured.
RunResult run_generate(const std::string& args, const fs::path& tmp) {
  std::string cmd = std::string("cd ") + MMPOST_SOURCE_DIR + " && " + MMPOST_BINARY +
                    " generate " + args + " > " + (tmp / "stdout.txt").string() + " 2> " +
                    (tmp / "stderr.txt").string();
  int status = std::system(cmd.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1,
          mmpost::testing::read_all(tmp / "stdout.txt"),
          mmpost::testing::read_all(tmp / "stderr.txt")};
}

std::vector<nlohmann::json> parse_lines(const std::string& text) {
  std::vector<nlohmann::json> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

/// A random-weight model with the tiny recipe's shapes and the repo's tokenizer.
void write_tiny_model(const fs::path& dir) {
  auto config = mmpost::model::vlm_config_from_json(nlohmann::json::parse(R"({
    "image_token_index": 4, "vision_feature_layer": -1,
    "vision_config": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                      "num_attention_heads": 2, "image_size": 8, "patch_size": 4},
    "text_config": {"vocab_size": 512, "hidden_size": 32, "intermediate_size": 64,
                    "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
                    "max_position_embeddings": 128, "pad_token_id": 3}})"));
  torch::manual_seed(0);
  mmpost::model::Vlm model(config);
  mmpost::data::ImageProcessorConfig image;
  image.image_size = 8;
  image.image_mean = {0.5, 0.5, 0.5};
  image.image_std = {0.5, 0.5, 0.5};
  image.interpolation = "area";
  mmpost::hub::save_pretrained(dir, model,
                              fs::path(MMPOST_SOURCE_DIR) / "data/tokenizer/tokenizer.model",
                              image);
}

/// Three prompts: image + reference reply, image and no reply, text only and no reply.
void write_prompts(const fs::path& file) {
  const std::string img = std::string(MMPOST_SOURCE_DIR) + "/data/digits-vqa/images/";
  std::ofstream out(file);
  out << R"({"id": "a", "images": [")" << img << R"(0007.png"], "messages": [{"role": "user", )"
      << R"("content": "<image>\nWhich digit is this?"}, {"role": "assistant", "content": "7"}]})"
      << "\n";
  out << R"({"id": "b", "images": [")" << img << R"(0015.png"], "messages": [{"role": "user", )"
      << R"("content": [{"type": "image"}, {"type": "text", "text": "Read the digit."}]}]})"
      << "\n";
  out << R"({"id": "c", "messages": [{"role": "system", "content": "Answer briefly."}, )"
      << R"({"role": "user", "content": "Count to three."}]})" << "\n";
}
}  // namespace

TEST_CASE("generate: G completions per prompt as JSONL on stdout, reproducible per seed",
          "[e2e]") {
  mmpost::testing::TempDir tmp("gen_e2e");
  write_tiny_model(tmp.path / "model");
  write_prompts(tmp.path / "prompts.jsonl");
  const std::string base = "--model " + (tmp.path / "model").string() + " --data " +
                           (tmp.path / "prompts.jsonl").string() + " --device cpu ";
  const std::string args = base + "--num-generations 2 --max-new-tokens 6 --batch-size 2 --seed 5";
  auto r = run_generate(args, tmp.path);
  INFO(r.err);
  REQUIRE(r.code == 0);
  auto lines = parse_lines(r.out);
  REQUIRE(lines.size() == 6);
  const std::vector<std::string> ids = {"a", "a", "b", "b", "c", "c"};
  for (size_t k = 0; k < lines.size(); ++k) {
    const auto& j = lines[k];
    INFO(j.dump());
    CHECK(j["id"] == ids[k]);
    CHECK(j["sample"] == static_cast<int>(k % 2));
    CHECK(j["tokens"].size() == j["n_tokens"].get<size_t>());
    CHECK(j["n_tokens"].get<int>() >= 1);
    CHECK(j["n_tokens"].get<int>() <= 6);
    CHECK(j["completion"].is_string());
    CHECK(j["logps"].get<double>() < 0.0);
    const std::string reason = j["finish_reason"];
    CHECK((reason == "eos" || reason == "stop" || reason == "length"));
    CHECK((reason == "length") == (j["n_tokens"].get<int>() == 6 && reason != "eos"));
    const std::string prompt = j["prompt"];
    CHECK(prompt.size() >= 10);
    CHECK(prompt.substr(prompt.size() - 10) == "ASSISTANT:");
    CHECK(j.contains("reference") == (ids[k] == "a"));  // only "a" ends with a reply
  }
  CHECK(lines[0]["reference"] == "7");
  CHECK(lines[0]["prompt"].get<std::string>().find("<image>") != std::string::npos);
  CHECK(lines[4]["prompt"].get<std::string>().find("Answer briefly.") != std::string::npos);
  CHECK(lines[0]["tokens"] != lines[1]["tokens"]);  // two samples of one prompt differ

  auto again = run_generate(args, tmp.path);
  CHECK(again.code == 0);
  CHECK(again.out == r.out);
  auto other = run_generate(base + "--num-generations 2 --max-new-tokens 6 --seed 6", tmp.path);
  CHECK(other.code == 0);
  CHECK(other.out != r.out);

  // A stop string: a row stops exactly when its completion first contains it.
  auto stopped = run_generate(base + "--num-generations 2 --max-new-tokens 24 --stop e",
                              tmp.path);
  INFO(stopped.err);
  REQUIRE(stopped.code == 0);
  int n_stop = 0;
  for (const auto& j : parse_lines(stopped.out)) {
    const bool has = j["completion"].get<std::string>().find('e') != std::string::npos;
    if (j["finish_reason"] == "stop") ++n_stop;
    if (j["finish_reason"] != "eos") CHECK(has == (j["finish_reason"] == "stop"));
  }
  CHECK(n_stop >= 1);

  // `| head -1`: the first line arrives, the run still exits 0 without error messages.
  const std::string pipe_cmd = std::string("cd ") + MMPOST_SOURCE_DIR + " && { " + MMPOST_BINARY +
                               " generate " + base + "--num-generations 4 --batch-size 1 2> " +
                               (tmp.path / "pipe_err.txt").string() + "; echo $? > " +
                               (tmp.path / "pipe_rc.txt").string() + "; } | head -1 > " +
                               (tmp.path / "pipe_out.txt").string();
  REQUIRE(std::system(pipe_cmd.c_str()) == 0);
  CHECK(parse_lines(mmpost::testing::read_all(tmp.path / "pipe_out.txt")).size() == 1);
  CHECK(mmpost::testing::read_all(tmp.path / "pipe_rc.txt") == "0\n");
  const std::string pipe_err = mmpost::testing::read_all(tmp.path / "pipe_err.txt");
  INFO(pipe_err);
  CHECK(pipe_err.find("error") == std::string::npos);
  CHECK(pipe_err.find("terminate") == std::string::npos);
}

TEST_CASE("generate: a bad JSONL line exits 3 naming FILE:LINE, bad flags exit 2", "[e2e]") {
  mmpost::testing::TempDir tmp("gen_e2e_bad");
  write_tiny_model(tmp.path / "model");
  write_prompts(tmp.path / "prompts.jsonl");
  {
    std::ofstream bad(tmp.path / "bad.jsonl");
    std::ifstream good(tmp.path / "prompts.jsonl");
    std::string line;
    std::getline(good, line);
    bad << line << "\n{not json\n";
  }
  const std::string model = "--model " + (tmp.path / "model").string() + " --device cpu ";
  auto r = run_generate(model + "--data " + (tmp.path / "bad.jsonl").string(), tmp.path);
  CHECK(r.code == 3);
  CHECK(r.err.find("bad.jsonl:2") != std::string::npos);
  auto skip = run_generate(
      model + "--on-bad-sample skip --max-new-tokens 2 --data " + (tmp.path / "bad.jsonl").string(),
      tmp.path);
  CHECK(skip.code == 0);
  CHECK(parse_lines(skip.out).size() == 1);

  const std::string data = " --data " + (tmp.path / "prompts.jsonl").string();
  auto top_p = run_generate(model + "--top-p 0" + data, tmp.path);
  CHECK(top_p.code == 2);
  CHECK(top_p.err.find("--top-p") != std::string::npos);
  auto gens = run_generate(model + "--num-generations 0" + data, tmp.path);
  CHECK(gens.code == 2);
  CHECK(gens.err.find("--num-generations") != std::string::npos);
  auto temp = run_generate(model + "--temperature -1" + data, tmp.path);
  CHECK(temp.code == 2);
  auto missing = run_generate("--model " + (tmp.path / "nope").string() + data, tmp.path);
  CHECK(missing.code == 2);
  CHECK(missing.err.find("nope") != std::string::npos);
  CHECK(missing.out.empty());
}

}  // namespace e2e_test_generate_cli
