// Tests for io/safetensors: round trips of every dtype, a file written by Python's safetensors
// (tests/golden/fixtures/safetensors, from scripts/golden/make_safetensors_fixture.py), mmap
// aliasing, sharding, write failures, and rejection of crafted invalid files.
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <nlohmann/json.hpp>

#include "catch.h"
#include "test_util.h"
#include "mmpost/core/check.h"
#include "mmpost/io/safetensors.h"

namespace unit_test_io_safetensors {

namespace fs = std::filesystem;
using mmpost::io::SafetensorsFile;

using mmpost::testing::TempDir;
using mmpost::testing::read_all;

namespace {


// Writes [u64 header_len][header][data] with an explicit (possibly lying) header length.
void write_raw(const fs::path& file, uint64_t header_len, const std::string& header,
               const std::string& data = "") {
  std::ofstream out(file, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&header_len), 8);
  out << header << data;
}

void write_raw(const fs::path& file, const std::string& header, const std::string& data = "") {
  write_raw(file, header.size(), header, data);
}

// The message of the mmpost::Error thrown while opening `file` and reading every tensor.
std::string error_of(const fs::path& file) {
  try {
    SafetensorsFile f(file);
    for (const auto& name : f.keys()) f.tensor(name);
  } catch (const mmpost::Error& e) {
    return e.what();
  }
  return "(no error)";
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

bool aliases(const SafetensorsFile& f, const torch::Tensor& t) {
  const auto* p = static_cast<const std::byte*>(t.data_ptr());
  return p >= f.mapping_data() && p < f.mapping_data() + f.mapping_size();
}

}  // namespace

TEST_CASE("safetensors: round trip of every dtype, a 0-d scalar and an empty tensor",
          "[unit][io]") {
  TempDir tmp;
  std::map<std::string, torch::Tensor> tensors = {
      {"f64", torch::tensor({1.0 / 3.0, -2.5}, torch::kFloat64)},
      {"f32", torch::arange(12, torch::kFloat32).reshape({3, 4}) / 7.0},
      {"f16", torch::tensor({0.5, -1.25, 1000.0}).to(torch::kFloat16)},
      {"bf16", torch::tensor({1.5, -3.0, 0.0078125}).to(torch::kBFloat16)},
      {"i64", torch::tensor({int64_t{-1} << 50, int64_t{7}}, torch::kInt64)},
      {"i32", torch::tensor({-5, 2147483647}, torch::kInt32)},
      {"i16", torch::tensor({-32768, 99}, torch::kInt16)},
      {"i8", torch::tensor({-128, 127, 1}, torch::kInt8)},
      {"u8", torch::tensor({0, 255, 1}, torch::kUInt8)},
      {"bool", torch::tensor({true, false, true})},
      {"scalar", torch::tensor(2.75, torch::kFloat32)},  // 0-d
      {"empty", torch::zeros({0, 5}, torch::kBFloat16)},
      {"transposed", torch::arange(6, torch::kInt32).reshape({2, 3}).t()},  // non-contiguous
  };
  const fs::path file = tmp.path / "all.safetensors";
  mmpost::io::save_safetensors(file, tensors, {{"format", "pt"}, {"step", "12"}});

  // Data starts 8-byte aligned (header padded) and no temp file is left behind.
  uint64_t header_len = 0;
  std::ifstream(file, std::ios::binary).read(reinterpret_cast<char*>(&header_len), 8);
  CHECK((8 + header_len) % 8 == 0);
  CHECK(std::distance(fs::directory_iterator(tmp.path), fs::directory_iterator()) == 1);

  auto contents = mmpost::io::read_safetensors(file);
  CHECK(contents.metadata == std::map<std::string, std::string>{{"format", "pt"}, {"step", "12"}});
  REQUIRE(contents.tensors.size() == tensors.size());
  for (const auto& [name, expected] : tensors) {
    INFO(name);
    const torch::Tensor& got = contents.tensors.at(name);
    CHECK(got.scalar_type() == expected.scalar_type());
    CHECK(got.sizes() == expected.sizes());
    CHECK(torch::equal(got, expected));
  }
  CHECK(contents.tensors.at("scalar").dim() == 0);
  CHECK(contents.tensors.at("scalar").item<float>() == 2.75f);
  CHECK(contents.tensors.at("bf16")[2].item<float>() == 0.0078125f);
}

TEST_CASE("safetensors: reads a file written by Python safetensors", "[unit][io]") {
  const fs::path file = fs::path(MMPOST_SOURCE_DIR) /
                        "tests/golden/fixtures/safetensors/python_reference.safetensors";
  SafetensorsFile f(file);
  CHECK(f.metadata() == std::map<std::string, std::string>{{"format", "pt"},
                                                           {"source", "mmpost-fixture"}});
  CHECK(f.keys() == std::vector<std::string>{"bf16", "bool", "empty", "f16", "f32", "f64", "i16",
                                             "i32", "i64", "i8", "u8"});
  CHECK(f.info("i64").offset_begin == 0);
  CHECK(f.info("i64").offset_end == 24);
  CHECK(f.info("bf16").dtype_name == "BF16");

  auto as_floats = [&](const std::string& name) {
    torch::Tensor t = f.tensor(name).to(torch::kFloat64).flatten();
    return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
  };
  CHECK(f.tensor("f32").sizes() == std::vector<int64_t>{2, 3});
  CHECK(as_floats("f32") == std::vector<double>{-1.0, -0.5, 0.0, 0.5, 1.0, 1.5});
  CHECK(f.tensor("bf16").scalar_type() == torch::kBFloat16);
  CHECK(as_floats("bf16") == std::vector<double>{1.5, -2.0, 0.0078125, 3.00405527047391e+38});
  CHECK(f.tensor("f16").scalar_type() == torch::kFloat16);
  CHECK(as_floats("f16") == std::vector<double>{0.25, -65504.0, 6.103515625e-05, 1.0});
  CHECK(f.tensor("f64").dim() == 0);
  CHECK(f.tensor("f64").item<double>() == 3.141592653589793);
  CHECK(torch::equal(f.tensor("i64"),
                     torch::tensor({-(int64_t{1} << 40), int64_t{0}, int64_t{1} << 62})));
  CHECK(torch::equal(f.tensor("i32"), torch::tensor({-7, 2147483647}, torch::kInt32)));
  CHECK(torch::equal(f.tensor("i16"), torch::tensor({-32768, 12345}, torch::kInt16)));
  CHECK(torch::equal(f.tensor("i8"), torch::tensor({-128, 127, 3}, torch::kInt8)));
  CHECK(torch::equal(f.tensor("u8"), torch::tensor({0, 255, 7}, torch::kUInt8)));
  CHECK(torch::equal(f.tensor("bool"), torch::tensor({true, false, true})));
  CHECK(f.tensor("empty").sizes() == std::vector<int64_t>{0, 3});
}

TEST_CASE("safetensors: aligned tensors alias the mapping, misaligned ones are copied",
          "[unit][io]") {
  TempDir tmp;
  const fs::path file = tmp.path / "w.safetensors";
  mmpost::io::save_safetensors(file, {{"a_byte", torch::tensor({1, 2, 3}, torch::kUInt8)},
                                      {"b_f32", torch::arange(8, torch::kFloat32)},
                                      {"c_f64", torch::ones({3}, torch::kFloat64)}});
  torch::Tensor t;
  {
    SafetensorsFile f(file);
    for (const auto& name : f.keys()) CHECK(aliases(f, f.tensor(name)));
    t = f.tensor("b_f32");
  }
  // The tensor keeps the mapping alive after the SafetensorsFile is gone; writes are private.
  CHECK(t[7].item<float>() == 7.0f);
  t.mul_(2);
  CHECK(t[7].item<float>() == 14.0f);
  CHECK(mmpost::io::load_safetensors(file).at("b_f32")[7].item<float>() == 7.0f);

  // A hand-made file whose F32 data starts at data offset 1 (not 4-aligned): copied, still right.
  const float values[2] = {1.5f, -2.25f};
  std::string data(1, '\x09');
  data.append(reinterpret_cast<const char*>(values), sizeof(values));
  std::string header =
      R"({"u":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
      R"("x":{"dtype":"F32","shape":[2],"data_offsets":[1,9]}})";
  header.append((8 - (8 + header.size()) % 8) % 8, ' ');
  const fs::path odd = tmp.path / "odd.safetensors";
  write_raw(odd, header, data);
  SafetensorsFile f(odd);
  CHECK(aliases(f, f.tensor("u")));
  CHECK_FALSE(aliases(f, f.tensor("x")));
  CHECK(torch::equal(f.tensor("x"), torch::tensor({1.5f, -2.25f})));
}

// This process's resident set (kB), /proc/self/status "VmRSS:"; -1 when unreadable.
int64_t vm_rss_kb() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  return -1;
}

TEST_CASE("safetensors: release_mapped_pages drops a loaded tensor's pages and keeps its values",
          "[unit][io]") {
  TempDir tmp;
  const fs::path file = tmp.path / "big.safetensors";
  const auto big = torch::arange(int64_t{4} << 20, torch::kFloat32);  // 16 MiB
  const auto small = torch::arange(5, torch::kFloat32);
  mmpost::io::save_safetensors(file, {{"big", big}, {"small", small}});
  auto loaded = mmpost::io::load_safetensors(file);
  const torch::Tensor& t = loaded.at("big");
  CHECK(torch::equal(t, big));  // every page of it read: resident now
  const int64_t before = vm_rss_kb();
  REQUIRE(before > 0);
  mmpost::io::release_mapped_pages(t);
  const int64_t after = vm_rss_kb();
  CHECK(before - after >= 12 * 1024);  // at least 12 of its 16 MiB left the resident set
  CHECK(torch::equal(t, big));                     // its bytes read back from the file
  CHECK(torch::equal(loaded.at("small"), small));  // the neighbour sharing its last page is intact
  // Heap memory is never advised: a copy (and an undefined tensor) are left alone.
  auto heap = big.clone();
  mmpost::io::release_mapped_pages(heap);
  mmpost::io::release_mapped_pages(torch::Tensor());
  CHECK(torch::equal(heap, big));
}

TEST_CASE("safetensors: sharded save and load equal the original", "[unit][io]") {
  TempDir tmp;
  std::map<std::string, torch::Tensor> tensors;
  for (int i = 0; i < 5; ++i)
    tensors["layer." + std::to_string(i) + ".weight"] = torch::randn({4, 8}) + i;  // 128 B each
  tensors["big"] = torch::arange(100, torch::kFloat64);                            // 800 B
  const fs::path dir = tmp.path / "model";
  mmpost::io::save_safetensors_sharded(dir, tensors, /*max_shard_bytes=*/300, {{"format", "pt"}});

  // Name order: "big" alone (over the limit), then layers 0-1, 2-3, 4.
  for (const char* shard : {"model-00001-of-00004.safetensors", "model-00002-of-00004.safetensors",
                            "model-00003-of-00004.safetensors", "model-00004-of-00004.safetensors"})
    CHECK(fs::exists(dir / shard));
  CHECK_FALSE(fs::exists(dir / "model.safetensors"));
  nlohmann::json index = nlohmann::json::parse(std::ifstream(dir / "model.safetensors.index.json"));
  CHECK(index["metadata"]["total_size"] == 5 * 128 + 800);
  CHECK(index["weight_map"]["big"] == "model-00001-of-00004.safetensors");
  CHECK(index["weight_map"]["layer.2.weight"] == "model-00003-of-00004.safetensors");

  auto contents = mmpost::io::read_safetensors(dir);
  CHECK(contents.metadata.at("format") == "pt");
  REQUIRE(contents.tensors.size() == tensors.size());
  for (const auto& [name, t] : tensors) CHECK(torch::equal(contents.tensors.at(name), t));

  // Saving again below the limit writes model.safetensors and removes the stale shards and index.
  mmpost::io::save_safetensors_sharded(dir, {{"w", torch::ones({2})}}, 1 << 20);
  CHECK(fs::exists(dir / "model.safetensors"));
  CHECK(std::distance(fs::directory_iterator(dir), fs::directory_iterator()) == 1);
  auto single = mmpost::io::load_safetensors(dir);
  REQUIRE(single.size() == 1);
  CHECK(torch::equal(single.at("w"), torch::ones({2})));

  // An index naming a tensor its shard lacks is an error naming shard and tensor.
  mmpost::io::save_safetensors_sharded(dir, tensors, 300);
  nlohmann::json bad = index;
  bad["weight_map"]["ghost"] = "model-00004-of-00004.safetensors";
  std::ofstream(dir / "model.safetensors.index.json") << bad.dump();
  try {
    mmpost::io::load_safetensors(dir);
    FAIL("expected an error");
  } catch (const mmpost::Error& e) {
    CHECK(contains(e.what(), "model-00004-of-00004.safetensors"));
    CHECK(contains(e.what(), "'ghost'"));
  }
}

TEST_CASE("safetensors: a folder without model files is an error naming it", "[unit][io]") {
  TempDir tmp;
  try {
    mmpost::io::load_safetensors(tmp.path);
    FAIL("expected an error");
  } catch (const mmpost::Error& e) {
    CHECK(e.kind() == mmpost::ErrorKind::kData);
    CHECK(contains(e.what(), tmp.path.string()));
    CHECK(contains(e.what(), "model.safetensors"));
  }
}

TEST_CASE("safetensors: rejects invalid files, naming the file and tensor", "[unit][io]") {
  TempDir tmp;
  const fs::path file = tmp.path / "bad_input.safetensors";
  const std::string f32x2 = std::string(8, '\0');  // 2 float zeros
  std::string expect_tensor;
  std::string expect_text;

  SECTION("truncated file") {
    std::ofstream(file, std::ios::binary) << "abc";
    expect_text = "shorter than the 8-byte header length";
  }
  SECTION("oversized header length") {
    write_raw(file, uint64_t{200'000'000}, "{}");
    expect_text = "exceeds the 100 MB limit";
  }
  SECTION("header length past the end of the file") {
    write_raw(file, 1000, R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})");
    expect_text = "extends past the end of the file";
  }
  SECTION("invalid JSON") {
    write_raw(file, R"({"x":{"dtype":"F32",)");
    expect_text = "header is not valid JSON";
  }
  SECTION("header not an object") {
    write_raw(file, "[1,2]");
    expect_text = "not an object";
  }
  SECTION("entry missing data_offsets") {
    write_raw(file, R"({"w":{"dtype":"F32","shape":[2]}})", f32x2);
    expect_tensor = "'w'";
    expect_text = "no \"data_offsets\"";
  }
  SECTION("negative dimension") {
    write_raw(file, R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", f32x2);
    expect_tensor = "'w'";
    expect_text = "negative dimension";
  }
  SECTION("begin > end") {
    write_raw(file, R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", f32x2);
    expect_tensor = "'w'";
    expect_text = "begin > end";
  }
  SECTION("overlapping offsets") {
    write_raw(file,
              R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
              R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
              std::string(12, '\0'));
    expect_tensor = "'b'";
    expect_text = "overlaps tensor 'a'";
  }
  SECTION("offsets past the end of the data") {
    write_raw(file, R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", f32x2);
    expect_tensor = "'w'";
    expect_text = "extend past the end of the data";
  }
  SECTION("byte count does not match the shape") {
    write_raw(file, R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", f32x2);
    expect_tensor = "'w'";
    expect_text = "needs 3 x 4";
  }
  SECTION("element count overflows") {
    write_raw(file,
              R"({"w":{"dtype":"F64","shape":[4294967296,4294967296,2],"data_offsets":[0,8]}})",
              f32x2);
    expect_tensor = "'w'";
    expect_text = "too many elements";
  }
  SECTION("unknown dtype") {
    write_raw(file, R"({"w":{"dtype":"F8_E4M3","shape":[8],"data_offsets":[0,8]}})", f32x2);
    expect_tensor = "'w'";
    expect_text = "unsupported dtype 'F8_E4M3'";
  }
  SECTION("BOOL bytes other than 0/1") {
    write_raw(file, R"({"m":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}})", "\x01\x07");
    expect_tensor = "'m'";
    expect_text = "other than 0 and 1";
  }
  SECTION("non-string metadata") {
    write_raw(file, R"({"__metadata__":{"step":12}})");
    expect_text = "'step' is not a string";
  }
  const std::string msg = error_of(file);
  INFO(msg);
  CHECK(contains(msg, "bad_input.safetensors"));
  CHECK(contains(msg, expect_text));
  if (!expect_tensor.empty()) CHECK(contains(msg, "tensor " + expect_tensor));
}

TEST_CASE("safetensors: write errors name the file and leave no temp file", "[unit][io]") {
  TempDir tmp;
  SECTION("missing folder") {
    const fs::path file = tmp.path / "no_such_dir" / "out.safetensors";
    try {
      mmpost::io::save_safetensors(file, {{"x", torch::ones({2})}});
      FAIL("expected an error");
    } catch (const mmpost::Error& e) {
      CHECK(e.kind() == mmpost::ErrorKind::kRuntime);
      CHECK(contains(e.what(), "out.safetensors"));
    }
  }
  SECTION("file size limit reached mid-write (stands in for a full disk)") {
    // RLIMIT_FSIZE makes write() fail with EFBIG once the file would pass 4 KiB.
    const fs::path file = tmp.path / "big.safetensors";
    struct rlimit old_limit {};
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &old_limit) == 0);
    auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
    struct rlimit small = old_limit;
    small.rlim_cur = 4096;
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
    std::string msg;
    try {
      mmpost::io::save_safetensors(file, {{"x", torch::ones({10000})}});
    } catch (const mmpost::Error& e) {
      msg = e.what();
    }
    ::setrlimit(RLIMIT_FSIZE, &old_limit);
    std::signal(SIGXFSZ, old_handler);
    INFO(msg);
    CHECK(contains(msg, "big.safetensors: write failed"));
    CHECK_FALSE(fs::exists(file));
    CHECK(fs::is_empty(tmp.path));  // temp removed
  }
  SECTION("unsupported dtype is a usage error naming the tensor") {
    try {
      mmpost::io::save_safetensors(tmp.path / "c.safetensors",
                                   {{"cplx", torch::ones({2}, torch::kComplexFloat)}});
      FAIL("expected an error");
    } catch (const mmpost::Error& e) {
      CHECK(e.kind() == mmpost::ErrorKind::kUsage);
      CHECK(contains(e.what(), "'cplx'"));
    }
    CHECK(fs::is_empty(tmp.path));
  }
}

TEST_CASE("safetensors: corrupted and truncated files throw mmpost::Error, never crash",
          "[unit][io]") {
  // Byte flips and truncations of the Python fixture; anything but mmpost::Error fails the test.
  TempDir tmp;
  std::ifstream in(fs::path(MMPOST_SOURCE_DIR) /
                       "tests/golden/fixtures/safetensors/python_reference.safetensors",
                   std::ios::binary);
  const std::string original((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
  REQUIRE(original.size() > 100);
  std::mt19937 rng(1234);
  const fs::path file = tmp.path / "fuzz.safetensors";
  int n_errors = 0;
  for (int i = 0; i < 100; ++i) {
    std::string bytes = original;
    if (i % 4 == 0) {
      bytes.resize(rng() % bytes.size());
    } else {
      for (int k = 0; k < 1 + i % 3; ++k) bytes[rng() % bytes.size()] = static_cast<char>(rng());
    }
    std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
    if (error_of(file) != "(no error)") ++n_errors;
  }
  CHECK(n_errors > 25);  // most corruptions are detected (flips in tensor data are not)
}

}  // namespace unit_test_io_safetensors
