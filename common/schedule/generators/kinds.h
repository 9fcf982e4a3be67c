// Internal to the schedule library: one generator per schedule kind, each returning PyTorch's
// time-aligned order (idle slots as std::nullopt) for a config whose counts are already checked to
// be >= 1 and whose kind matches. Each generator checks its own constraints and returns
// INVALID_ARGUMENT with PyTorch's message for a config it cannot build. generators.cc dispatches
// to these; nothing else includes this header.
#pragma once

#include "absl/status/statusor.h"
#include "common/schedule/action.h"
#include "common/schedule/generators.h"

namespace stagecoach::schedule::internal {

// single_stage.cc
absl::StatusOr<PipelineOrder> GenerateGPipe(const ScheduleConfig& config);
absl::StatusOr<PipelineOrder> Generate1F1B(const ScheduleConfig& config);
absl::StatusOr<PipelineOrder> GenerateForwardOnly(const ScheduleConfig& config);

// interleaved.cc (they share PyTorch's _get_1f1b_rank_ops)
absl::StatusOr<PipelineOrder> GenerateInterleaved1F1B(const ScheduleConfig& config);
absl::StatusOr<PipelineOrder> GenerateInterleavedZeroBubble(const ScheduleConfig& config);

// looped_bfs.cc
absl::StatusOr<PipelineOrder> GenerateLoopedBFS(const ScheduleConfig& config);

// zero_bubble_v.cc
absl::StatusOr<PipelineOrder> GenerateZBVZeroBubble(const ScheduleConfig& config);

// dual_pipe_v.cc
absl::StatusOr<PipelineOrder> GenerateDualPipeV(const ScheduleConfig& config);

// controllable_v.cc (not PyTorch's: memory-budgeted V schedules)
absl::StatusOr<PipelineOrder> GenerateVHalf(const ScheduleConfig& config);
absl::StatusOr<PipelineOrder> GenerateVMin(const ScheduleConfig& config);

// The two stages of a rank in a V schedule (ZBV, DualPipeV), by their position in the V.
enum VChunk { kDown = 0, kUp = 1 };

// Appends `count` idle slots to `actions`.
inline void AppendIdle(RankActions& actions, int count) {
  for (int i = 0; i < count; ++i) actions.push_back(std::nullopt);
}

}  // namespace stagecoach::schedule::internal
