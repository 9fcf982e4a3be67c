// The split policies that look at more than one number per layer: `memory` balances the
// pipeline ranks' predicted memory under the plan's own schedule, `fewer-first-last` gives the
// first and last stage fewer layers (torchtitan's first/last_stage_less_layers: the embedding
// and the output head with its loss count as a layer each). Both balance ranks, not stages
// (rank_partition.h). The planner (split_policies.h) calls them once the schedule is built.
// Pure functions; thread-safe.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"
#include "coordinator/planning/planner.h"

namespace stagecoach::coordinator {

// Each stage's first layer that minimises the largest pipeline rank's predicted memory (static
// bytes plus the step's activation peak, PredictMemory with `spec`'s recipe) for `plan`, whose
// schedule is built (lowered, stage_to_rank, num_stages, num_microbatches) and whose layers
// carry measured sizes; ties go to the smaller total over the ranks. The search starts from
// the partition that balances each rank's parameter bytes plus its layers' activation bytes
// times the microbatches the schedule holds at once (a simulation with unit costs), then moves
// one boundary by one layer at a time while that lowers the largest rank's prediction (at most
// 4 x layers moves; every move is a full simulation). INVALID_ARGUMENT naming split.policy
// when no layer carries a measured size; DEADLINE_EXCEEDED / CANCELLED as `options` say.
absl::StatusOr<std::vector<int>> PartitionByMemory(const spec::JobSpec& spec, const Plan& plan,
                                                   const PlanOptions& options);

// Each stage's first layer with equal layer counts over the ranks (stage s on rank
// stage_to_rank[s]), where the first and the last layer each count `extra` more
// (PartitionPerRank over unit costs with `extra` added to the first and the last layer): with
// 8 layers, 4 stages on 4 ranks and extra 1 the stages hold 1, 2, 3, 2 layers (costs 2, 2, 3,
// 3). Requires 1 <= stages <= num_layers.
absl::StatusOr<std::vector<int>> PartitionFewerFirstLast(int num_layers,
                                                         const std::vector<int>& stage_to_rank,
                                                         int extra, const PlanOptions& options);

}  // namespace stagecoach::coordinator
