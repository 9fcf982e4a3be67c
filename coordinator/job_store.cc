#include "coordinator/job_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/util/directories.h"

namespace stagecoach::coordinator {
namespace fs = std::filesystem;

int64_t JobNumber(const std::string& job_id) {
  int64_t n = 0;
  if (!absl::StartsWith(job_id, "job-") || !absl::SimpleAtoi(job_id.substr(4), &n)) return -1;
  return n;
}

absl::StatusOr<std::unique_ptr<FileJobStore>> FileJobStore::Open(const std::string& dir) {
  if (absl::Status ok = EnsureWritableDirectory(dir, "job table"); !ok.ok()) return ok;
  return std::unique_ptr<FileJobStore>(new FileJobStore(dir));
}

std::string FileJobStore::PathOf(const std::string& job_id) const {
  return (fs::path(dir_) / (job_id + ".pb")).string();
}

absl::Status FileJobStore::Remove(const std::string& job_id) {
  if (JobNumber(job_id) < 0) {
    return absl::InvalidArgumentError(absl::StrCat("job id '", job_id, "' is not job-<n>"));
  }
  std::error_code error;
  fs::remove(PathOf(job_id), error);
  if (error) {
    return absl::InternalError(
        absl::StrCat("job table: removing ", PathOf(job_id), ": ", error.message()));
  }
  return absl::OkStatus();
}

absl::Status FileJobStore::Save(const v1::Job& job) {
  if (JobNumber(job.id()) < 0) {
    return absl::InvalidArgumentError(absl::StrCat("job id '", job.id(), "' is not job-<n>"));
  }
  const std::string path = PathOf(job.id());
  const std::string tmp = path + ".tmp";
  std::string bytes;
  if (!job.SerializeToString(&bytes)) {
    return absl::InternalError(absl::StrCat("cannot serialise ", job.id()));
  }
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::InternalError(
        absl::StrCat("job table: cannot write ", tmp, ": ", std::strerror(errno)));
  }
  size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + written, bytes.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      return absl::InternalError(absl::StrCat("job table: writing ", tmp, ": ", why));
    }
    written += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    return absl::InternalError(
        absl::StrCat("job table: syncing ", tmp, ": ", std::strerror(errno)));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(
        absl::StrCat("job table: renaming ", tmp, " to ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

std::vector<v1::Job> FileJobStore::LoadAll(std::vector<std::string>* problems) {
  std::vector<v1::Job> jobs;
  std::error_code error;
  for (fs::directory_iterator it(dir_, error), end; !error && it != end; it.increment(error)) {
    const fs::path path = it->path();
    if (path.extension() != ".pb" || !it->is_regular_file()) continue;
    std::ifstream in(path, std::ios::binary);
    std::stringstream bytes;
    bytes << in.rdbuf();
    v1::Job job;
    if (!in || !job.ParseFromString(bytes.str()) || JobNumber(job.id()) < 0 ||
        path.stem().string() != job.id()) {
      const std::string aside = path.string() + ".corrupt";
      std::error_code ignored;
      fs::rename(path, aside, ignored);
      if (problems) {
        problems->push_back(absl::StrCat(path.string(), " is not a job record; moved to ", aside));
      }
      continue;
    }
    jobs.push_back(std::move(job));
  }
  if (error && problems) {
    problems->push_back(absl::StrCat("cannot list ", dir_, ": ", error.message()));
  }
  std::sort(jobs.begin(), jobs.end(), [](const v1::Job& a, const v1::Job& b) {
    return JobNumber(a.id()) < JobNumber(b.id());
  });
  return jobs;
}

}  // namespace stagecoach::coordinator
