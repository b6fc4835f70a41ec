// Tests for io/jsonl: physical line numbers (blank lines counted), malformed and non-object lines
// as error records, CRLF and BOM, missing files, and the append-and-flush writer.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "catch.h"
#include "test_util.h"
#include "mmpost/core/check.h"
#include "mmpost/io/jsonl.h"

namespace unit_test_io_jsonl {

namespace fs = std::filesystem;
using mmpost::io::JsonlReader;
using mmpost::io::JsonlRecord;
using mmpost::io::JsonlWriter;

using mmpost::testing::TempDir;
using mmpost::testing::read_all;

namespace {



}  // namespace

TEST_CASE("jsonl: location formats path:line", "[unit][io]") {
  CHECK(mmpost::io::location("data/train.jsonl", 143) == "data/train.jsonl:143");
}

TEST_CASE("jsonl: records carry physical line numbers and malformed lines become errors",
          "[unit][io]") {
  TempDir tmp;
  const fs::path file = tmp.path / "train.jsonl";
  // Line 1 has a BOM and CRLF; 2 and 5 are blank; 4 is malformed; 6 is valid JSON but no object.
  std::ofstream(file, std::ios::binary) << "\xEF\xBB\xBF{\"id\": 1}\r\n"
                                           "\n"
                                           "{\"id\": 3, \"text\": \"caf\xC3\xA9\"}\n"
                                           "{\"id\": 4,\n"
                                           "   \t\r\n"
                                           "[1, 2]\n"
                                           "{\"id\": 7}";  // no final newline
  JsonlReader reader(file);
  JsonlRecord rec;
  REQUIRE(reader.next(rec));
  CHECK(rec.line == 1);
  CHECK(rec.error.empty());
  CHECK(rec.value["id"] == 1);

  REQUIRE(reader.next(rec));
  CHECK(rec.line == 3);
  CHECK(rec.value["text"] == "caf\xC3\xA9");

  REQUIRE(reader.next(rec));
  CHECK(rec.line == 4);
  INFO(rec.error);
  CHECK(rec.error.rfind(file.string() + ":4: malformed JSON: ", 0) == 0);
  CHECK(rec.value.is_null());

  REQUIRE(reader.next(rec));
  CHECK(rec.line == 6);
  CHECK(rec.error == file.string() + ":6: expected a JSON object, got array");

  REQUIRE(reader.next(rec));
  CHECK(rec.line == 7);
  CHECK(rec.error.empty());
  CHECK(rec.value["id"] == 7);

  CHECK_FALSE(reader.next(rec));
  CHECK_FALSE(reader.next(rec));
}

TEST_CASE("jsonl: a missing file is a data error naming the path", "[unit][io]") {
  TempDir tmp;
  const fs::path file = tmp.path / "missing.jsonl";
  try {
    JsonlReader reader(file);
    FAIL("expected an error");
  } catch (const mmpost::Error& e) {
    CHECK(e.kind() == mmpost::ErrorKind::kData);
    CHECK(std::string(e.what()).find(file.string()) != std::string::npos);
  }
  CHECK_THROWS_AS(JsonlReader(tmp.path), mmpost::Error);  // a folder
}

TEST_CASE("jsonl: the writer appends one flushed object per line", "[unit][io]") {
  TempDir tmp;
  const fs::path file = tmp.path / "metrics.jsonl";
  {
    JsonlWriter writer(file);
    writer.write({{"step", 1}, {"loss", 0.5}});
    CHECK(read_all(file) == "{\"loss\":0.5,\"step\":1}\n");  // visible before close
    writer.write({{"step", 2}});
    CHECK_THROWS_AS(writer.write(nlohmann::json::array({1, 2})), mmpost::Error);
  }
  {
    JsonlWriter writer(file);  // append mode: a resumed run continues the file
    writer.write({{"step", 3}});
  }
  CHECK(read_all(file) == "{\"loss\":0.5,\"step\":1}\n{\"step\":2}\n{\"step\":3}\n");

  JsonlReader reader(file);
  JsonlRecord rec;
  int n = 0;
  while (reader.next(rec)) CHECK(rec.value["step"] == ++n);
  CHECK(n == 3);

  {
    JsonlWriter writer(file, JsonlWriter::Mode::kTruncate);
    writer.write({{"s", "bad \xFF utf8"}});  // replaced, not thrown
  }
  CHECK(read_all(file) == "{\"s\":\"bad \xEF\xBF\xBD utf8\"}\n");
}

TEST_CASE("jsonl: writer errors name the file", "[unit][io]") {
  TempDir tmp;
  CHECK_THROWS_AS(JsonlWriter(tmp.path / "no_dir" / "x.jsonl"), mmpost::Error);
  if (fs::exists("/dev/full")) {
    JsonlWriter writer("/dev/full");
    try {
      writer.write({{"step", 1}});
      FAIL("expected an error");
    } catch (const mmpost::Error& e) {
      CHECK(std::string(e.what()).find("/dev/full: write failed") != std::string::npos);
    }
  }
}

}  // namespace unit_test_io_jsonl
