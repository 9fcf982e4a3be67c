// Recovery after a coordinator restart: the jobs of the job table on disk are rebuilt as they
// were. Each job's spec is parsed and planned again (an Infer job's spec plans with the client's
// batch in place of its data), its recorded history is replayed through the state machine (so a
// recovered job went through exactly the transitions it records), and its losses, restarts,
// failure, step targets and checkpoints come back; the checkpoints of a job that is not final
// are verified on disk (an unusable one is named in the problems and not used).
//
// What a recovered job that had not ended does next (RESTARTING from its latest checkpoint, or
// FAILED when it cannot be planned again or was an Infer job whose batch was not kept) is the
// JobManager's, under the job table's lock. RebuildJob itself reads the disk and takes no lock.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/job.h"
#include "stagecoach/v1/types.pb.h"

namespace stagecoach::coordinator {

struct RebuiltJob {
  std::shared_ptr<Job> job;
  // Why the job could not be planned again (then job->plan only describes it); empty when it
  // was.
  std::string plan_error;
};

// A job from its record. INVALID_ARGUMENT naming the job when its spec no longer parses or its
// history is not a path of the state machine (the job is not loaded then). Checkpoints that do
// not verify go to `problems`, naming the job.
absl::StatusOr<RebuiltJob> RebuildJob(const v1::Job& record, std::vector<std::string>* problems);

}  // namespace stagecoach::coordinator
