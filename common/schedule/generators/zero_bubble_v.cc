#include "absl/status/status.h"
#include "common/schedule/generators/kinds.h"

namespace stagecoach::schedule::internal {

absl::StatusOr<PipelineOrder> GenerateZBVZeroBubble(const ScheduleConfig&) {
  return absl::UnimplementedError("ZBVZeroBubble is not implemented yet");
}

}  // namespace stagecoach::schedule::internal
