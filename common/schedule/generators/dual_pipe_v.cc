#include "absl/status/status.h"
#include "common/schedule/generators/kinds.h"

namespace stagecoach::schedule::internal {

absl::StatusOr<PipelineOrder> GenerateDualPipeV(const ScheduleConfig&) {
  return absl::UnimplementedError("DualPipeV is not implemented yet");
}

}  // namespace stagecoach::schedule::internal
