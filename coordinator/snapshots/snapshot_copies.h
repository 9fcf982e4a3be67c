// The in-memory snapshots of one job (training.snapshot, docs/recovery.md) as its workers
// report them (CoordinatorService.ReportSnapshot): after taking the snapshot of a step, each
// rank's worker says which ranks' files it now holds (its own rank's, and those it keeps a copy
// for). A step's snapshot is complete once every rank's files are held by two workers (its own
// and the one keeping its copy; one with a single rank), so that one lost worker leaves a copy
// of each; the
// latest complete one is what a restart may continue from (snapshot_placement.h), and what the
// job's record and status show (Job.snapshot).
//
// Reports are for the current attempt only (a new attempt drops what was pending, and keeps the
// latest complete snapshot: its workers still hold it; an attempt restored from it reports its
// workers as holding it too). A coordinator restart starts with none: the workers register
// again under new ids, so the recorded holders would name other workers. A report naming a rank outside the
// attempt, a file without a name, or a size or SHA-256 that disagrees with another worker's copy
// is refused. Not thread-safe: the job table's lock guards it with its job.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "google/protobuf/repeated_ptr_field.h"
#include "stagecoach/v1/types.pb.h"

namespace stagecoach::coordinator {

class SnapshotCopies {
 public:
  // A new attempt with `ranks` ranks: what was pending is dropped.
  void StartAttempt(int attempt, int ranks);

  // `worker_id`, which runs rank `reporter_rank`, holds `held` of the snapshot after `step`
  // steps. The worker running a rank is listed first among the workers holding its files (a
  // restart puts the rank back there: snapshot_placement.h). Returns whether this made that
  // step the latest complete snapshot. FAILED_PRECONDITION for another attempt's report;
  // INVALID_ARGUMENT naming the rank or file that is wrong.
  absl::StatusOr<bool> Record(const std::string& worker_id, int reporter_rank, int attempt,
                              int64_t step,
                              const google::protobuf::RepeatedPtrField<v1::SnapshotCopy>& held,
                              absl::Time now);

  // The latest complete snapshot (its ranks with every worker that reported a copy).
  const std::optional<v1::JobSnapshot>& latest() const { return latest_; }

  // Forgets the latest complete snapshot: an attempt that started from it failed before its
  // first step, or the job restarted from an older point.
  void DropLatest() { latest_.reset(); }

  // The oldest step the workers must keep of this job's snapshots: the latest complete one's
  // (newer ones are being taken), else the oldest pending; -1 when none is needed.
  int64_t KeepFrom() const;


 private:
  struct Pending {
    // rank -> its files (as first reported) and the workers holding them.
    std::map<int, v1::SnapshotCopy> ranks;
  };

  int attempt_ = 0;
  int ranks_ = 0;
  std::map<int64_t, Pending> pending_;
  std::optional<v1::JobSnapshot> latest_;
};

}  // namespace stagecoach::coordinator
