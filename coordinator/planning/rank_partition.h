// Splitting a model's layers into a schedule's stages so that its *ranks* are balanced: what
// runs in parallel in a pipeline is ranks, and a rank may hold several stages (a V schedule's
// rank r holds stages r and 2p-1-r; a looped schedule's rank r holds r, r+p, ...). Balancing
// stages alone can leave one rank with the heavy stages of both arms of its V.
//
// PartitionPerRank cuts `costs` (one non-negative number per layer: 1, parameters, profiled
// nanoseconds, ...) into contiguous, non-empty stages, stage s on rank stage_to_rank[s], and
// returns each stage's first layer. Among all such cuts it picks, in this order:
//   1. the smallest largest rank total (a rank's total: the sum of its stages' costs);
//   2. then the smallest largest stage (stages of one rank even out, which keeps the pipeline's
//      hand-offs smooth);
//   3. then the one whose boundaries come first (earlier stages take fewer layers: under 1F1B
//      they hold more microbatches in flight).
// Where every rank holds one stage, or one rank holds them all, this is PartitionBalanced's
// cut. Otherwise a branch-and-bound search proves each of the three within a budget of
// `kRankPartitionNodeBudget` search nodes (ample for hundreds of layers and dozens of stages);
// beyond it, the best cut found so far is used: a local search's (every boundary moved to
// its best place until none improves), improved by the part of the search that ran.
// Deterministic: the same inputs give the same cut.
//
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/planning/planner.h"

namespace stagecoach::coordinator {

// Search nodes (stage boundaries tried) PartitionPerRank spends on proving its cut.
inline constexpr int64_t kRankPartitionNodeBudget = 1 << 17;

struct RankPartition {
  std::vector<int> firsts;  // each stage's first layer, starting with 0
  // The cut's largest rank total and largest stage, in the costs' units.
  int64_t largest_rank = 0;
  int64_t largest_stage = 0;
  // Whether the search proved all three choices above within its budget.
  bool proven = true;
};

// Requires 1 <= stage_to_rank.size() <= costs.size() and ranks numbered from 0; INVALID_ARGUMENT
// otherwise. A negative cost counts as 0. DEADLINE_EXCEEDED / CANCELLED as
// PlanOptions::Interrupted says (checked every few thousand nodes).
absl::StatusOr<RankPartition> PartitionPerRank(const std::vector<int64_t>& costs,
                                               const std::vector<int>& stage_to_rank,
                                               const PlanOptions& options,
                                               int64_t node_budget = kRankPartitionNodeBudget);

// Each rank's total under `firsts` (indexed by rank), for callers that show or test the
// balance.
std::vector<int64_t> RankTotals(const std::vector<int64_t>& costs,
                                const std::vector<int>& stage_to_rank,
                                const std::vector<int>& firsts);

}  // namespace stagecoach::coordinator
