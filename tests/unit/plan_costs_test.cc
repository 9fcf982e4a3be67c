// The time model of a plan (coordinator/planning/plan_costs.h) with data-parallel replicas:
// each stage's collectives as ring messages on the rank's communication queue, per shard level,
// and ZeRO-1/2's all-gather of the stepped shards after the optimizer step, where nothing hides
// it. Worked by hand on slow, round assumptions.
#include "coordinator/planning/plan_costs.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stagecoach::coordinator::plan_costs_test {
namespace {

using ::testing::DoubleEq;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

// Two stages on two ranks, one profiled layer each (F 1 s, B 2 s): stage 0 of 1000 parameters,
// stage 1 of 3 (shards padded to 2 of them).
Plan TwoStages(int replicas, spec::ShardLevel level) {
  Plan plan;
  plan.layers.resize(2);
  for (v1::LayerInfo& layer : plan.layers) {
    layer.set_forward_seconds(1);
    layer.set_backward_seconds(2);
  }
  plan.num_stages = 2;
  plan.num_ranks = 2;
  plan.num_microbatches = 1;
  plan.stages = {StagePlan{0, 0, 1, 1000}, StagePlan{1, 1, 2, 3}};
  plan.stage_to_rank = {0, 1};
  plan.replicas = replicas;
  plan.shard = level;
  return plan;
}

// A ring message costs 0.5 s + its bytes at 1000 B/s; no CPU per message.
CostAssumptions Slow() {
  CostAssumptions a;
  a.message_latency_seconds = 0.5;
  a.link_bytes_per_second = 1000;
  a.message_cpu_seconds = 0;
  return a;
}

TEST(PlanCostModel, ReplicasCollectivesAreRingMessagesAndZero12GathersFollowTheStep) {
  // With 2 replicas a reduce-scatter or an all-gather is one message of a shard: stage 0's
  // 500 floats (2000 B) take 0.5 + 2 = 2.5 s, stage 1's 2 floats (8 B) 0.508 s.
  const schedule::CostModel none = PlanCostModel(TwoStages(2, spec::ShardLevel::kNone), Slow());
  EXPECT_TRUE(none.overlap_collectives);
  EXPECT_THAT(none.per_stage_reduce_grad, ElementsAre(DoubleEq(5), DoubleEq(1.016)))
      << "an all-reduce: a reduce-scatter and an all-gather";
  EXPECT_THAT(none.per_stage_unshard, ElementsAre(0, 0));
  EXPECT_THAT(none.per_stage_after_step, ElementsAre(0, 0));
  for (spec::ShardLevel level : {spec::ShardLevel::kOptimizer, spec::ShardLevel::kGradients}) {
    const schedule::CostModel c = PlanCostModel(TwoStages(2, level), Slow());
    EXPECT_THAT(c.per_stage_reduce_grad, ElementsAre(DoubleEq(2.5), DoubleEq(0.508)));
    EXPECT_THAT(c.per_stage_unshard, ElementsAre(0, 0));
    EXPECT_THAT(c.per_stage_after_step, ElementsAre(DoubleEq(2.5), DoubleEq(0.508)))
        << "the all-gather after the optimizer step";
  }
  const schedule::CostModel params =
      PlanCostModel(TwoStages(2, spec::ShardLevel::kParameters), Slow());
  EXPECT_THAT(params.per_stage_reduce_grad, ElementsAre(DoubleEq(2.5), DoubleEq(0.508)));
  EXPECT_THAT(params.per_stage_unshard, ElementsAre(DoubleEq(2.5), DoubleEq(0.508)));
  EXPECT_THAT(params.per_stage_after_step, ElementsAre(0, 0));
  // 4 replicas: 3 messages of a quarter (250 floats: 0.5 + 1 s; stage 1's 1 float 0.504 s).
  const schedule::CostModel four =
      PlanCostModel(TwoStages(4, spec::ShardLevel::kGradients), Slow());
  EXPECT_THAT(four.per_stage_reduce_grad, ElementsAre(DoubleEq(4.5), DoubleEq(1.512)));
  // One replica: no collectives.
  const schedule::CostModel alone = PlanCostModel(TwoStages(1, spec::ShardLevel::kNone), Slow());
  EXPECT_FALSE(alone.overlap_collectives);
  EXPECT_THAT(alone.per_stage_reduce_grad, IsEmpty());
  EXPECT_THAT(alone.per_stage_after_step, IsEmpty());
}

}  // namespace
}  // namespace stagecoach::coordinator::plan_costs_test
