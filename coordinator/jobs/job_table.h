// The job table: every job the coordinator knows, in submission order, under one lock; job ids;
// paged listing; retention of finished jobs; and the hand-off of changed jobs to the job table
// on disk (JobWriter), which writes them after the lock is released.
//
// Locking: mu() guards the table and every Job in it (their state machines, ranks, steps,
// checkpoints and event logs). Components that work on jobs (placement, step aggregation,
// checkpoint collection, step control, the job lifecycle) take a JobTable& and are called with
// mu() held; their methods say so with a "Locked" suffix. Lock order: a job's control_mu, then
// mu(), then the worker registry's lock; nothing under mu() waits for disk or another process.
//
// Jobs are held by shared_ptr: a caller that must wait without the lock (Infer, StepJob) keeps
// its job alive even when retention drops it from the table meanwhile.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/jobs/job.h"
#include "coordinator/jobs/job_writer.h"
#include "stagecoach/v1/types.pb.h"

namespace stagecoach::coordinator {

struct JobTableOptions {
  // Finished jobs kept: at most this many (the most recently finished) ...
  int retain_finished_jobs = 1000;
  // ... and none that finished longer ago than this.
  absl::Duration retain_finished_for = absl::Hours(7 * 24);
  // Capacity of each new job's event log.
  int64_t max_job_events = 10000;
  // ListJobs pages: the size when the request gives none, and the largest.
  int default_page_size = 100;
  int max_page_size = 1000;
};

// One page of ListJobs.
struct JobPage {
  std::vector<v1::Job> jobs;  // summaries (Job::ToSummary), oldest first
  // Where the next page starts; empty after the last page.
  std::string next_page_token;
};

// Thread-safe (see the file comment for the lock).
class JobTable {
 public:
  // `writer` may be null (no job table on disk).
  JobTable(JobTableOptions options, JobWriter* writer);

  absl::Mutex& mu() ABSL_LOCK_RETURNED(mu_) { return mu_; }
  const JobTableOptions& options() const { return options_; }

  // A new job with the next id ("job-<n>"), in state UNSPECIFIED, with its event log capacity.
  Job& CreateLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds a job rebuilt from the disk table; later ids are numbered after it.
  // ALREADY_EXISTS when its id is taken, INVALID_ARGUMENT when it is not job-<n>.
  absl::Status InsertLocked(std::shared_ptr<Job> job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // nullptr / NOT_FOUND ("no job 'job-9'") for an unknown id.
  Job* FindLocked(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Job*> FindOrErrorLocked(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job kept alive beyond the lock (see the file comment); nullptr when unknown.
  std::shared_ptr<Job> ShareLocked(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Every job, oldest first.
  std::vector<Job*> AllLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t SizeLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return static_cast<int64_t>(jobs_.size());
  }

  // Queues the job's record (Job::ToRecord) for the disk table; the write happens later,
  // without the lock. No-op without a writer.
  void PersistLocked(const Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Drops finished jobs beyond retention as of `now` (options' count and age), from memory and
  // from the disk table; returns their ids, oldest first. A job whose StartTask calls are in
  // flight (Job::starting) is kept until they return.
  std::vector<std::string> PruneLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Up to `page_size` jobs (0: the default; clamped to the maximum) after `page_token` (empty:
  // from the first job). INVALID_ARGUMENT naming page_token / page_size when malformed.
  absl::StatusOr<JobPage> List(int page_size, const std::string& page_token)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const JobTableOptions options_;
  JobWriter* const writer_;

  absl::Mutex mu_;
  // By job number: submission order.
  std::map<int64_t, std::shared_ptr<Job>> jobs_ ABSL_GUARDED_BY(mu_);
  int64_t next_number_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace stagecoach::coordinator
