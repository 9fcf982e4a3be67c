#include "coordinator/snapshots/snapshot_copies.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/util/sha256.h"

namespace stagecoach::coordinator {
namespace {

// The same files: names, stages, sizes and SHA-256, in order.
bool SameFiles(const v1::SnapshotCopy& a, const v1::SnapshotCopy& b) {
  if (a.files_size() != b.files_size()) return false;
  for (int i = 0; i < a.files_size(); ++i) {
    const v1::StageCheckpointFile& x = a.files(i);
    const v1::StageCheckpointFile& y = b.files(i);
    if (x.file() != y.file() || x.stage() != y.stage() || x.size_bytes() != y.size_bytes() ||
        x.sha256() != y.sha256()) {
      return false;
    }
  }
  return true;
}

absl::Status CheckCopy(const v1::SnapshotCopy& copy, int ranks, int64_t step) {
  const std::string where = absl::StrCat("the snapshot after step ", step);
  if (copy.rank() < 0 || copy.rank() >= ranks) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": held rank ", copy.rank(), " is not one of the ", ranks, " ranks"));
  }
  if (copy.files_size() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": rank ", copy.rank(), " is held with no files"));
  }
  for (const v1::StageCheckpointFile& f : copy.files()) {
    if (f.file().empty() || f.file().find('/') != std::string::npos || f.size_bytes() < 0 ||
        !IsSha256Hex(f.sha256())) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": rank ", copy.rank(), " file '",
                                                     f.file(),
                                                     "' needs a plain name, a size and a "
                                                     "SHA-256"));
    }
  }
  return absl::OkStatus();
}

// Incomplete steps kept at most.
constexpr size_t kMostPending = 4;

}  // namespace

void SnapshotCopies::StartAttempt(int attempt, int ranks) {
  attempt_ = attempt;
  ranks_ = ranks;
  pending_.clear();
}

absl::StatusOr<bool> SnapshotCopies::Record(
    const std::string& worker_id, int reporter_rank, int attempt, int64_t step,
    const google::protobuf::RepeatedPtrField<v1::SnapshotCopy>& held, absl::Time now) {
  if (attempt != attempt_) {
    return absl::FailedPreconditionError(absl::StrCat("a snapshot report of attempt ", attempt,
                                                      ", the job is at attempt ", attempt_));
  }
  if (step < 0) return absl::InvalidArgumentError("snapshot step must be >= 0");
  for (const v1::SnapshotCopy& copy : held) {
    if (absl::Status ok = CheckCopy(copy, ranks_, step); !ok.ok()) return ok;
  }
  if (latest_.has_value() && step == latest_->step()) {
    // Workers holding the latest again (an attempt restored from it): they are copies too.
    for (const v1::SnapshotCopy& copy : held) {
      for (v1::SnapshotCopy& known : *latest_->mutable_ranks()) {
        if (known.rank() != copy.rank()) continue;
        if (!SameFiles(known, copy)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "the snapshot after step ", step, ": worker ", worker_id,
              " holds other files of rank ", copy.rank(), " than the snapshot lists"));
        }
        const auto& ids = known.worker_ids();
        if (std::find(ids.begin(), ids.end(), worker_id) == ids.end()) {
          known.add_worker_ids(worker_id);
        }
      }
    }
    return false;
  }
  if (latest_.has_value() && step < latest_->step()) return false;  // superseded
  Pending& pending = pending_[step];
  for (const v1::SnapshotCopy& copy : held) {
    auto [it, added] = pending.ranks.try_emplace(copy.rank(), copy);
    v1::SnapshotCopy& known = it->second;
    if (added) {
      known.clear_worker_ids();
    } else if (!SameFiles(known, copy)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the snapshot after step ", step, ": worker ", worker_id, " holds other files of rank ",
          copy.rank(), " (names, sizes or SHA-256) than ", known.worker_ids(0)));
    }
    const auto& ids = known.worker_ids();
    if (std::find(ids.begin(), ids.end(), worker_id) == ids.end()) {
      known.add_worker_ids(worker_id);
      if (copy.rank() == reporter_rank) {  // its own rank's worker first
        auto* list = known.mutable_worker_ids();
        std::rotate(list->begin(), list->end() - 1, list->end());
      }
    }
  }
  // Each rank's files in two workers' memory (its own and its holder's), so that one lost
  // worker leaves a copy; a single rank has only its own.
  const int copies = ranks_ > 1 ? 2 : 1;
  // Steps that never complete (a report lost) are not kept forever.
  while (pending_.size() > kMostPending) pending_.erase(pending_.begin());
  if (pending_.count(step) == 0 || static_cast<int>(pending.ranks.size()) < ranks_) return false;
  for (const auto& [rank, copy] : pending.ranks) {
    if (copy.worker_ids_size() < copies) return false;
  }
  v1::JobSnapshot snapshot;
  snapshot.set_step(step);
  int64_t bytes = 0;
  for (auto& [rank, copy] : pending.ranks) {
    for (const v1::StageCheckpointFile& f : copy.files()) bytes += f.size_bytes();
    *snapshot.add_ranks() = copy;
  }
  snapshot.set_bytes(bytes);
  const int64_t seconds = absl::ToUnixSeconds(now);
  snapshot.mutable_completed_time()->set_seconds(seconds);
  snapshot.mutable_completed_time()->set_nanos(
      static_cast<int32_t>(absl::ToInt64Nanoseconds(now - absl::FromUnixSeconds(seconds))));
  latest_ = std::move(snapshot);
  // Older pending steps can no longer become the latest.
  pending_.erase(pending_.begin(), pending_.upper_bound(step));
  return true;
}

int64_t SnapshotCopies::KeepFrom() const {
  if (latest_.has_value()) return latest_->step();
  if (!pending_.empty()) return pending_.begin()->first;
  return -1;
}


}  // namespace stagecoach::coordinator
