// Test runner entry point: Catch2 v2 needs one translation unit with CATCH_CONFIG_MAIN;
// v3 links Catch2WithMain instead. Unit tests run torch single-threaded: on 2 shared cores the
// intra-op thread pool only adds contention to the tiny tensors the tests use.
#include <torch/torch.h>
#if !defined(MMPOST_CATCH3)
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
#endif

namespace {
const int kSingleThreaded = (torch::set_num_threads(1), 0);
}  // namespace
