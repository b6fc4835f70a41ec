// Catch2 v2 (Debian 12) / v3 (Debian 13) compatibility: include this, never Catch2 directly.
// HasSubstr(s) is the substring matcher under both versions.
#pragma once
#include <string>
#if defined(MMPOST_CATCH3)
#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
using Catch::Approx;
inline auto HasSubstr(const std::string& s) { return Catch::Matchers::ContainsSubstring(s); }
#else
#include <catch2/catch.hpp>
inline auto HasSubstr(const std::string& s) { return Catch::Matchers::Contains(s); }
#endif
