// Non-template loader helpers (see loader.h).
#include "mmpost/data/loader.h"

#include <fstream>

namespace mmpost::data {

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
