// Training-run checkpoint folders: OUTPUT/step_000120/ holding the model and state, with a DONE
// file written last so a crash mid-save never yields a folder that resume would trust (llm.c's
// DONE_%08d). Also atomic text writes, pruning of old checkpoints and a free-space check.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

namespace mmpost::io {

/// `output_dir / "step_000120"` (at least 6 digits). Throws mmpost::Error (kUsage) if step < 0.
std::filesystem::path step_dir(const std::filesystem::path& output_dir, int64_t step);

/// The step of a folder name "step_<digits>", or nullopt for any other name.
std::optional<int64_t> parse_step_dir_name(const std::string& name);

/// Writes `text` to `file` atomically (temp "<file>.tmp.<pid>", fsync, rename, fsync of the
/// folder). Throws mmpost::Error (kRuntime) naming the file; the temp file is removed.
void write_text_atomic(const std::filesystem::path& file, const std::string& text);

/// Writes `dir / "DONE"` atomically. Call it after everything else in `dir` is written (the
/// writers here fsync each file, so DONE implies the rest is on disk).
void mark_done(const std::filesystem::path& dir);

/// True if `dir / "DONE"` exists.
bool is_complete(const std::filesystem::path& dir);

/// The `step_*` folder in `output_dir` with the highest step that holds DONE; nullopt if there is
/// none or `output_dir` does not exist. Incomplete folders (a crash mid-save) are ignored.
std::optional<std::filesystem::path> latest_complete_checkpoint(
    const std::filesystem::path& output_dir);

/// Removes complete step folders beyond the newest `keep_last` ones (values < 1 count as 1: the
/// newest complete one is never removed), and incomplete step folders older than the newest
/// complete one (crash leftovers resume can never use). Incomplete folders newer than it are left
/// alone (possibly being written). DONE is deleted first so a half-removed folder is never trusted.
/// Throws mmpost::Error (kRuntime) naming the folder if removal fails.
void prune_checkpoints(const std::filesystem::path& output_dir, int keep_last);

/// "1.25 GiB", or "3.4 MiB" below 1 GiB (binary units).
std::string format_bytes(uint64_t bytes);

/// Throws mmpost::Error (kRuntime) with a hint if the file system of `dir` (or of its nearest
/// existing parent) has fewer than `bytes_needed` bytes available to this user.
void check_free_space(const std::filesystem::path& dir, uint64_t bytes_needed);

}  // namespace mmpost::io
