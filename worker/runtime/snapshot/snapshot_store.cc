#include "worker/runtime/snapshot/snapshot_store.h"

#include "absl/strings/str_cat.h"

namespace stagecoach::runtime {
namespace {

// A job's steps kept at most: the latest complete snapshot and the one being taken.
constexpr size_t kStepsKept = 2;

}  // namespace

void SnapshotStore::Put(const std::string& job_id, int64_t step, int rank,
                        const v1::StageCheckpointFile& file, Bytes bytes) {
  absl::MutexLock lock(&mu_);
  Steps& steps = jobs_[job_id];
  File& slot = steps[step][file.file()];
  if (slot.bytes != nullptr) bytes_ -= static_cast<int64_t>(slot.bytes->size());
  bytes_ += static_cast<int64_t>(bytes->size());
  slot = File{rank, file, std::move(bytes)};
  while (steps.size() > kStepsKept) {
    for (const auto& [name, held] : steps.begin()->second) {
      bytes_ -= static_cast<int64_t>(held.bytes->size());
    }
    steps.erase(steps.begin());
  }
}

absl::StatusOr<SnapshotStore::Bytes> SnapshotStore::Get(const std::string& job_id, int64_t step,
                                                        const std::string& file) const {
  absl::MutexLock lock(&mu_);
  auto job = jobs_.find(job_id);
  if (job != jobs_.end()) {
    auto at = job->second.find(step);
    if (at != job->second.end()) {
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
  auto at = job->second.find(step);
  if (at == job->second.end()) return {};
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
  for (const auto& [job, steps] : jobs_) jobs.push_back(job);
  return jobs;
}

void SnapshotStore::KeepFrom(const std::string& job_id, int64_t from_step) {
  absl::MutexLock lock(&mu_);
  auto job = jobs_.find(job_id);
  if (job == jobs_.end()) return;
  Steps& steps = job->second;
  for (auto it = steps.begin(); it != steps.end();) {
    if (from_step >= 0 && it->first >= from_step) {
      ++it;
      continue;
    }
    for (const auto& [name, held] : it->second) bytes_ -= static_cast<int64_t>(held.bytes->size());
    it = steps.erase(it);
  }
  if (steps.empty()) jobs_.erase(job);
}

int64_t SnapshotStore::bytes() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

}  // namespace stagecoach::runtime
