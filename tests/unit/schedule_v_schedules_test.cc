// The two "v"-placed schedules, ZBVZeroBubble and DualPipeV: valid and deadlock-free for every
// configuration PyTorch accepts up to 16 ranks and 64 microbatches, refused with PyTorch's
// messages exactly where PyTorch refuses, and a few small cases written out by hand. Parity with
// PyTorch on its own configurations is schedule_golden_test's job.
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/schedule/csv.h"
#include "common/schedule/generators.h"
#include "common/schedule/lowering.h"
#include "common/schedule/validator.h"
#include "gtest/gtest.h"
#include "tests/support/golden.h"

namespace stagecoach::schedule::schedule_v_schedules_test {
namespace {

using testing::DescribeConfig;

// Both V schedules run two stages per rank.
ScheduleConfig Config(ScheduleKind kind, int ranks, int microbatches, int stages_per_rank = 2) {
  return testing::ScheduleConfigFor(kind, ranks, stages_per_rank, microbatches);
}

// PyTorch's error for `config`, or nullopt where PyTorch builds the schedule. Written from
// PyTorch's constructors: both classes check the stages per rank first; DualPipeV then needs at
// least one microbatch per stage. ZBVZeroBubble has no microbatch minimum.
std::optional<std::string> PyTorchError(const ScheduleConfig& config) {
  if (config.stages_per_rank != 2) {
    return absl::StrCat("ZBV requires exactly 2 stages per rank, but got ", config.stages_per_rank,
                        ".");
  }
  const int num_stages = 2 * config.num_ranks;
  if (config.kind == ScheduleKind::kDualPipeV && config.num_microbatches < num_stages) {
    return absl::StrCat("DualPipeV requires at least as many microbatches as stages, but got ",
                        config.num_microbatches, " microbatches and ", num_stages, " stages.");
  }
  return std::nullopt;
}

// Rank r holds stages r and 2*ranks-1-r, written out rather than taken from StageToRank.
std::vector<int> VMapping(int ranks) {
  std::vector<int> stage_to_rank(2 * ranks);
  for (int rank = 0; rank < ranks; ++rank) {
    stage_to_rank[rank] = rank;
    stage_to_rank[2 * ranks - 1 - rank] = rank;
  }
  return stage_to_rank;
}

// Validates `order` as a compute schedule for `config` with the "v" mapping, and checks that
// lowering it (send/recv insertion alone, and PyTorch's whole runtime lowering, then the lowered
// validator with its deadlock check) succeeds. Failures name the config.
void ExpectValidAndLowerable(const ScheduleConfig& config, const PipelineOrder& order) {
  SCOPED_TRACE(DescribeConfig(config));
  const int ranks = config.num_ranks;
  const int stages = 2 * ranks;
  const int microbatches = config.num_microbatches;
  auto mapping = ValidateComputeSchedule(order, ranks, stages, microbatches);
  ASSERT_TRUE(mapping.ok()) << mapping.status();
  EXPECT_EQ(*mapping, VMapping(ranks));
  auto with_comms = AddSendRecv(order, VMapping(ranks), stages);
  EXPECT_TRUE(with_comms.ok()) << with_comms.status();
  auto lowered = LowerSchedule(order, VMapping(ranks), stages, microbatches);
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  absl::Status valid = ValidateLoweredSchedule(*lowered, VMapping(ranks), stages, microbatches);
  EXPECT_TRUE(valid.ok()) << valid;
}

class VScheduleSweep : public ::testing::TestWithParam<ScheduleKind> {};

// Every ranks 1..16 and microbatches 1..64 with two stages per rank: either PyTorch's error,
// exactly, or a schedule that validates with the "v" mapping and lowers without deadlock.
TEST_P(VScheduleSweep, ValidAndDeadlockFreeWhereverPyTorchAccepts) {
  int accepted = 0;
  int refused = 0;
  for (int ranks = 1; ranks <= 16; ++ranks) {
    for (int microbatches = 1; microbatches <= 64; ++microbatches) {
      const ScheduleConfig config = Config(GetParam(), ranks, microbatches);
      auto order = GenerateSchedule(config);
      if (std::optional<std::string> error = PyTorchError(config)) {
        EXPECT_EQ(order.status().code(), absl::StatusCode::kInvalidArgument)
            << DescribeConfig(config);
        EXPECT_EQ(order.status().message(), *error) << DescribeConfig(config);
        ++refused;
        continue;
      }
      ASSERT_TRUE(order.ok()) << DescribeConfig(config) << ": " << order.status();
      ExpectValidAndLowerable(config, *order);
      if (::testing::Test::HasFailure()) return;  // one broken config is enough to report
      ++accepted;
    }
  }
  // DualPipeV refuses m < 2*ranks: sum over ranks of (2*ranks - 1) = 16*17 - 16 = 256 configs.
  const int expected_refused = GetParam() == ScheduleKind::kDualPipeV ? 256 : 0;
  EXPECT_EQ(refused, expected_refused);
  EXPECT_EQ(accepted, 16 * 64 - expected_refused);
}

// Both kinds refuse any other number of stages per rank, before looking at the microbatches.
TEST_P(VScheduleSweep, RefusesOtherStageCountsWithPyTorchsMessage) {
  for (int stages_per_rank : {1, 3, 4}) {
    for (int ranks : {1, 2, 4}) {
      for (int microbatches : {1, 8, 64}) {
        const ScheduleConfig config = Config(GetParam(), ranks, microbatches, stages_per_rank);
        SCOPED_TRACE(DescribeConfig(config));
        for (bool aligned : {false, true}) {
          auto order = aligned ? GenerateTimeAligned(config) : GenerateSchedule(config);
          EXPECT_EQ(order.status().code(), absl::StatusCode::kInvalidArgument);
          EXPECT_EQ(order.status().message(),
                    absl::StrCat("ZBV requires exactly 2 stages per rank, but got ",
                                 stages_per_rank, "."));
        }
      }
    }
  }
}

// The multi-stage kinds have no separate time-aligned form.
TEST_P(VScheduleSweep, TimeAlignedFormIsTheSchedule) {
  for (int ranks : {1, 3, 4}) {
    const ScheduleConfig config = Config(GetParam(), ranks, 2 * ranks + 3);
    auto order = GenerateSchedule(config);
    auto aligned = GenerateTimeAligned(config);
    ASSERT_TRUE(order.ok()) << order.status();
    ASSERT_TRUE(aligned.ok()) << aligned.status();
    EXPECT_EQ(*order, *aligned) << DescribeConfig(config);
  }
}

INSTANTIATE_TEST_SUITE_P(Kinds, VScheduleSweep,
                         ::testing::Values(ScheduleKind::kZBVZeroBubble, ScheduleKind::kDualPipeV),
                         [](const ::testing::TestParamInfo<ScheduleKind>& info) {
                           return std::string(ScheduleKindName(info.param));
                         });

// One rank, two microbatches: stage 0 (down) and stage 1 (up) on rank 0; padded length
// max(2*1-1, 2) = 2, so nothing is dropped.
//   warm-up: 2*(1-0)-1 = 1 down forward (0F0); no (F up, F down) pairs (rank 0); one
//            (F up, I up, W up) triple (1F0 1I0 1W0) — stage 1 is the last stage, so its
//            backward needs only its own forward;
//   stable:  down forwards 1 < 2, so one step: 0F1, 0I0 0W0 (stage 1's I0 is done), 1F1, 1I1 1W1;
//            now both stages have run 2 forwards;
//   cool-down: no (I down, I up) pairs; 1 - 0 = 1 (I down, W down) pair: 0I1 0W1; no W left.
TEST(ZBVZeroBubble, OneRankTwoMicrobatchesByHand) {
  auto order = GenerateSchedule(Config(ScheduleKind::kZBVZeroBubble, 1, 2));
  ASSERT_TRUE(order.ok()) << order.status();
  EXPECT_EQ(FormatScheduleCsv(*order), "0F0,1F0,1I0,1W0,0F1,0I0,0W0,1F1,1I1,1W1,0I1,0W1\n");
}

// Two ranks, one microbatch: laid out for max(2*2-1, 1) = 3 microbatches (rank 0: stages 0 and
// 3; rank 1: stages 1 and 2), then every action on microbatch 1 or 2 becomes an idle slot in
// place. The padded lists, phase by phase:
//   rank 0: warm-up 0F0 0F1 0F2 | 3F0 3I0 3W0 3F1 3I1 3W1; stable (no down forward left)
//           0I0 0W0 3F2 3I2 3W2; cool-down 0I1 0W1 0I2 0W2.
//   rank 1: one idle slot; warm-up 1F0 | 2F0 1F1 | 2F1 2I0 2W0; stable 1F2 1I0 1W0 2F2 2I1 2W1;
//           cool-down 1I1 2I2 | 1I2 1W1 | 2W2 | 1W2.
// Microbatch 0 keeps its slots: 0F0@0 1F0@1 2F0@2 3F0@3 3I0@4 2I0@5 1I0@8 0I0@9.
TEST(ZBVZeroBubble, TwoRanksOneMicrobatchKeepsThePaddedTiming) {
  auto order = GenerateSchedule(Config(ScheduleKind::kZBVZeroBubble, 2, 1));
  ASSERT_TRUE(order.ok()) << order.status();
  const std::vector<std::string> rank0 = {"0F0", "",    "", "3F0", "3I0", "3W0", "", "", "",
                                          "0I0", "0W0", "", "",    "",    "",    "", "", ""};
  const std::vector<std::string> rank1 = {"", "1F0", "2F0", "", "", "2I0", "2W0", "", "1I0", "1W0",
                                          "", "",    "",    "", "", "",    "",    "", ""};
  EXPECT_EQ(FormatScheduleCsv(*order),
            absl::StrCat(absl::StrJoin(rank0, ","), "\n", absl::StrJoin(rank1, ","), "\n"));
}

// With fewer microbatches than 2*ranks-1, the list is the one for 2*ranks-1 microbatches with
// the extra microbatches' actions turned into idle slots (same length, same slots).
TEST(ZBVZeroBubble, FewMicrobatchesAreThePaddedScheduleWithTheExtraOnesIdle) {
  int compared = 0;
  for (int ranks = 1; ranks <= 10; ++ranks) {
    const int padded = 2 * ranks - 1;
    auto full = GenerateSchedule(Config(ScheduleKind::kZBVZeroBubble, ranks, padded));
    ASSERT_TRUE(full.ok()) << full.status();
    for (int microbatches = 1; microbatches < padded; ++microbatches) {
      const ScheduleConfig config = Config(ScheduleKind::kZBVZeroBubble, ranks, microbatches);
      SCOPED_TRACE(DescribeConfig(config));
      auto order = GenerateSchedule(config);
      ASSERT_TRUE(order.ok()) << order.status();
      PipelineOrder expected = *full;
      int kept = 0;
      for (RankActions& actions : expected) {
        for (std::optional<Action>& action : actions) {
          if (!action) continue;
          if (*action->microbatch >= microbatches) {
            action.reset();
          } else {
            ++kept;
          }
        }
      }
      // Three actions (F, I, W) per microbatch on each of the 2*ranks stages survive.
      EXPECT_EQ(kept, 3 * microbatches * 2 * ranks);
      EXPECT_EQ(*order, expected);
      ++compared;
    }
  }
  EXPECT_EQ(compared, 90);  // sum over ranks 1..10 of (2*ranks - 2)
}

// One rank, two microbatches (stage 0 down, stage 1 up, m = 2*ranks, the smallest allowed):
//   1. 2*(ranks-1-rank) = 0 down forwards;
//   2. rank+1 = 1 (down, up) forward pair: 0F0 1F0;
//   3. no (I up, W, F up) triples;
//   4. m-2*ranks+rank+1 = 1 steady step; on the last rank its first half is not overlapped:
//      0F1 then 1B0, then (1F1;0B0) overlapped;
//   5. none;
//   6. one backward pair; the middle pair is pair 0 and rank 0 is even, so the up backward stays
//      full (1B1) and the down one is split (0I1, its W queued);
//   7. none;  8. the queued W: 0W1.
TEST(DualPipeV, OneRankTwoMicrobatchesByHand) {
  auto order = GenerateSchedule(Config(ScheduleKind::kDualPipeV, 1, 2));
  ASSERT_TRUE(order.ok()) << order.status();
  EXPECT_EQ(FormatScheduleCsv(*order), "0F0,1F0,0F1,1B0,(1F1;0B0)OVERLAP_F_B,1B1,0I1,0W1\n");
}

// As above with a third microbatch: step 4 runs twice, the second time fully overlapped.
TEST(DualPipeV, OneRankThreeMicrobatchesByHand) {
  auto order = GenerateSchedule(Config(ScheduleKind::kDualPipeV, 1, 3));
  ASSERT_TRUE(order.ok()) << order.status();
  EXPECT_EQ(FormatScheduleCsv(*order),
            "0F0,1F0,0F1,1B0,(1F1;0B0)OVERLAP_F_B,(0F2;1B1)OVERLAP_F_B,(1F2;0B1)OVERLAP_F_B,1B2,"
            "0I2,0W2\n");
}

// Two ranks, five microbatches (rank 0: stages 0 and 3; rank 1: stages 1 and 2). Rank 0 is not
// the last rank: two down forwards first, one (I up, W, F up) triple, and its steady steps
// (5-4+0+1 = 2) are all overlapped; rank 1 is odd, so its middle backward pair (pair 1 of 2) is
// split on both stages.
TEST(DualPipeV, TwoRanksFiveMicrobatchesByHand) {
  auto order = GenerateSchedule(Config(ScheduleKind::kDualPipeV, 2, 5));
  ASSERT_TRUE(order.ok()) << order.status();
  const std::string rank0 =
      // 1: 0F0 0F1; 2: 0F2 3F0; 3: 3I0 3W0 3F1; 4: two steps of two overlapped pairs;
      "0F0,0F1,0F2,3F0,3I0,3W0,3F1,(0F3;3B1)OVERLAP_F_B,(3F2;0B0)OVERLAP_F_B,"
      "(0F4;3B2)OVERLAP_F_B,(3F3;0B1)OVERLAP_F_B,"
      // 5: 3B3 (3F4;0B2); 6: one pair, middle 0, even rank: 3B4 full, 0I3 split;
      "3B3,(3F4;0B2)OVERLAP_F_B,3B4,0I3,"
      // 7: the queued W (0W3), then 0I4; 8: 0W4.
      "0W3,0I4,0W4\n";
  const std::string rank1 =
      // 1: none; 2: 1F0 2F0 1F1 2F1; 3: none; 4: 5-4+1+1 = 3 steps, the first not overlapped;
      "1F0,2F0,1F1,2F1,1F2,2B0,(2F2;1B0)OVERLAP_F_B,(1F3;2B1)OVERLAP_F_B,(2F3;1B1)OVERLAP_F_B,"
      "(1F4;2B2)OVERLAP_F_B,(2F4;1B2)OVERLAP_F_B,"
      // 5: none; 6: pairs 0 full, pair 1 split on both (odd rank); 7: none; 8: both Ws in order.
      "2B3,1B3,2I4,1I4,2W4,1W4\n";
  EXPECT_EQ(FormatScheduleCsv(*order), rank0 + rank1);
}

}  // namespace
}  // namespace stagecoach::schedule::schedule_v_schedules_test
