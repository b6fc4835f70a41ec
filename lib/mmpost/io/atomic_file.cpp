// Crash-safe file writes (see atomic_file.h): POSIX open/write/fsync/rename so that errno-level
// failures (ENOSPC, EDQUOT, EFBIG, EIO) surface as mmpost::Error naming the file.
#include "mmpost/io/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "mmpost/core/check.h"

namespace mmpost::io {
namespace {

std::string hint_for(int err) {
  if (err == ENOSPC || err == EDQUOT)
    return "the disk is full: free space or choose another output folder";
  if (err == EFBIG) return "the file passes the size limit (ulimit -f) or the file system's limit";
  if (err == ENOENT) return "the folder does not exist";
  if (err == EACCES || err == EPERM || err == EROFS) return "check the folder's permissions";
  return "";
}

// fsync of the folder makes the rename itself durable; some file systems refuse (EINVAL), which
// is harmless here, so failures are ignored.
void fsync_dir(const std::filesystem::path& dir) {
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  (void)::fsync(fd);
  ::close(fd);
}

}  // namespace

AtomicFile::AtomicFile(std::filesystem::path file) : file_(std::move(file)) {
  temp_ = file_;
  temp_ += ".tmp." + std::to_string(::getpid());
  fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    int err = errno;
    throw Error(ErrorKind::kRuntime,
                file_.string() + ": cannot create temp file " + temp_.filename().string() + ": " +
                    std::strerror(err),
                hint_for(err));
  }
}

AtomicFile::~AtomicFile() {
  if (!committed_) discard();
}

void AtomicFile::discard() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  std::error_code ec;
  std::filesystem::remove(temp_, ec);
}

void AtomicFile::fail(const char* what, int err) {
  discard();
  committed_ = true;  // nothing left to clean up
  throw Error(ErrorKind::kRuntime, file_.string() + ": " + what + ": " + std::strerror(err),
              hint_for(err));
}

void AtomicFile::write(const void* data, size_t n) {
  MMPOST_CHECK(fd_ >= 0 && !committed_, file_.string(), ": write after commit or failure");
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    // Linux writes at most ~2 GiB per call; loop over partial writes and EINTR.
    ssize_t w = ::write(fd_, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      fail("write failed", errno);
    }
    if (w == 0) fail("write failed", EIO);
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void AtomicFile::commit() {
  MMPOST_CHECK(fd_ >= 0 && !committed_, file_.string(), ": commit after commit or failure");
  if (::fsync(fd_) != 0) fail("fsync failed", errno);
  int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) fail("close failed", errno);
  if (::rename(temp_.c_str(), file_.c_str()) != 0) fail("rename failed", errno);
  committed_ = true;
  fsync_dir(file_.parent_path());
}

}  // namespace mmpost::io
