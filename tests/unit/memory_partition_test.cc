// The split policies of coordinator/planning/memory_partition.h: fewer-first-last worked by hand,
// and memory balancing against the equal-layers split on a model whose layers keep very different
// amounts.
#include "coordinator/planning/memory_partition.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/spec/spec_parser.h"
#include "coordinator/planning/planner.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stagecoach::coordinator::memory_partition_test {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

spec::JobSpec Parse(const std::string& schedule, const std::string& policy) {
  auto spec = spec::ParseJobSpec(
      absl::StrCat("name: t\nmodel: {builtin: {family: mlp, sizes: [4, 8, 8, 8, 8, 8, 8, 8, 8, 8, "
                   "8, 8, 2]}}\nsplit: {stages: 4, policy: ",
                   policy, "}\nschedule: ", schedule,
                   "\nplacement: {workers: 4}\ntraining: {batch_size: 16}\n"),
      "t");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

// Twelve layers: the first four keep 40 KB a microbatch, the rest 2 KB; 100 parameters each.
std::vector<v1::LayerInfo> Layers(bool sized = true) {
  std::vector<v1::LayerInfo> layers(12);
  for (size_t l = 0; l < layers.size(); ++l) {
    layers[l].set_name(absl::StrCat("layers.", l));
    layers[l].set_parameters(100);
    layers[l].set_forward_seconds(1e-3);
    layers[l].set_backward_seconds(2e-3);
    if (sized) {
      layers[l].set_activation_bytes(l < 4 ? 40000 : 2000);
      layers[l].set_output_bytes(200);
    }
  }
  return layers;
}

int64_t LargestRank(const Plan& plan) {
  int64_t largest = 0;
  for (const PredictedRankMemory& r : plan.predicted_memory) {
    largest = std::max(largest, r.static_bytes + r.peak_bytes);
  }
  return largest;
}

TEST(PartitionFewerFirstLast, FirstAndLastStageCountOneLayerMore) {
  auto firsts = PartitionFewerFirstLast(8, {0, 1, 2, 3}, 1, {});
  ASSERT_TRUE(firsts.ok());
  EXPECT_THAT(*firsts, ElementsAre(0, 1, 3, 6));  // 1, 2, 3 and 2 layers
  auto plain = PartitionFewerFirstLast(8, {0, 1, 2, 3}, 0, {});
  EXPECT_THAT(*plain, ElementsAre(0, 2, 4, 6));
}

TEST(PartitionByMemory, BalancesTheLargestRankBelowEqualLayers) {
  for (const std::string schedule :
       {"{kind: 1F1B, microbatches: 8}", "{kind: GPipe, microbatches: 8}"}) {
    auto equal = PlanJob(Parse(schedule, "equal-layers"), Layers(), {});
    auto balanced = PlanJob(Parse(schedule, "memory"), Layers(), {});
    ASSERT_TRUE(equal.ok()) << equal.status();
    ASSERT_TRUE(balanced.ok()) << balanced.status();
    EXPECT_LT(LargestRank(*balanced), LargestRank(*equal)) << schedule;
    // The heavy layers are spread: stage 0 holds fewer than the four of equal layers...
    EXPECT_LT(balanced->stages[0].end_layer, 3) << schedule;
  }
}

TEST(PartitionByMemory, NeedsMeasuredSizes) {
  auto plan = PlanJob(Parse("{kind: 1F1B, microbatches: 8}", "memory"), Layers(false), {});
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(std::string(plan.status().message()),
              HasSubstr("split.policy: 'memory' balances the workers' predicted memory and needs "
                        "each layer's measured sizes"));
}

}  // namespace
}  // namespace stagecoach::coordinator::memory_partition_test
