// Durable files (see durable_file.h).
#include "common/util/durable_file.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace stagecoach {
namespace {

namespace fs = std::filesystem;

absl::Status AlreadyExists(const DurableFileOptions& options, const std::string& path) {
  return absl::AlreadyExistsError(
      absl::StrCat(options.what, " ", path, " already exists; it is not overwritten"));
}

std::string TempPath(const std::string& path, const DurableFileOptions& options) {
  static std::atomic<int64_t> counter{0};
  const fs::path target(path);
  const std::string prefix = options.temp_prefix.empty()
                                 ? absl::StrCat(".", target.filename().string(), ".")
                                 : options.temp_prefix;
  const std::string name = absl::StrCat(prefix, getpid(), "-", counter.fetch_add(1), ".tmp");
  return (target.parent_path() / name).string();
}

// The directory holding `path` ("." for a bare name).
std::string DirectoryOf(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? "." : parent.string();
}

// fsync of the directory `dir`, so that a rename or link in it is on disk. Filesystems that
// cannot sync a directory (EINVAL) have nothing to flush.
absl::Status SyncDirectory(const std::string& dir, const std::string& what,
                           const std::string& path) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    return ErrnoStatus(errno,
                       absl::StrCat(what, " ", path, ": opening directory ", dir, " to flush it"));
  }
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0 && err != EINVAL) {
    return ErrnoStatus(err, absl::StrCat(what, " ", path, ": flushing directory ", dir));
  }
  return absl::OkStatus();
}

// True for the errors of link(2) that mean "this filesystem has no hard links".
bool NoHardLinks(int err) {
  return err == EPERM || err == ENOTSUP || err == EOPNOTSUPP || err == ENOSYS || err == EMLINK;
}

}  // namespace

absl::Status ErrnoStatus(int err, absl::string_view message) {
  const std::string text = absl::StrCat(message, ": ", std::strerror(err));
  switch (err) {
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(text);
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(text);
    case ENOSPC:
    case EDQUOT:
      return absl::ResourceExhaustedError(text);
    default:
      return absl::DataLossError(text);
  }
}

absl::Status WriteFileDurably(const std::string& path, absl::string_view contents,
                              const DurableFileOptions& options) {
  auto writer = DurableFileWriter::Create(path, options);
  if (!writer.ok()) return writer.status();
  if (absl::Status s = (*writer)->Append(contents); !s.ok()) return s;
  return (*writer)->Commit();
}

absl::StatusOr<std::unique_ptr<DurableFileWriter>> DurableFileWriter::Create(
    std::string path, DurableFileOptions options) {
  if (options.if_exists == DurableFileOptions::IfExists::kFail) {
    std::error_code ec;
    if (fs::exists(path, ec)) return AlreadyExists(options, path);
  }
  std::string temp_path = TempPath(path, options);
  const int fd = ::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, options.mode);
  if (fd < 0) {
    return ErrnoStatus(
        errno, absl::StrCat(options.what, " ", path, ": cannot create temporary file ", temp_path));
  }
  return std::unique_ptr<DurableFileWriter>(
      new DurableFileWriter(std::move(path), std::move(temp_path), fd, std::move(options)));
}

DurableFileWriter::DurableFileWriter(std::string path, std::string temp_path, int fd,
                                     DurableFileOptions options)
    : path_(std::move(path)),
      temp_path_(std::move(temp_path)),
      options_(std::move(options)),
      fd_(fd) {}

DurableFileWriter::~DurableFileWriter() { Discard(); }

void DurableFileWriter::Discard() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!finished_) ::unlink(temp_path_.c_str());
  finished_ = true;
}

absl::Status DurableFileWriter::Append(absl::string_view bytes) {
  if (finished_) {
    return absl::FailedPreconditionError(
        absl::StrCat(options_.what, " ", path_, ": written after it was committed or discarded"));
  }
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd_, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      Discard();
      return ErrnoStatus(err, absl::StrCat(options_.what, " ", path_, ": writing ", temp_path_));
    }
    done += static_cast<size_t>(n);
  }
  bytes_written_ += static_cast<int64_t>(bytes.size());
  return absl::OkStatus();
}

absl::Status DurableFileWriter::Commit() {
  if (finished_) {
    return absl::FailedPreconditionError(
        absl::StrCat(options_.what, " ", path_, ": committed after it was committed or discarded"));
  }
  const int synced = ::fsync(fd_);
  int err = errno;
  const int closed = ::close(fd_);
  if (synced == 0 && closed != 0) err = errno;
  fd_ = -1;
  if (synced != 0 || closed != 0) {
    Discard();
    return ErrnoStatus(err, absl::StrCat(options_.what, " ", path_, ": flushing ", temp_path_));
  }
  if (absl::Status moved = MoveIntoPlace(); !moved.ok()) {
    Discard();
    return moved;
  }
  finished_ = true;
  return SyncDirectory(DirectoryOf(path_), options_.what, path_);
}

absl::Status DurableFileWriter::MoveIntoPlace() {
  if (options_.if_exists == DurableFileOptions::IfExists::kReplace) {
    if (::rename(temp_path_.c_str(), path_.c_str()) != 0) {
      return ErrnoStatus(
          errno, absl::StrCat(options_.what, " ", path_, ": renaming ", temp_path_, " to it"));
    }
    return absl::OkStatus();
  }
  // link() refuses an existing target, so a concurrent writer cannot be overwritten either.
  if (::link(temp_path_.c_str(), path_.c_str()) == 0) {
    ::unlink(temp_path_.c_str());
    return absl::OkStatus();
  }
  const int link_errno = errno;
  if (link_errno == EEXIST) return AlreadyExists(options_, path_);
  if (!NoHardLinks(link_errno)) {
    return ErrnoStatus(link_errno,
                       absl::StrCat(options_.what, " ", path_, ": linking ", temp_path_, " to it"));
  }
  // A filesystem without hard links: a rename that refuses an existing target.
  if (::renameat2(AT_FDCWD, temp_path_.c_str(), AT_FDCWD, path_.c_str(), RENAME_NOREPLACE) == 0) {
    return absl::OkStatus();
  }
  const int rename_errno = errno;
  if (rename_errno == EEXIST) return AlreadyExists(options_, path_);
  return ErrnoStatus(rename_errno,
                     absl::StrCat(options_.what, " ", path_, ": renaming ", temp_path_, " to it"));
}

}  // namespace stagecoach
