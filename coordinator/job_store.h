// The coordinator's job table on disk: one file per job under <data-dir>/jobs, holding the job
// as GetJob returns it (spec, plan's layers and stages, state, history, losses, checkpoints,
// restarts). JobManager saves a job whenever its state, checkpoints or step targets change, and
// reloads the table when the coordinator starts again (JobManager::Recover).
//
// Each save writes a temporary file, syncs it and renames it over the job's file, so a crash
// leaves either the old or the new record, never a torn one.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "stagecoach/v1/types.pb.h"

namespace stagecoach::coordinator {

// Thread-compatible: JobManager calls it under its lock.
class JobStore {
 public:
  // Uses (and creates) `dir`. INTERNAL naming the directory when it cannot be created or written.
  static absl::StatusOr<JobStore> Open(const std::string& dir);

  // Writes `job` as <dir>/<job id>.pb. INTERNAL naming the file on an I/O error.
  absl::Status Save(const v1::Job& job);

  // Every saved job, ordered by their numeric id ("job-2" before "job-10"). A file that cannot
  // be parsed is renamed to <name>.corrupt (kept for inspection, never loaded again) and named in
  // `problems`.
  std::vector<v1::Job> LoadAll(std::vector<std::string>* problems);

  const std::string& dir() const { return dir_; }

 private:
  explicit JobStore(std::string dir) : dir_(std::move(dir)) {}
  std::string dir_;
};

// The number in a job id ("job-12" -> 12); -1 when it has no such form.
int64_t JobNumber(const std::string& job_id);

}  // namespace stagecoach::coordinator
