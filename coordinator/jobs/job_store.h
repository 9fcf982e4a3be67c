// The coordinator's job table on disk: one record per job, holding the job as GetJob returns it
// (spec, plan's layers and stages, state, history, losses, checkpoints, restarts). The job table
// (JobTable, through JobWriter) saves a job whenever its state, checkpoints or step targets
// change and removes the records of jobs that retention drops; JobManager::Recover reloads the
// records when the coordinator starts again.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "stagecoach/v1/types.pb.h"

namespace stagecoach::coordinator {

// Where job records live. An interface so that tests can inject a slow or failing disk.
// Implementations are thread-compatible: JobWriter makes one call at a time.
class JobStore {
 public:
  virtual ~JobStore() = default;

  // Writes `job`, replacing its earlier record, atomically: a crash leaves the old record or the
  // new one, never a torn one. INVALID_ARGUMENT for an id that is not job-<n>; INTERNAL naming
  // the file on an I/O error.
  virtual absl::Status Save(const v1::Job& job) = 0;

  // Deletes the record of `job_id` (OK when there is none). INTERNAL naming the file on an I/O
  // error.
  virtual absl::Status Remove(const std::string& job_id) = 0;

  // Every saved job, ordered by their numeric id ("job-2" before "job-10"). A record that
  // cannot be read is set aside (never loaded again) and named in `problems`.
  virtual std::vector<v1::Job> LoadAll(std::vector<std::string>* problems) = 0;

  // Where the records are, for logs.
  virtual std::string Describe() const = 0;
};

// Records as files <dir>/<job id>.pb, each written durably (common/util/durable_file.h: a
// temporary file, fsync, rename over the old one, fsync of the directory). An unreadable file is
// renamed to <name>.corrupt.
class FileJobStore : public JobStore {
 public:
  // Uses (and creates) `dir`. INTERNAL naming the directory when it cannot be created or written.
  static absl::StatusOr<std::unique_ptr<FileJobStore>> Open(const std::string& dir);

  absl::Status Save(const v1::Job& job) override;
  absl::Status Remove(const std::string& job_id) override;
  std::vector<v1::Job> LoadAll(std::vector<std::string>* problems) override;
  std::string Describe() const override { return dir_; }

  const std::string& dir() const { return dir_; }

 private:
  explicit FileJobStore(std::string dir) : dir_(std::move(dir)) {}
  std::string PathOf(const std::string& job_id) const;

  std::string dir_;
};

// The number in a job id ("job-12" -> 12); -1 when it has no such form.
int64_t JobNumber(const std::string& job_id);

}  // namespace stagecoach::coordinator
