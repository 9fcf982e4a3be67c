// Writes job records to the job table on disk without holding the job table's lock: the lock
// that step reports and the scheduler take never waits for an fsync, so a slow disk delays
// only the records themselves.
//
// Save and Remove queue the latest record of a job (a newer Save replaces a queued one, a Remove
// replaces a queued Save); one drain at a time, on the executor, writes the queue in the order
// the jobs were first queued. Records of one job reach the store in the order they were given.
// Write errors are logged (the job goes on; its next save tries again).
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/synchronization/mutex.h"
#include "common/util/executor.h"
#include "coordinator/jobs/job_store.h"
#include "stagecoach/v1/types.pb.h"

namespace stagecoach::coordinator {

// Thread-safe. Its lock is a leaf: never held while the store writes, never held while taking
// another lock.
class JobWriter {
 public:
  // `store` and `executor` must outlive the writer's queued drains (the writer itself may go
  // first: a drain queued after it is destroyed writes nothing).
  JobWriter(JobStore* store, Executor* executor);
  // Writes what is still queued (Flush).
  ~JobWriter();

  JobWriter(const JobWriter&) = delete;
  JobWriter& operator=(const JobWriter&) = delete;

  void Save(v1::Job record);
  void Remove(const std::string& job_id);

  // Writes everything queued so far on the calling thread, after a drain in progress.
  void Flush();

  // Records written and removed so far (for tests and logs).
  int64_t writes() const;

 private:
  struct Core;
  static void Enqueue(const std::shared_ptr<Core>& core, std::string id,
                      std::optional<v1::Job> record);

  std::shared_ptr<Core> core_;
};

}  // namespace stagecoach::coordinator
