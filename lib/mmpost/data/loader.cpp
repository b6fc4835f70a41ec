// Non-template loader helpers (see loader.h).
#include "mmpost/data/loader.h"

#include <fstream>

namespace mmpost::data {

uint64_t sample_seed(uint64_t seed, int64_t epoch, int64_t seq) {
  // splitmix64 over the three inputs.
  uint64_t z = seed ^ (static_cast<uint64_t>(epoch) * 0x9E3779B97F4A7C15ULL) ^
               (static_cast<uint64_t>(seq) * 0xBF58476D1CE4E5B9ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

int64_t count_records(const std::string& path, int rank, int world_size) {
  std::ifstream in(path);
  MMPOST_CHECK_DATA(in.good(), path, ": cannot open data file");
  std::string line;
  int64_t index = 0, n = 0;
  while (std::getline(in, line)) {
    bool blank = line.find_first_not_of(" \t\r\n") == std::string::npos;
    if (blank) continue;
    if (index++ % world_size == rank) ++n;
  }
  return n;
}

}  // namespace mmpost::data
