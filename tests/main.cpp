// Test runner entry point: Catch2 v2 needs one translation unit with CATCH_CONFIG_MAIN;
// v3 links Catch2WithMain instead, so this file is empty there.
#if !defined(MMPOST_CATCH3)
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
#endif
