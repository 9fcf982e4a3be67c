// Looped BFS (breadth-first pipeline parallelism): several loop-placed stages per rank, each local
// stage running every microbatch before the rank moves on to its next stage.
#include "absl/status/status.h"
#include "common/schedule/generators/kinds.h"

namespace stagecoach::schedule::internal {

// Rank r hosts stages r, r + R, r + 2R, ... (R = num_ranks). Its list is:
//   r idle slots (the first forward of stage r cannot start before stage r-1's);
//   for each local stage in increasing order, F of microbatches 0..m-1;
//   2 * (R-1-r) idle slots (a backward takes two hops per rank to come back up from the last
//   rank);
//   for each local stage in decreasing order, B of microbatches m-1..0 (the last forward of a
//   stage is the first whose gradient is available).
// No constraint on the counts.
absl::StatusOr<PipelineOrder> GenerateLoopedBFS(const ScheduleConfig& config) {
  const int num_ranks = config.num_ranks;
  const int num_microbatches = config.num_microbatches;
  const int num_stages = NumStages(config);
  PipelineOrder order(num_ranks);
  for (int rank = 0; rank < num_ranks; ++rank) {
    RankActions& actions = order[rank];
    actions.reserve(rank + 2 * (num_ranks - 1 - rank) +
                    2 * config.stages_per_rank * num_microbatches);
    AppendIdle(actions, rank);
    for (int stage = rank; stage < num_stages; stage += num_ranks) {
      for (int mb = 0; mb < num_microbatches; ++mb) {
        actions.push_back(Action::Make(stage, ActionType::kForward, mb));
      }
    }
    AppendIdle(actions, 2 * (num_ranks - 1 - rank));
    for (int stage = num_stages - num_ranks + rank; stage >= 0; stage -= num_ranks) {
      for (int mb = num_microbatches - 1; mb >= 0; --mb) {
        actions.push_back(Action::Make(stage, ActionType::kFullBackward, mb));
      }
    }
  }
  return order;
}

}  // namespace stagecoach::schedule::internal
