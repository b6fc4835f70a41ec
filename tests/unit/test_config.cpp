// Recipe parsing: strict keys with the JSON path in the error, types, overrides, validation.
#include <fstream>

#include "catch.h"
#include "mmpost/config/recipe.h"
#include "mmpost/config/schema.h"

namespace unit_test_config {

using namespace mmpost;
using namespace mmpost::config;

TEST_CASE("unknown recipe key names its JSON path", "[unit][config]") {
  auto j = nlohmann::json::parse(R"({"optim": {"lrr": 1e-4}})");
  CHECK_THROWS_WITH(from_json<SftConfig>(j, "r.json"),
                    HasSubstr("r.json: optim.lrr: unknown key") &&
                        HasSubstr("did you mean \"lr\""));
  auto nested = nlohmann::json::parse(R"({"data": {"image": {"image_men": [0, 0, 0]}}})");
  CHECK_THROWS_WITH(from_json<SftConfig>(nested, "r.json"),
                    HasSubstr("data.image.image_men: unknown key"));
}

TEST_CASE("wrong types name the path and the value", "[unit][config]") {
  auto j = nlohmann::json::parse(R"({"train": {"batch_size": "eight"}})");
  CHECK_THROWS_WITH(from_json<SftConfig>(j, "r.json"),
                    HasSubstr("train.batch_size: expected an integer, got a string"));
  auto f = nlohmann::json::parse(R"({"train": {"batch_size": 2.5}})");
  CHECK_THROWS_WITH(from_json<SftConfig>(f, "r.json"), HasSubstr("train.batch_size"));
  auto arr = nlohmann::json::parse(R"({"optim": {"betas": [0.9, "x"]}})");
  CHECK_THROWS_WITH(from_json<SftConfig>(arr, "r.json"), HasSubstr("optim.betas[1]"));
}

TEST_CASE("defaults < recipe < --set, and validation", "[unit][config]") {
  auto j = nlohmann::json::parse(R"({"optim": {"lr": 0.001}, "data": {"train": "t.jsonl"},
                                     "model": {"path": "m"}})");
  apply_override(j, "optim.lr=5e-5");
  apply_override(j, "device=cpu");
  apply_override(j, "train.max_steps=7");
  auto cfg = from_json<SftConfig>(j, "r.json");
  CHECK(cfg.optim.lr == Approx(5e-5));
  CHECK(cfg.device == "cpu");
  CHECK(cfg.train.max_steps == 7);
  CHECK(cfg.train.batch_size == 8);  // struct default
  CHECK_NOTHROW(cfg.validate());
  cfg.data.on_bad_sample = "ignore";
  CHECK_THROWS_WITH(cfg.validate(), HasSubstr("data.on_bad_sample") && HasSubstr("error, skip"));
  CHECK_THROWS_WITH(apply_override(j, "optim.lr"), HasSubstr("key=value"));
  // Round trip: to_json then from_json gives the same values.
  auto again = from_json<SftConfig>(to_json(cfg), "x");
  CHECK(again.optim.lr == cfg.optim.lr);
  CHECK(again.data.image.image_std == cfg.data.image.image_std);
}

TEST_CASE("invalid JSON in a recipe file names the file", "[unit][config]") {
  auto p = std::filesystem::temp_directory_path() / "mmpost_bad_recipe.json";
  std::ofstream(p) << "{\"optim\": {\"lr\": }";
  CHECK_THROWS_WITH(load_sft_config(p.string(), {}),
                    HasSubstr("mmpost_bad_recipe.json: invalid JSON"));
  std::filesystem::remove(p);
}

}  // namespace unit_test_config
