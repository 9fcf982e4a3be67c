#include "coordinator/planning/memory_partition.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/schedule/simulator.h"
#include "common/util/status_macros.h"
#include "coordinator/planning/memory_prediction.h"
#include "coordinator/planning/plan_costs.h"
#include "coordinator/planning/planner_parts.h"
#include "coordinator/planning/rank_partition.h"

namespace stagecoach::coordinator {
namespace {

// What a partition is judged by: the largest rank's predicted bytes, then the ranks' total.
struct Score {
  double largest = std::numeric_limits<double>::infinity();
  double total = std::numeric_limits<double>::infinity();
  bool operator<(const Score& o) const {
    return largest != o.largest ? largest < o.largest : total < o.total;
  }
};

absl::StatusOr<Score> Evaluate(const spec::JobSpec& spec, Plan& plan,
                               const std::vector<int>& firsts) {
  plan.stages = planning::StagesFor(firsts, plan.layers);
  ASSIGN_OR_RETURN(std::vector<PredictedRankMemory> ranks, PredictMemory(spec, plan));
  Score score{0, 0};
  for (const PredictedRankMemory& r : ranks) {
    const double bytes = static_cast<double>(r.static_bytes + r.peak_bytes);
    score.largest = std::max(score.largest, bytes);
    score.total += bytes;
  }
  return score;
}

// The starting point: each layer costs its parameter bytes (weights, gradients, optimizer
// state alike, 4 bytes each: the proportions are what matter) plus its activation bytes times
// the microbatches of one stage the schedule holds at once on average, balanced over the ranks.
absl::StatusOr<std::vector<int>> StartingPartition(const Plan& plan, const PlanOptions& options) {
  double held = 1;
  auto unit =
      schedule::Simulate(plan.lowered, plan.stage_to_rank, plan.num_stages, plan.num_microbatches);
  if (unit.ok() && !unit->peak_activations.empty()) {
    held = std::accumulate(unit->peak_activations.begin(), unit->peak_activations.end(), 0.0) /
           static_cast<double>(unit->peak_activations.size());
  }
  std::vector<int64_t> costs;
  for (const v1::LayerInfo& layer : plan.layers) {
    const double bytes = 4.0 * 3 * static_cast<double>(layer.parameters()) +
                         held * static_cast<double>(layer.activation_bytes());
    costs.push_back(static_cast<int64_t>(std::min(bytes, 0x1p60)));
  }
  ASSIGN_OR_RETURN(RankPartition cut, PartitionPerRank(costs, plan.stage_to_rank, options));
  return cut.firsts;
}

}  // namespace

absl::StatusOr<std::vector<int>> PartitionByMemory(const spec::JobSpec& spec, const Plan& planned,
                                                   const PlanOptions& options) {
  if (!HasMeasuredSizes(planned)) {
    return planning::FieldError(
        "split.policy",
        "'memory' balances the workers' predicted memory and needs each layer's measured sizes, "
        "which the model's layers do not carry (a CPU worker's profile measures them; CUDA "
        "profiles do not yet)");
  }
  Plan plan = planned;  // its stages change with every partition tried
  const int n = static_cast<int>(plan.layers.size());
  const int stages = plan.num_stages;
  ASSIGN_OR_RETURN(std::vector<int> best, StartingPartition(plan, options));
  ASSIGN_OR_RETURN(Score best_score, Evaluate(spec, plan, best));
  for (int move = 0; move < 4 * n; ++move) {
    RETURN_IF_ERROR(options.Interrupted("balancing the stages' memory"));
    std::vector<int> step = best;
    Score step_score = best_score;
    for (int b = 1; b < stages; ++b) {
      for (int delta : {-1, 1}) {
        std::vector<int> tried = best;
        tried[b] += delta;
        const int end = b + 1 < stages ? tried[b + 1] : n;
        if (tried[b] <= tried[b - 1] || tried[b] >= end) continue;  // a stage would be empty
        ASSIGN_OR_RETURN(Score score, Evaluate(spec, plan, tried));
        if (score < step_score) {
          step = std::move(tried);
          step_score = score;
        }
      }
    }
    if (!(step_score < best_score)) break;
    best = std::move(step);
    best_score = step_score;
  }
  return best;
}

absl::StatusOr<std::vector<int>> PartitionFewerFirstLast(int num_layers,
                                                         const std::vector<int>& stage_to_rank,
                                                         int extra, const PlanOptions& options) {
  std::vector<int64_t> costs(num_layers, 1);
  if (num_layers > 0) {
    costs.front() += extra;
    costs.back() += extra;
  }
  ASSIGN_OR_RETURN(RankPartition cut, PartitionPerRank(costs, stage_to_rank, options));
  return cut.firsts;
}

}  // namespace stagecoach::coordinator
