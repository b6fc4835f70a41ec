// Tests for io/checkpoint: step folder names, atomic text writes, DONE markers, finding the newest
// complete checkpoint (numeric order, incomplete ignored), pruning, and the free-space check.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "catch.h"
#include "test_util.h"
#include "mmpost/core/check.h"
#include "mmpost/io/checkpoint.h"

namespace unit_test_io_checkpoint {

namespace fs = std::filesystem;
namespace io = mmpost::io;

using mmpost::testing::TempDir;
using mmpost::testing::read_all;

namespace {



// Makes output/step_N with a model file, and DONE when `complete`.
fs::path make_step(const fs::path& output, int64_t step, bool complete) {
  fs::path dir = io::step_dir(output, step);
  fs::create_directories(dir);
  io::write_text_atomic(dir / "state.json", "{}");
  if (complete) io::mark_done(dir);
  return dir;
}

}  // namespace

TEST_CASE("checkpoint: step folder names", "[unit][io]") {
  CHECK(io::step_dir("runs/a", 120) == fs::path("runs/a/step_000120"));
  CHECK(io::step_dir("runs/a", 0) == fs::path("runs/a/step_000000"));
  CHECK(io::step_dir("runs/a", 1234567) == fs::path("runs/a/step_1234567"));
  CHECK_THROWS_AS(io::step_dir("runs/a", -1), mmpost::Error);
  CHECK(io::parse_step_dir_name("step_000120") == 120);
  CHECK(io::parse_step_dir_name("step_1234567") == 1234567);
  CHECK_FALSE(io::parse_step_dir_name("step_").has_value());
  CHECK_FALSE(io::parse_step_dir_name("step_12a").has_value());
  CHECK_FALSE(io::parse_step_dir_name("step_000120.tmp").has_value());
  CHECK_FALSE(io::parse_step_dir_name("final").has_value());
  CHECK_FALSE(io::parse_step_dir_name("step_1234567890123456789").has_value());  // 19 digits
}

TEST_CASE("checkpoint: write_text_atomic replaces the file and leaves no temp", "[unit][io]") {
  TempDir tmp;
  const fs::path file = tmp.path / "state.json";
  io::write_text_atomic(file, "first");
  io::write_text_atomic(file, "second\n");
  CHECK(read_all(file) == "second\n");
  CHECK(std::distance(fs::directory_iterator(tmp.path), fs::directory_iterator()) == 1);
  try {
    io::write_text_atomic(tmp.path / "missing" / "state.json", "x");
    FAIL("expected an error");
  } catch (const mmpost::Error& e) {
    CHECK(e.kind() == mmpost::ErrorKind::kRuntime);
    CHECK(std::string(e.what()).find("missing/state.json") != std::string::npos);
  }
}

TEST_CASE("checkpoint: latest_complete_checkpoint ignores incomplete folders", "[unit][io]") {
  TempDir tmp;
  CHECK_FALSE(io::latest_complete_checkpoint(tmp.path / "nonexistent").has_value());
  CHECK_FALSE(io::latest_complete_checkpoint(tmp.path).has_value());
  make_step(tmp.path, 5, /*complete=*/false);
  CHECK_FALSE(io::latest_complete_checkpoint(tmp.path).has_value());

  make_step(tmp.path, 999999, /*complete=*/true);
  // "step_1000000" sorts before "step_999999" as text; the step number decides.
  fs::path newest = make_step(tmp.path, 1000000, /*complete=*/true);
  make_step(tmp.path, 1000001, /*complete=*/false);                   // crashed mid-save
  fs::create_directories(tmp.path / "step_2000000x");                 // not a step folder
  std::ofstream(tmp.path / "step_3000000") << "a file, not a folder";
  CHECK(io::is_complete(newest));
  CHECK_FALSE(io::is_complete(io::step_dir(tmp.path, 1000001)));
  CHECK(io::latest_complete_checkpoint(tmp.path) == newest);
}

TEST_CASE("checkpoint: prune keeps the newest complete folders", "[unit][io]") {
  TempDir tmp;
  for (int64_t step : {10, 20, 30, 40}) make_step(tmp.path, step, /*complete=*/true);
  make_step(tmp.path, 25, /*complete=*/false);  // crash leftover older than the newest complete
  make_step(tmp.path, 50, /*complete=*/false);  // newer than all: possibly being written
  fs::create_directories(tmp.path / "logs");

  io::prune_checkpoints(tmp.path, /*keep_last=*/2);
  CHECK_FALSE(fs::exists(io::step_dir(tmp.path, 10)));
  CHECK_FALSE(fs::exists(io::step_dir(tmp.path, 20)));
  CHECK_FALSE(fs::exists(io::step_dir(tmp.path, 25)));
  CHECK(fs::exists(io::step_dir(tmp.path, 30) / "DONE"));
  CHECK(fs::exists(io::step_dir(tmp.path, 40) / "DONE"));
  CHECK(fs::exists(io::step_dir(tmp.path, 50)));
  CHECK(fs::exists(tmp.path / "logs"));

  io::prune_checkpoints(tmp.path, /*keep_last=*/0);  // still keeps the newest complete one
  CHECK_FALSE(fs::exists(io::step_dir(tmp.path, 30)));
  CHECK(io::latest_complete_checkpoint(tmp.path) == io::step_dir(tmp.path, 40));
  io::prune_checkpoints(tmp.path / "nonexistent", 1);  // nothing to do
}

TEST_CASE("checkpoint: check_free_space", "[unit][io]") {
  TempDir tmp;
  CHECK_NOTHROW(io::check_free_space(tmp.path, 0));
  CHECK_NOTHROW(io::check_free_space(tmp.path / "not" / "yet" / "created", 1024));
  try {
    io::check_free_space(tmp.path, UINT64_MAX);
    FAIL("expected an error");
  } catch (const mmpost::Error& e) {
    CHECK(e.kind() == mmpost::ErrorKind::kRuntime);
    CHECK(std::string(e.what()).find(tmp.path.string()) != std::string::npos);
    CHECK(std::string(e.what()).find("not enough free disk space") != std::string::npos);
    CHECK_FALSE(e.hint().empty());
  }
}

}  // namespace unit_test_io_checkpoint
