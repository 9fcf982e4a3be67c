// The in-memory snapshots a worker holds (training.snapshot, docs/recovery.md): the
// training-state files of its own ranks and the copies other ranks' workers sent it, by job,
// step and file name (a file name is one stage's, so unique within a step).
//
// The store belongs to the worker process, not to a task: when a job restarts after a lost
// worker, its new attempt finds the files here (snapshot_restore.h). The coordinator says in
// each heartbeat's answer which steps it still needs (KeepFrom: its latest complete snapshot and
// newer), and drops an ended job's. Besides, a job keeps two steps (the latest complete snapshot
// and the one being taken) where the oldest is below what the coordinator last said to keep, and
// never more than three (a rank may be one snapshot ahead of the coordinator's latest).
//
// Torch-free; thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "stagecoach/v1/coordinator.pb.h"
#include "stagecoach/v1/types.pb.h"

namespace stagecoach::runtime {

// CoordinatorService.ReportSnapshot, as the worker calls it.
using SnapshotReporter = std::function<absl::Status(const v1::ReportSnapshotRequest&)>;

class SnapshotStore {
 public:
  using Bytes = std::shared_ptr<const std::vector<char>>;

  // Keeps `bytes` as file `file` of rank `rank` (of the attempt that took it) of `job_id`'s
  // snapshot after `step` global steps, replacing a copy already there.
  void Put(const std::string& job_id, int64_t step, int rank, const v1::StageCheckpointFile& file,
           Bytes bytes);

  // The bytes of file `file` of the job's snapshot after `step` steps. NOT_FOUND naming the
  // job, step and file when this worker does not hold it.
  absl::StatusOr<Bytes> Get(const std::string& job_id, int64_t step, const std::string& file) const;

  // What the store holds of the job's snapshot after `step` steps, by rank (worker_ids left
  // empty), for ReportSnapshot.
  std::vector<v1::SnapshotCopy> Held(const std::string& job_id, int64_t step) const;

  // The jobs it holds files of (for the heartbeat).
  std::vector<std::string> Jobs() const;

  // Drops the job's steps before `from_step` and remembers it; a negative `from_step` drops the
  // job.
  void KeepFrom(const std::string& job_id, int64_t from_step);

  // Drops the job's steps after `step`: a new attempt starting there takes them again (what a
  // failed attempt left after its start is not its state).
  void DropAfter(const std::string& job_id, int64_t step);

  // Bytes held, all jobs.
  int64_t bytes() const;

 private:
  struct File {
    int rank = 0;
    v1::StageCheckpointFile entry;
    Bytes bytes;
  };
  // step -> file name.
  using Steps = std::map<int64_t, std::map<std::string, File>>;
  struct Job {
    Steps steps;
    int64_t keep_from = 0;  // the coordinator's latest answer
  };

  // Drops `job`'s step at `it`; the next one.
  Steps::iterator DropLocked(Job& job, Steps::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::map<std::string, Job> jobs_ ABSL_GUARDED_BY(mu_);
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace stagecoach::runtime
