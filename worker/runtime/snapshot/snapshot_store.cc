#include "worker/runtime/snapshot/snapshot_store.h"

#include "absl/strings/str_cat.h"

namespace stagecoach::runtime {
namespace {

// A job's steps kept while the oldest is below the coordinator's keep_from, and at most.
constexpr size_t kStepsKept = 2;
constexpr size_t kMostSteps = 3;

}  // namespace

SnapshotStore::Steps::iterator SnapshotStore::DropLocked(Job& job, Steps::iterator it) {
  for (const auto& [name, held] : it->second) bytes_ -= static_cast<int64_t>(held.bytes->size());
  return job.steps.erase(it);
}

void SnapshotStore::Put(const std::string& job_id, int64_t step, int rank,
                        const v1::StageCheckpointFile& file, Bytes bytes) {
  absl::MutexLock lock(&mu_);
  Job& job = jobs_[job_id];
  File& slot = job.steps[step][file.file()];
  if (slot.bytes != nullptr) bytes_ -= static_cast<int64_t>(slot.bytes->size());
  bytes_ += static_cast<int64_t>(bytes->size());
  slot = File{rank, file, std::move(bytes)};
  while (job.steps.size() > kMostSteps ||
         (job.steps.size() > kStepsKept && job.steps.begin()->first < job.keep_from)) {
    DropLocked(job, job.steps.begin());
  }
}

absl::StatusOr<SnapshotStore::Bytes> SnapshotStore::Get(const std::string& job_id, int64_t step,
                                                        const std::string& file) const {
  absl::MutexLock lock(&mu_);
  auto job = jobs_.find(job_id);
  if (job != jobs_.end()) {
    auto at = job->second.steps.find(step);
    if (at != job->second.steps.end()) {
      auto it = at->second.find(file);
      if (it != at->second.end()) return it->second.bytes;
    }
  }
  return absl::NotFoundError(absl::StrCat("this worker holds no ", file, " of ", job_id,
                                          "'s in-memory snapshot after step ", step));
}

std::vector<v1::SnapshotCopy> SnapshotStore::Held(const std::string& job_id, int64_t step) const {
  absl::MutexLock lock(&mu_);
  std::map<int, v1::SnapshotCopy> by_rank;
  auto job = jobs_.find(job_id);
  if (job == jobs_.end()) return {};
  auto at = job->second.steps.find(step);
  if (at == job->second.steps.end()) return {};
  for (const auto& [name, file] : at->second) {
    v1::SnapshotCopy& copy = by_rank[file.rank];
    copy.set_rank(file.rank);
    *copy.add_files() = file.entry;
  }
  std::vector<v1::SnapshotCopy> held;
  for (auto& [rank, copy] : by_rank) held.push_back(std::move(copy));
  return held;
}

std::vector<std::string> SnapshotStore::Jobs() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> jobs;
  for (const auto& [job, held] : jobs_) jobs.push_back(job);
  return jobs;
}

void SnapshotStore::KeepFrom(const std::string& job_id, int64_t from_step) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  Job& job = it->second;
  job.keep_from = from_step;
  for (auto at = job.steps.begin(); at != job.steps.end();) {
    at = (from_step >= 0 && at->first >= from_step) ? std::next(at) : DropLocked(job, at);
  }
  if (job.steps.empty()) jobs_.erase(it);
}

void SnapshotStore::DropAfter(const std::string& job_id, int64_t step) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  Job& job = it->second;
  for (auto at = job.steps.upper_bound(step); at != job.steps.end();) at = DropLocked(job, at);
}

int64_t SnapshotStore::bytes() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

}  // namespace stagecoach::runtime
