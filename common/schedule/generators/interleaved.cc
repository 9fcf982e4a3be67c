#include "absl/status/status.h"
#include "common/schedule/generators/kinds.h"

namespace stagecoach::schedule::internal {

absl::StatusOr<PipelineOrder> GenerateInterleaved1F1B(const ScheduleConfig&) {
  return absl::UnimplementedError("Interleaved1F1B is not implemented yet");
}

absl::StatusOr<PipelineOrder> GenerateInterleavedZeroBubble(const ScheduleConfig&) {
  return absl::UnimplementedError("InterleavedZeroBubble is not implemented yet");
}

}  // namespace stagecoach::schedule::internal
