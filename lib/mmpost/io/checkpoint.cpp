// Step folders, DONE markers, pruning and free-space checks for training runs (see checkpoint.h).
#include "mmpost/io/checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "mmpost/core/check.h"
#include "mmpost/io/atomic_file.h"

namespace mmpost::io {

namespace fs = std::filesystem;

namespace {

constexpr const char* kDoneName = "DONE";

struct StepFolder {
  int64_t step;
  fs::path path;
  bool complete;
};

// Step folders in `output_dir`, oldest first; empty if the folder does not exist.
std::vector<StepFolder> list_step_folders(const fs::path& output_dir) {
  std::vector<StepFolder> out;
  std::error_code ec;
  if (!fs::is_directory(output_dir, ec)) return out;
  for (const auto& entry : fs::directory_iterator(output_dir, ec)) {
    std::optional<int64_t> step = parse_step_dir_name(entry.path().filename().string());
    if (!step || !entry.is_directory(ec)) continue;
    out.push_back({*step, entry.path(), is_complete(entry.path())});
  }
  MMPOST_CHECK(!ec, output_dir.string(), ": cannot list folder: ", ec.message());
  std::sort(out.begin(), out.end(),
            [](const StepFolder& a, const StepFolder& b) { return a.step < b.step; });
  return out;
}

}  // namespace

std::string format_bytes(uint64_t bytes) {
  char buf[32];
  const double b = static_cast<double>(bytes);
  if (b >= 1024.0 * 1024 * 1024) {
    std::snprintf(buf, sizeof(buf), "%.2f GiB", b / (1024.0 * 1024 * 1024));
  } else {
    std::snprintf(buf, sizeof(buf), "%.1f MiB", b / (1024.0 * 1024));
  }
  return buf;
}

fs::path step_dir(const fs::path& output_dir, int64_t step) {
  MMPOST_CHECK_USAGE(step >= 0, "step_dir: step must be >= 0, got ", step);
  char name[32];
  std::snprintf(name, sizeof(name), "step_%06lld", static_cast<long long>(step));
  return output_dir / name;
}

std::optional<int64_t> parse_step_dir_name(const std::string& name) {
  const std::string prefix = "step_";
  if (name.size() <= prefix.size() || name.size() > prefix.size() + 18 ||
      name.compare(0, prefix.size(), prefix) != 0)
    return std::nullopt;
  int64_t step = 0;
  for (size_t i = prefix.size(); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    step = step * 10 + (name[i] - '0');  // <= 18 digits: cannot overflow
  }
  return step;
}

void write_text_atomic(const fs::path& file, const std::string& text) {
  AtomicFile out(file);
  out.write(text.data(), text.size());
  out.commit();
}

void mark_done(const fs::path& dir) { write_text_atomic(dir / kDoneName, "done\n"); }

bool is_complete(const fs::path& dir) {
  std::error_code ec;
  return fs::is_regular_file(dir / kDoneName, ec);
}

std::optional<fs::path> latest_complete_checkpoint(const fs::path& output_dir) {
  std::vector<StepFolder> folders = list_step_folders(output_dir);
  for (auto it = folders.rbegin(); it != folders.rend(); ++it)
    if (it->complete) return it->path;
  return std::nullopt;
}

void prune_checkpoints(const fs::path& output_dir, int keep_last) {
  std::vector<StepFolder> folders = list_step_folders(output_dir);
  std::vector<const StepFolder*> complete;
  for (const auto& f : folders)
    if (f.complete) complete.push_back(&f);
  if (complete.empty()) return;
  const size_t keep = static_cast<size_t>(std::max(keep_last, 1));
  const int64_t newest_complete = complete.back()->step;
  const int64_t oldest_kept =
      complete.size() > keep ? complete[complete.size() - keep]->step : complete.front()->step;
  for (const auto& f : folders) {
    bool remove = f.complete ? f.step < oldest_kept : f.step < newest_complete;
    if (!remove) continue;
    std::error_code ec;
    fs::remove(f.path / kDoneName, ec);
    if (!ec) fs::remove_all(f.path, ec);
    MMPOST_CHECK(!ec, f.path.string(), ": cannot remove old checkpoint: ", ec.message());
  }
}

void check_free_space(const fs::path& dir, uint64_t bytes_needed) {
  std::error_code ec;
  fs::path probe = fs::absolute(dir, ec);
  while (!probe.empty() && !fs::exists(probe, ec) && probe != probe.parent_path())
    probe = probe.parent_path();
  fs::space_info info = fs::space(probe, ec);
  MMPOST_CHECK(!ec, dir.string(), ": cannot query free disk space: ", ec.message());
  if (info.available < bytes_needed)
    throw Error(ErrorKind::kRuntime,
                dir.string() + ": not enough free disk space: need " + format_bytes(bytes_needed) +
                    ", available " + format_bytes(info.available),
                "free space, point output_dir to a larger disk, or keep fewer checkpoints");
}

}  // namespace mmpost::io
