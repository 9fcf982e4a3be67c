#include "absl/status/status.h"
#include "common/schedule/generators/kinds.h"

namespace stagecoach::schedule::internal {

absl::StatusOr<PipelineOrder> GenerateLoopedBFS(const ScheduleConfig&) {
  return absl::UnimplementedError("LoopedBFS is not implemented yet");
}

}  // namespace stagecoach::schedule::internal
