// GetJobSchedule's view of a real plan (PlanJob of a small MLP spec): per-rank stages, compute
// and lowered lists, and the grids, for 1F1B (one stage per rank) and Interleaved1F1B (two).
#include "coordinator/planning/schedule_view.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/schedule/action.h"
#include "common/schedule/validator.h"
#include "common/spec/spec_parser.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stagecoach::coordinator::schedule_view_test {
namespace {

using ::testing::ElementsAre;

Plan MakePlan(const std::string& kind, int stages, int workers) {
  auto spec = spec::ParseJobSpec(
      absl::StrCat("name: t\nmodel: {builtin: {family: mlp, sizes: [4, 8, 8, 8, 2]}}\n",
                   "split: {stages: ", stages, "}\nschedule: {kind: ", kind,
                   ", microbatches: 4}\nplacement: {workers: ", workers,
                   "}\ntraining: {batch_size: 8}\n"),
      "t");
  EXPECT_TRUE(spec.ok()) << spec.status();
  auto plan = PlanJob(*spec);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *plan;
}

std::vector<std::string> Strings(const google::protobuf::RepeatedPtrField<std::string>& field) {
  return {field.begin(), field.end()};
}

// Checks the view against the plan it was made from, independently of how ScheduleView walks it.
void ExpectMatchesPlan(const v1::GetJobScheduleResponse& view, const Plan& plan) {
  EXPECT_EQ(view.schedule(), plan.schedule_name);
  EXPECT_EQ(view.num_stages(), plan.num_stages);
  EXPECT_EQ(view.num_ranks(), plan.num_ranks);
  EXPECT_EQ(view.microbatches(), plan.num_microbatches);
  ASSERT_EQ(view.ranks_size(), plan.num_ranks);
  schedule::PipelineOrder compute(plan.num_ranks), lowered(plan.num_ranks);
  int compute_total = 0;
  for (int r = 0; r < plan.num_ranks; ++r) {
    const v1::RankSchedule& rank = view.ranks(r);
    EXPECT_EQ(rank.rank(), r);
    for (int s : rank.stages()) EXPECT_EQ(plan.stage_to_rank.at(s), r) << "stage " << s;
    // Every lowered action, parsed back, is the plan's (no idle slots in a plan).
    ASSERT_EQ(static_cast<size_t>(rank.lowered_actions_size()), plan.lowered[r].size());
    for (int i = 0; i < rank.lowered_actions_size(); ++i) {
      auto parsed = schedule::ParseRequiredAction(rank.lowered_actions(i));
      ASSERT_TRUE(parsed.ok()) << parsed.status();
      EXPECT_EQ(*parsed, *plan.lowered[r][i]);
      lowered[r].push_back(*parsed);
      if (schedule::IsCompute(parsed->type)) compute[r].push_back(*parsed);
    }
    // Compute actions: the lowered list's compute actions, in order, nothing else.
    ASSERT_EQ(rank.compute_actions_size(), static_cast<int>(compute[r].size()));
    for (int i = 0; i < rank.compute_actions_size(); ++i) {
      EXPECT_EQ(rank.compute_actions(i), compute[r][i]->ToString());
      EXPECT_FALSE(absl::StrContains(rank.compute_actions(i), "SEND"));
      EXPECT_FALSE(absl::StrContains(rank.compute_actions(i), "RECV"));
      EXPECT_FALSE(absl::StrContains(rank.compute_actions(i), "REDUCE_GRAD"));
    }
    compute_total += rank.compute_actions_size();
  }
  // F and B for every stage and microbatch.
  EXPECT_EQ(compute_total, 2 * plan.num_stages * plan.num_microbatches);
  // The compute lists form a valid schedule whose stage map is the plan's.
  auto stage_to_rank = schedule::ValidateComputeSchedule(compute, plan.num_ranks, plan.num_stages,
                                                         plan.num_microbatches);
  ASSERT_TRUE(stage_to_rank.ok()) << stage_to_rank.status();
  EXPECT_EQ(*stage_to_rank, plan.stage_to_rank);
  EXPECT_EQ(view.grid(), schedule::FormatGrid(compute));
  EXPECT_EQ(view.lowered_grid(), schedule::FormatGrid(lowered));
}

TEST(ScheduleView, OneFOneBOnTwoRanks) {
  const Plan plan = MakePlan("1F1B", 2, 2);
  const v1::GetJobScheduleResponse view = ScheduleView(plan);
  ExpectMatchesPlan(view, plan);
  EXPECT_EQ(view.schedule(), "1F1B");
  EXPECT_THAT(view.ranks(0).stages(), ElementsAre(0));
  EXPECT_THAT(view.ranks(1).stages(), ElementsAre(1));
  // 1F1B with 2 stages and 4 microbatches: the last stage alternates from the start.
  EXPECT_THAT(Strings(view.ranks(1).compute_actions()),
              ElementsAre("1F0", "1B0", "1F1", "1B1", "1F2", "1B2", "1F3", "1B3"));
  EXPECT_THAT(Strings(view.ranks(0).compute_actions()),
              ElementsAre("0F0", "0F1", "0B0", "0F2", "0B1", "0F3", "0B2", "0B3"));
  // The lowered list receives before the first forward and reduces gradients at the end.
  EXPECT_EQ(view.ranks(1).lowered_actions(0), "1RECV_F0");
  EXPECT_EQ(view.ranks(0).lowered_actions(1), "0SEND_F0");
  // Grids: a header naming both ranks, then one row per step.
  EXPECT_TRUE(absl::StrContains(view.grid(), "Rank 0")) << view.grid();
  EXPECT_TRUE(absl::StrContains(view.grid(), "Rank 1")) << view.grid();
  EXPECT_FALSE(absl::StrContains(view.grid(), "SEND_F")) << view.grid();
  EXPECT_TRUE(absl::StrContains(view.lowered_grid(), "0SEND_F0")) << view.lowered_grid();
}

TEST(ScheduleView, InterleavedOneFOneBOnTwoRanksWithTwoStagesEach) {
  const Plan plan = MakePlan("Interleaved1F1B", 4, 2);
  const v1::GetJobScheduleResponse view = ScheduleView(plan);
  ExpectMatchesPlan(view, plan);
  EXPECT_EQ(view.num_stages(), 4);
  EXPECT_EQ(view.num_ranks(), 2);
  // Loop placement: rank 0 holds stages 0 and 2, rank 1 stages 1 and 3.
  EXPECT_THAT(view.ranks(0).stages(), ElementsAre(0, 2));
  EXPECT_THAT(view.ranks(1).stages(), ElementsAre(1, 3));
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(view.ranks(r).compute_actions_size(), 2 * 2 * 4) << "rank " << r;
    EXPECT_GT(view.ranks(r).lowered_actions_size(), view.ranks(r).compute_actions_size());
  }
}

}  // namespace
}  // namespace stagecoach::coordinator::schedule_view_test
