#include "coordinator/jobs/job_store.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/util/directories.h"
#include "common/util/durable_file.h"

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
  std::string bytes;
  if (!job.SerializeToString(&bytes)) {
    return absl::InternalError(absl::StrCat("cannot serialise ", job.id()));
  }
  DurableFileOptions options;
  options.what = "job table record";
  return WriteFileDurably(PathOf(job.id()), bytes, options);
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
