// Non-template loader helpers (see loader.h).
#include "mmpost/data/loader.h"

#include <chrono>
#include <fstream>

#include "mmpost/io/jsonl.h"

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

ValidationReport validate_records(const std::string& path,
                                  const std::function<void(const nlohmann::json&, int64_t)>& check,
                                  int64_t num_workers, int64_t max_errors) {
  const auto t0 = std::chrono::steady_clock::now();
  ValidationReport report;
  io::JsonlReader reader(path);
  const int64_t n_threads = std::max<int64_t>(1, num_workers);
  constexpr size_t kChunk = 4096;
  std::vector<io::JsonlRecord> chunk(kChunk);
  std::vector<std::string> errors(kChunk);
  bool more = true;
  while (more) {
    size_t n = 0;
    while (n < kChunk && (more = reader.next(chunk[n]))) ++n;
    // Each worker takes every n_threads-th record of the chunk; errors land in their slot, so
    // the report keeps file order whatever the thread timing.
    auto work = [&](int64_t t) {
      for (size_t i = static_cast<size_t>(t); i < n; i += static_cast<size_t>(n_threads)) {
        errors[i].clear();
        if (!chunk[i].error.empty()) {
          errors[i] = chunk[i].error;
          continue;
        }
        try {
          check(chunk[i].value, chunk[i].line);
        } catch (const Error& e) {
          errors[i] = e.message();
        } catch (const std::exception& e) {
          errors[i] = io::location(path, chunk[i].line) + ": " + e.what();
        }
      }
    };
    std::vector<std::thread> pool;
    for (int64_t t = 1; t < n_threads; ++t) pool.emplace_back(work, t);
    work(0);
    for (auto& th : pool) th.join();
    for (size_t i = 0; i < n; ++i) {
      if (errors[i].empty()) continue;
      if (static_cast<int64_t>(report.errors.size()) < max_errors) report.errors.push_back(errors[i]);
      ++report.n_bad;
    }
    report.n_records += static_cast<int64_t>(n);
  }
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return report;
}

ValidationReport validate_before_training(
    const std::string& path, const std::function<void(const nlohmann::json&, int64_t)>& check,
    bool skip_bad, int64_t num_workers, const std::string& what, int64_t max_errors) {
  auto r = validate_records(path, check, num_workers, max_errors);
  char secs[32];
  std::snprintf(secs, sizeof secs, "%.1f", r.seconds);
  log_info(what + ": checked " + std::to_string(r.n_records) + " records of " +
           io::display_name(path) + " in " + secs + " s: " + std::to_string(r.n_bad) + " bad");
  if (r.n_records == 0) {
    throw Error(ErrorKind::kData,
                io::display_name(path) + ": no records (the file is empty or holds only blank lines)",
                "training needs at least one record: check data.train");
  }
  if (r.n_bad == 0) return r;
  std::string list;
  for (const auto& e : r.errors) list += "\n  " + e;
  if (r.n_bad > static_cast<int64_t>(r.errors.size())) {
    list += "\n  ... and " + std::to_string(r.n_bad - static_cast<int64_t>(r.errors.size())) +
            " more";
  }
  if (!skip_bad) {
    throw Error(ErrorKind::kData,
                io::display_name(path) + ": " + std::to_string(r.n_bad) + " of " +
                    std::to_string(r.n_records) + " records are bad (found before training):" + list,
                "fix the records, or skip them and count them (data.on_bad_sample=skip)");
  }
  if (r.n_bad == r.n_records) {
    throw Error(ErrorKind::kData,
                io::display_name(path) + ": all " + std::to_string(r.n_records) +
                    " records are bad (found before training), nothing to train on:" + list,
                "fix the records (data.on_bad_sample=skip only skips some)");
  }
  log_warn(what + ": " + std::to_string(r.n_bad) + " of " + std::to_string(r.n_records) +
           " records will be skipped (data.on_bad_sample=skip):" + list);
  return r;
}

}  // namespace mmpost::data
