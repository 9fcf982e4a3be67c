// Every generator against every golden file PyTorch produced (golden pytorch-schedules): compute
// orders, lowered (comms) orders, merge_bw orders, grids and constraint errors. The files are
// discovered by name, so a schedule kind that is missing or wrong fails here.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/schedule/build.h"
#include "common/schedule/csv.h"
#include "common/schedule/generators.h"
#include "common/schedule/lowering.h"
#include "common/schedule/validator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/golden.h"

namespace stagecoach::schedule::schedule_golden_test {
namespace {

using testing::JoinActions;

ScheduleConfig ConfigOf(const testing::GoldenFile& g) {
  ScheduleConfig config;
  auto kind = ParseScheduleKind(g.schedule);
  EXPECT_TRUE(kind.ok()) << kind.status();
  config.kind = kind.value_or(ScheduleKind::kGPipe);
  config.num_ranks = g.ranks;
  config.stages_per_rank = g.stages_per_rank;
  config.num_microbatches = g.microbatches;
  return config;
}

std::vector<int> MappingOf(const ScheduleConfig& config) {
  return *StageToRank(NumStages(config), config.num_ranks, DefaultMappingStyle(config.kind));
}

// PyTorch's 1F1B list for its last rank runs F1..Fm (see ScheduleKind::k1F1B); ours F0..F(m-1)
// in the same slots. Returns the golden order with that one defect repaired.
PipelineOrder Repaired1F1B(PipelineOrder golden) {
  for (auto& action : golden.back()) {
    if (action && action->type == ActionType::kForward)
      action->microbatch = *action->microbatch - 1;
  }
  return golden;
}

TEST(ScheduleGolden, ComputeOrders) {
  int checked = 0;
  for (const testing::GoldenFile& g : testing::GoldenFiles(".compute.csv")) {
    SCOPED_TRACE(g.file);
    const ScheduleConfig config = ConfigOf(g);
    auto ours = GenerateSchedule(config);
    if (!ours.ok()) {
      ADD_FAILURE() << ours.status();
      continue;
    }
    PipelineOrder golden = testing::LoadGoldenOrder(g.file);
    if (config.kind == ScheduleKind::k1F1B) golden = Repaired1F1B(golden);
    if (ours->size() != golden.size()) {
      ADD_FAILURE() << "ranks: " << ours->size() << " vs " << golden.size();
      continue;
    }
    for (size_t rank = 0; rank < golden.size(); ++rank) {
      EXPECT_EQ(JoinActions((*ours)[rank]), JoinActions(golden[rank])) << "rank " << rank;
    }
    if (config.kind != ScheduleKind::k1F1B) {
      EXPECT_EQ(FormatScheduleCsv(*ours), testing::WithoutCR(testing::ReadGolden(g.file)));
    }
    auto mapping = ValidateComputeSchedule(*ours, g.ranks, g.num_stages(), g.microbatches);
    if (!mapping.ok()) {
      ADD_FAILURE() << mapping.status();
      continue;
    }
    EXPECT_EQ(*mapping, MappingOf(config));
    ++checked;
  }
  EXPECT_EQ(checked, 33);
}

TEST(ScheduleGolden, TimeAlignedOrders) {
  int checked = 0;
  for (const testing::GoldenFile& g : testing::GoldenFiles(".compute_raw.csv")) {
    SCOPED_TRACE(g.file);
    const ScheduleConfig config = ConfigOf(g);
    auto ours = GenerateTimeAligned(config);
    if (!ours.ok()) {
      ADD_FAILURE() << ours.status();
      continue;
    }
    PipelineOrder golden = testing::LoadGoldenOrder(g.file);
    if (config.kind == ScheduleKind::k1F1B) golden = Repaired1F1B(golden);
    EXPECT_EQ(*ours, golden);
    ++checked;
  }
  EXPECT_EQ(checked, 10);
}

TEST(ScheduleGolden, LoweredOrders) {
  int checked = 0;
  for (const testing::GoldenFile& g : testing::GoldenFiles(".comms.csv")) {
    SCOPED_TRACE(g.file);
    const ScheduleConfig config = ConfigOf(g);
    auto compute = GenerateSchedule(config);
    if (!compute.ok()) {
      ADD_FAILURE() << compute.status();
      continue;
    }
    const std::vector<int> mapping = MappingOf(config);
    auto lowered = LowerSchedule(*compute, mapping, g.num_stages(), g.microbatches);
    if (!lowered.ok()) {
      ADD_FAILURE() << lowered.status();
      continue;
    }
    const PipelineOrder golden = testing::LoadGoldenOrder(g.file);
    if (lowered->size() != golden.size()) {
      ADD_FAILURE() << "ranks: " << lowered->size() << " vs " << golden.size();
      continue;
    }
    for (size_t rank = 0; rank < golden.size(); ++rank) {
      EXPECT_EQ(JoinActions((*lowered)[rank]), JoinActions(golden[rank])) << "rank " << rank;
    }
    EXPECT_EQ(FormatScheduleCsv(*lowered), testing::WithoutCR(testing::ReadGolden(g.file)));
    absl::Status valid = ValidateLoweredSchedule(*lowered, mapping, g.num_stages(), g.microbatches);
    EXPECT_TRUE(valid.ok()) << valid;
    ++checked;
  }
  EXPECT_EQ(checked, 23);
}

TEST(ScheduleGolden, SendRecvOnlyOrders) {
  int checked = 0;
  for (const testing::GoldenFile& g : testing::GoldenFiles(".sendrecv_only.csv")) {
    SCOPED_TRACE(g.file);
    const ScheduleConfig config = ConfigOf(g);
    auto compute = GenerateSchedule(config);
    if (!compute.ok()) {
      ADD_FAILURE() << compute.status();
      continue;
    }
    auto lowered = AddSendRecv(*compute, MappingOf(config), g.num_stages());
    if (!lowered.ok()) {
      ADD_FAILURE() << lowered.status();
      continue;
    }
    EXPECT_EQ(*lowered, testing::LoadGoldenOrder(g.file));
    ++checked;
  }
  EXPECT_EQ(checked, 2);
}

TEST(ScheduleGolden, MergeBackwardOrders) {
  int checked = 0;
  for (const testing::GoldenFile& g : testing::GoldenFiles(".merge_bw.csv")) {
    SCOPED_TRACE(g.file);
    auto compute = GenerateSchedule(ConfigOf(g));
    if (!compute.ok()) {
      ADD_FAILURE() << compute.status();
      continue;
    }
    PipelineOrder merged;
    for (const RankActions& actions : *compute) merged.push_back(MergeBackward(actions));
    EXPECT_EQ(merged, testing::LoadGoldenOrder(g.file));
    EXPECT_EQ(FormatScheduleCsv(merged), testing::WithoutCR(testing::ReadGolden(g.file)));
    ++checked;
  }
  EXPECT_EQ(checked, 14);
}

TEST(ScheduleGolden, Grids) {
  int checked = 0;
  for (const testing::GoldenFile& g : testing::GoldenFiles(".grid.txt")) {
    SCOPED_TRACE(g.file);
    auto compute = GenerateSchedule(ConfigOf(g));
    if (!compute.ok()) {
      ADD_FAILURE() << compute.status();
      continue;
    }
    EXPECT_EQ(testing::Normalized(FormatGrid(*compute)),
              testing::Normalized(testing::ReadGolden(g.file)));
    ++checked;
  }
  for (const testing::GoldenFile& g : testing::GoldenFiles(".comms.grid.txt")) {
    SCOPED_TRACE(g.file);
    auto built = BuildSchedule(ConfigOf(g));
    if (!built.ok()) {
      ADD_FAILURE() << built.status();
      continue;
    }
    EXPECT_EQ(testing::Normalized(FormatGrid(built->lowered)),
              testing::Normalized(testing::ReadGolden(g.file)));
    ++checked;
  }
  EXPECT_EQ(checked, 4);
}

struct ConstraintCase {
  ScheduleKind kind;
  int ranks, stages_per_rank, microbatches;
  std::string message;
};

// The configurations PyTorch refuses (golden README), with PyTorch's messages.
TEST(ScheduleGolden, ConstraintErrors) {
  const std::vector<ConstraintCase> cases = {
      {ScheduleKind::k1F1B, 4, 1, 2,
       "Number of microbatches (2) must be greater than or equal to the number of stages (4)."},
      {ScheduleKind::kInterleaved1F1B, 4, 2, 9,
       "Interleaved 1F1B requires the number of microbatches to be a multiple of the number of "
       "rounds (2), but got 9."},
      {ScheduleKind::kInterleavedZeroBubble, 4, 2, 9,
       "Zero bubble requires the number of microbatches to be a multiple of the number of rounds "
       "(2), but got 9."},
      {ScheduleKind::kZBVZeroBubble, 4, 1, 8, "ZBV requires exactly 2 stages per rank, but got 1."},
      {ScheduleKind::kDualPipeV, 4, 2, 4,
       "DualPipeV requires at least as many microbatches as stages, but got 4 microbatches and 8 "
       "stages."},
      {ScheduleKind::kDualPipeV, 4, 1, 8, "ZBV requires exactly 2 stages per rank, but got 1."},
  };
  for (const ConstraintCase& c : cases) {
    ScheduleConfig config;
    config.kind = c.kind;
    config.num_ranks = c.ranks;
    config.stages_per_rank = c.stages_per_rank;
    config.num_microbatches = c.microbatches;
    SCOPED_TRACE(absl::StrCat(ScheduleKindName(c.kind), " r", c.ranks, " s", c.stages_per_rank,
                              " m", c.microbatches));
    for (bool aligned : {false, true}) {
      auto order = aligned ? GenerateTimeAligned(config) : GenerateSchedule(config);
      EXPECT_FALSE(order.ok());
      EXPECT_EQ(order.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_EQ(order.status().message(), c.message);
    }
  }
}

}  // namespace
}  // namespace stagecoach::schedule::schedule_golden_test
