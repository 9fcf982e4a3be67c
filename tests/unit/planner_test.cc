// The planner: partitions, schedule plans, and what it refuses.
#include "coordinator/planner.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/spec/spec_parser.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/test_paths.h"

namespace stagecoach::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

spec::JobSpec Parse(const std::string& extra, const std::string& sizes = "[4, 8, 8, 8, 2]",
                    const std::string& split = "{stages: 2}") {
  auto spec = spec::ParseJobSpec(
      absl::StrCat("name: t\nmodel: {builtin: {family: mlp, sizes: ", sizes, "}}\nsplit: ", split,
                   "\nschedule: {kind: GPipe, microbatches: 4}\ntraining: {batch_size: 8}\n",
                   extra),
      "t");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

TEST(PartitionBalanced, EqualCostsGiveEarlierStagesFewerLayers) {
  EXPECT_THAT(PartitionBalanced({1, 1, 1}, 2), ElementsAre(0, 1));
  EXPECT_THAT(PartitionBalanced({1, 1, 1, 1, 1, 1}, 4), ElementsAre(0, 1, 2, 4));
  EXPECT_THAT(PartitionBalanced({1, 1, 1, 1}, 4), ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(PartitionBalanced({1, 1, 1, 1}, 1), ElementsAre(0));
}

TEST(PartitionBalanced, MinimisesTheMostExpensiveStage) {
  // Best split of 10|1 1 1|10 into 3: max 10, not 11.
  EXPECT_THAT(PartitionBalanced({10, 1, 1, 1, 10}, 3), ElementsAre(0, 1, 4));
  EXPECT_THAT(PartitionBalanced({100, 1, 1, 1, 1}, 2), ElementsAre(0, 1));
}

TEST(PlanJob, EqualParamsBalancesParameterCounts) {
  // Layers: 4*64+64=320, 64*4+4=260, 4*4+4=20, 4*4+4=20.
  spec::JobSpec spec = Parse("", "[4, 64, 4, 4, 4]", "{stages: 2, policy: equal-params}");
  auto plan = PlanJob(spec);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->stages[0].end_layer, 1);
  EXPECT_EQ(plan->stages[0].parameters, 320);
  EXPECT_EQ(plan->stages[1].parameters, 300);
  spec.split.policy = "equal-layers";
  EXPECT_EQ(PlanJob(spec)->stages[0].end_layer, 2);
}

TEST(PlanJob, PlansALoweredValidatedSchedulePerRank) {
  auto plan = PlanJob(Parse(""));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->num_stages, 2);
  EXPECT_EQ(plan->num_ranks, 2);
  EXPECT_THAT(plan->stage_to_rank, ElementsAre(0, 1));
  ASSERT_EQ(plan->lowered.size(), 2u);
  // Rank 1 receives each activation before using it and ends by reducing its gradients.
  EXPECT_EQ(plan->lowered[1].front()->ToString(), "1RECV_F0");
  EXPECT_EQ(plan->lowered[1].back()->ToString(), "1REDUCE_GRAD");
  // Workers default to stages when not given.
  EXPECT_EQ(PlanJob(Parse("placement: {workers: 2}", "[4, 8, 8, 8, 2]", "{policy: equal-layers}"))
                ->num_stages,
            2);
}

TEST(PlanJob, RefusesWhatCannotRunNamingTheField) {
  struct Case {
    std::string extra, split, want;
  };
  for (const Case& c : std::vector<Case>{
           {"placement: {workers: 3}", "{stages: 2}",
            "placement.workers: GPipe runs 1 stage(s) per worker, so 2 stages need 2 workers, "
            "got 3"},
           {"placement: {device: cuda}", "{stages: 2}", "placement.device"},
           {"data: {kind: tokens, path: x.bin}", "{stages: 2}", "data.kind"},
           {"", "{stages: 2, policy: profiled}", "split.policy"},
           {"", "{points: {\"2\": beginning}}", "split.points"},
       }) {
    auto plan = PlanJob(Parse(c.extra, "[4, 8, 8, 8, 2]", c.split));
    ASSERT_FALSE(plan.ok()) << c.want;
    EXPECT_TRUE(absl::IsInvalidArgument(plan.status()));
    EXPECT_THAT(std::string(plan.status().message()), HasSubstr(c.want));
  }
  spec::JobSpec one_f_one_b = Parse("");
  one_f_one_b.schedule.kind = "1f1b";  // case-insensitive
  one_f_one_b.split.stages = 4;
  one_f_one_b.schedule.microbatches = 3;
  auto plan = PlanJob(one_f_one_b);
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(std::string(plan.status().message()),
              HasSubstr("schedule: Number of microbatches (3) must be greater than or equal to "
                        "the number of stages (4)"));
  spec::JobSpec unknown = Parse("");
  unknown.schedule.kind = "Chimera";
  EXPECT_THAT(std::string(PlanJob(unknown).status().message()),
              HasSubstr("schedule.kind: unknown schedule 'Chimera'; valid schedules: GPipe, 1F1B, "
                        "Interleaved1F1B,"));
  spec::JobSpec zbv = Parse("");
  zbv.schedule.kind = "zbvzerobubble";
  EXPECT_THAT(std::string(PlanJob(zbv).status().message()),
              HasSubstr("schedule.kind: ZBVZeroBubble is not supported by the worker runtime yet"));
}

}  // namespace
}  // namespace stagecoach::coordinator

namespace stagecoach::coordinator {
namespace {

TEST(PlanJob, EveryExampleConfigPlans) {
  int planned = 0;
  for (const auto& entry : std::filesystem::directory_iterator(testing::ConfigsDir())) {
    if (entry.path().extension() != ".yaml") continue;
    std::ifstream in(entry.path());
    std::stringstream text;
    text << in.rdbuf();
    auto spec = spec::ParseJobSpec(text.str(), entry.path().string());
    ASSERT_TRUE(spec.ok()) << spec.status();
    auto plan = PlanJob(*spec);
    EXPECT_TRUE(plan.ok()) << entry.path() << ": " << plan.status();
    ++planned;
  }
  EXPECT_GE(planned, 4);
}

}  // namespace
}  // namespace stagecoach::coordinator
