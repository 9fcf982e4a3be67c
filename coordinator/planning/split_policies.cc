#include "coordinator/planning/split_policies.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/spec/builtin_model.h"
#include "common/util/status_macros.h"
#include "coordinator/planning/memory_partition.h"
#include "coordinator/planning/planner_parts.h"
#include "coordinator/planning/rank_partition.h"

namespace stagecoach::coordinator {
namespace {

using planning::FieldError;

// Layers whose parameter counts differ by this factor or more (a norm against a block, an
// embedding against a small head) are counted by their parameters under equal-layers.
constexpr int64_t kEqualLayersSpread = 100;

// What equal-layers balances: one per layer, or each layer's parameters when the layers' sizes
// are orders of magnitude apart (the smallest non-empty layer against the largest): equal counts
// would put a stage of a norm against a stage of blocks.
std::vector<int64_t> EqualLayersCosts(const std::vector<v1::LayerInfo>& layers) {
  int64_t smallest = 0, largest = 0;
  for (const v1::LayerInfo& layer : layers) {
    if (layer.parameters() <= 0) continue;
    smallest = smallest == 0 ? layer.parameters() : std::min(smallest, layer.parameters());
    largest = std::max(largest, layer.parameters());
  }
  std::vector<int64_t> costs;
  const bool by_size = smallest > 0 && largest / kEqualLayersSpread >= smallest;
  for (const v1::LayerInfo& layer : layers) {
    costs.push_back(by_size ? std::max<int64_t>(0, layer.parameters()) : 1);
  }
  return costs;
}

}  // namespace

absl::StatusOr<std::vector<int>> SplitByPolicy(const spec::JobSpec& spec, const Plan& plan,
                                               const PlanOptions& options) {
  const std::string& policy = spec.split.policy;
  std::vector<int64_t> costs;
  if (policy == "memory") return PartitionByMemory(spec, plan, options);
  if (policy == "fewer-first-last") {
    return PartitionFewerFirstLast(static_cast<int>(plan.layers.size()), plan.stage_to_rank, 1,
                                   options);
  }
  if (policy == "equal-params") {
    for (const v1::LayerInfo& layer : plan.layers) costs.push_back(layer.parameters());
  } else if (policy == "profiled") {
    // Integer costs in nanoseconds of forward + backward.
    bool measured = false;
    for (const v1::LayerInfo& layer : plan.layers) {
      const double seconds = layer.forward_seconds() + layer.backward_seconds();
      if (!std::isfinite(seconds) || layer.forward_seconds() < 0 || layer.backward_seconds() < 0) {
        return FieldError("split.policy", absl::StrCat("'profiled': layer ", layer.name(),
                                                       " has an invalid measured time (forward ",
                                                       layer.forward_seconds(), " s, backward ",
                                                       layer.backward_seconds(), " s)"));
      }
      measured = measured || seconds > 0;
      costs.push_back(static_cast<int64_t>(std::llround(seconds * 1e9)));
    }
    if (!measured) {
      return FieldError("split.policy",
                        "'profiled' needs each layer's measured forward and backward time, and "
                        "the model's layers carry none (a worker's InspectModel must profile "
                        "them)");
    }
  } else {
    costs = EqualLayersCosts(plan.layers);
  }
  ASSIGN_OR_RETURN(RankPartition cut, PartitionPerRank(costs, plan.stage_to_rank, options));
  return cut.firsts;
}


double ProfileFlops(const spec::JobSpec& spec) {
  if (!spec.model.builtin.has_value()) return 0;
  const spec::BuiltinModel& model = *spec.model.builtin;
  const int64_t parts = std::max<int64_t>(1, static_cast<int64_t>(spec.schedule.microbatches) *
                                                 std::max(1, spec.placement.replicas));
  const double rows = static_cast<double>((spec.training.batch_size + parts - 1) / parts);
  const bool decoder = spec::IsDecoder(model);
  const double tokens = decoder ? rows * static_cast<double>(model.seq) : rows;
  double parameters = 0;
  for (int64_t p : BuiltinLayerParameters(model)) parameters += static_cast<double>(p);
  double forward = 2 * parameters * tokens;
  if (decoder) {
    forward += 4.0 * static_cast<double>(model.layers) * static_cast<double>(model.seq) *
               static_cast<double>(model.d_model) * tokens;
  }
  constexpr double kForwardsPerProfile = 30;
  return kForwardsPerProfile * forward;
}

}  // namespace stagecoach::coordinator
