// The test suite's own names: ctest gets one test per Catch2 TEST_CASE through
// catch_discover_tests, which splits a name at ';' (a CMake list separator). Such a test was
// registered as two names that match nothing and "passed" without running; this keeps it from
// happening again.
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "catch.h"

namespace unit_test_names {

namespace fs = std::filesystem;

TEST_CASE("no TEST_CASE name holds a semicolon (ctest would run nothing for it)", "[unit]") {
  const std::regex test_case(R"re(TEST_CASE\(\s*((?:"(?:[^"\\]|\\.)*"\s*)+))re");
  int n_names = 0;
  for (const auto& e : fs::recursive_directory_iterator(fs::path(MMPOST_SOURCE_DIR) / "tests")) {
    if (e.path().extension() != ".cpp") continue;
    std::ifstream in(e.path());
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    for (std::sregex_iterator it(text.begin(), text.end(), test_case), end; it != end; ++it) {
      ++n_names;
      INFO(e.path().string() << ": " << (*it)[1].str());
      CHECK((*it)[1].str().find(';') == std::string::npos);
    }
  }
  CHECK(n_names > 150);  // the scan really saw the suite
}

}  // namespace unit_test_names
