// Chat templates against transformers' apply_chat_template (fixture written by
// scripts/golden/make_chat_template_fixture.py from the checkpoints' own templates: SmolLM2,
// Qwen2-VL, Llama-3, llava-1.5-hf): the exact jinja text is recognised, rendered text is equal
// (llava: mmpost ends a reply with EOS where llava-hf's inference template writes " "), and
// SmolLM2's ids built turn by turn equal apply_chat_template(tokenize=True)'s.
#include <filesystem>
#include <fstream>

#include "catch.h"
#include "mmpost/core/check.h"
#include "mmpost/data/chat_template.h"
#include "mmpost/data/tokenizer.h"

namespace golden_test_chat_template_golden {

using namespace mmpost;
using namespace mmpost::data;
namespace fs = std::filesystem;

namespace {
const fs::path kDir = fs::path(MMPOST_SOURCE_DIR) / "tests/golden/fixtures/chat_templates";

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  REQUIRE(f.good());
  return std::string(std::istreambuf_iterator<char>(f), {});
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t i = s.find(from); i != std::string::npos; i = s.find(from, i + to.size()))
    s.replace(i, from.size(), to);
  return s;
}
}  // namespace

TEST_CASE("the checkpoints' chat templates are recognised from their exact text", "[golden][data]") {
  for (const char* name : {"smollm2", "qwen2_vl", "llama3", "llava"}) {
    INFO(name);
    const auto t = recognize_chat_template(read_file(kDir / (std::string(name) + ".jinja")));
    REQUIRE(t.has_value());
    CHECK(chat_template_name(*t) == name);
  }
  // One changed character is another template.
  auto smol = read_file(kDir / "smollm2.jinja");
  CHECK_FALSE(recognize_chat_template(replace_all(smol, "SmolLM", "SmolLX")).has_value());
  CHECK_FALSE(recognize_chat_template("{{ messages }}").has_value());
}

TEST_CASE("rendered conversations equal transformers' apply_chat_template for every template",
          "[golden][data]") {
  std::ifstream f(kDir / "expected.json");
  const auto cases = nlohmann::json::parse(f);
  Tokenizer tok((fs::path(MMPOST_SOURCE_DIR) / "tests/golden/fixtures/bpe/smollm/tokenizer.json").string());
  tok.add_special_token(kImagePlaceholder, 600);
  std::map<std::string, int> checked, ids_checked;
  int vision_id = 0;
  for (const auto& c : cases) {
    const std::string name = c["template"].get<std::string>() + "/" + c["name"].get<std::string>() +
                             (c["add_generation_prompt"].get<bool>() ? " +gen" : "");
    INFO(name);
    if (!c["kwargs"].empty()) {  // Qwen2-VL's add_vision_id ("Picture 1: ") is not reproduced
      ++vision_id;
      continue;
    }
    std::vector<Message> msgs;
    for (const auto& m : c["messages"]) msgs.push_back({m["role"], m["content"]});
    TemplateOptions o;
    o.chat_template = parse_chat_template(c["template"]);
    o.add_generation_prompt = c["add_generation_prompt"];
    o.image_token_id = 600;
    std::string got = render_conversation(msgs, tok, o);
    const auto want = c["rendered"].get<std::string>();
    if (o.chat_template == ChatTemplate::kLlava) {  // BOS is the tokenizer's; EOS ends replies
      REQUIRE(got.rfind("<s>", 0) == 0);
      got = replace_all(got.substr(3), "</s>", " ");
    }
    CHECK(got == want);
    ++checked[c["template"]];
    if (c.contains("input_ids")) {
      const auto enc = encode_conversation(msgs, tok, o);
      CHECK(enc.input_ids == c["input_ids"].get<std::vector<int64_t>>());
      // Supervised: each reply and its <|im_end|> (id 2, also the pad token), nothing else.
      for (size_t i = 0; i < enc.labels.size(); ++i) {
        if (enc.labels[i] != -100) CHECK(enc.labels[i] == enc.input_ids[i]);
      }
      ++ids_checked[c["template"]];
    }
  }
  CHECK(vision_id == 4);
  CHECK(checked["smollm2"] == 22);
  CHECK(checked["llama3"] == 22);
  CHECK(checked["qwen2_vl"] == 36);
  CHECK(checked["llava"] == 36);
  CHECK(ids_checked["smollm2"] == 22);
}

TEST_CASE("ChatML labels: the reply and its <|im_end|> are supervised, the newline after is not",
          "[unit][data]") {
  Tokenizer tok((fs::path(MMPOST_SOURCE_DIR) / "tests/golden/fixtures/bpe/smollm/tokenizer.json").string());
  tok.set_eos_id(2);
  tok.set_pad_id(2);  // SmolLM2: pad == EOS
  TemplateOptions o;
  o.chat_template = ChatTemplate::kSmolLM2;
  const auto enc = encode_conversation({{"user", "hi"}, {"assistant", "ok"}, {"user", "again"},
                                        {"assistant", "yes"}}, tok, o);
  std::vector<int64_t> supervised;
  for (size_t i = 0; i < enc.labels.size(); ++i) {
    if (enc.labels[i] != -100) supervised.push_back(enc.labels[i]);
  }
  std::vector<int64_t> want = tok.encode("ok");
  want.push_back(2);
  for (int64_t id : tok.encode("yes")) want.push_back(id);
  want.push_back(2);
  CHECK(supervised == want);
  CHECK(enc.input_ids.back() == tok.encode("\n").back());  // the "\n" after the last <|im_end|>
  CHECK(enc.labels.back() == -100);
}

TEST_CASE("data.chat_template auto takes the checkpoint's template and refuses an unknown one",
          "[unit][data]") {
  Tokenizer tok((fs::path(MMPOST_SOURCE_DIR) / "tests/golden/fixtures/bpe/smollm/tokenizer.json").string());
  CHECK(resolve_chat_template("auto", tok) == ChatTemplate::kLlava);  // no template: llava
  tok.set_chat_template(read_file(kDir / "qwen2_vl.jinja"));
  CHECK(resolve_chat_template("auto", tok) == ChatTemplate::kQwen2Vl);
  CHECK(resolve_chat_template("llama3", tok) == ChatTemplate::kLlama3);  // a name wins
  tok.set_chat_template("{% for m in messages %}{{ m.content }}{% endfor %}");
  try {
    resolve_chat_template("auto", tok);
    FAIL("an unknown template was accepted");
  } catch (const Error& e) {
    CHECK_THAT(std::string(e.what()), Catch::Matchers::Contains("not one mmpost reproduces"));
    CHECK_THAT(std::string(e.what()), Catch::Matchers::Contains("data.chat_template"));
  }
}

}  // namespace golden_test_chat_template_golden
