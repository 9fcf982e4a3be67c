// How `stagectl status` shows what a lost worker would cost the job, and what it costs now
// (docs/recovery.md): degraded replicas and the one healing, the latest in-memory snapshot
// (step, size, the workers holding each rank's files) and the spares held. Pure functions.
#pragma once

#include <string>

#include "stagecoach/v1/types.pb.h"

namespace stagecoach::client {

// "Replicas:  1/2 healthy (degraded: ...)\n", "Snapshot:  after step 20 (2 ranks, 1.2 MiB; rank
// 0 on w-1, w-2; ...)\n" and "Spares:    w-5\n", each only when the job has it; empty for a
// job with none.
std::string RecoveryLines(const v1::Job& job);

}  // namespace stagecoach::client
