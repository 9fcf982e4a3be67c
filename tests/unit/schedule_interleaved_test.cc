// The multi-stage loop-placed generators (Interleaved1F1B, LoopedBFS, InterleavedZeroBubble):
// small cases written out by hand, PyTorch's rounds rule, and a sweep over every configuration
// PyTorch accepts up to 16 ranks, 4 stages per rank and 64 microbatches, each of which must pass
// the compute validator, place stage s on rank s % ranks and lower to sends and receives, and
// whose slots must respect the dependencies wherever PyTorch's do.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/schedule/generators.h"
#include "common/schedule/lowering.h"
#include "common/schedule/validator.h"
#include "gtest/gtest.h"
#include "tests/support/golden.h"

namespace stagecoach::schedule::schedule_interleaved_test {
namespace {

using testing::DescribeConfig;
using testing::ScheduleConfigFor;

// One CSV-like row per rank, idle slots empty.
std::vector<std::string> Rows(const PipelineOrder& order) {
  std::vector<std::string> rows;
  for (const RankActions& actions : order) {
    std::vector<std::string> cells;
    for (const auto& action : actions) cells.push_back(action ? action->ToString() : "");
    rows.push_back(absl::StrJoin(cells, ","));
  }
  return rows;
}

std::vector<std::string> Generated(const ScheduleConfig& config) {
  absl::StatusOr<PipelineOrder> order = GenerateSchedule(config);
  EXPECT_TRUE(order.ok()) << DescribeConfig(config) << ": " << order.status();
  return order.ok() ? Rows(*order) : std::vector<std::string>{};
}

// The message PyTorch raises for `config`, computed independently from the generators: the
// interleaved schedules need m to be a multiple of rounds = max(1, m / ranks); LoopedBFS accepts
// everything. Empty if PyTorch accepts the config.
std::string PyTorchRoundsError(const ScheduleConfig& config) {
  if (config.kind == ScheduleKind::kLoopedBFS) return "";
  const int m = config.num_microbatches;
  const int rounds = std::max(1, m / config.num_ranks);
  if (m % rounds == 0) return "";
  const char* prefix =
      config.kind == ScheduleKind::kInterleaved1F1B ? "Interleaved 1F1B" : "Zero bubble";
  return absl::StrCat(prefix,
                      " requires the number of microbatches to be a multiple of the number of "
                      "rounds (",
                      rounds, "), but got ", m, ".");
}

// Dependencies that the slots of a time-aligned order contradict: F(s, mb) (s > 0) in a slot not
// after F(s-1, mb), and B or I of (s, mb) in a slot not after that of (s+1, mb) (for the last
// stage: after its F). PyTorch's lists are only valid as orders; their slots are meant as time
// but are not always consistent.
struct Misaligned {
  int forwards = 0;
  int backwards = 0;
};

Misaligned CountMisaligned(const PipelineOrder& order, int num_stages, int num_microbatches) {
  // slot[(stage * 2 + is_backward) * num_microbatches + mb]; W is left out.
  std::vector<int> slot(static_cast<size_t>(num_stages) * 2 * num_microbatches, -1);
  auto index = [&](int stage, bool backward, int mb) {
    return (stage * 2 + (backward ? 1 : 0)) * num_microbatches + mb;
  };
  for (const RankActions& actions : order) {
    for (size_t t = 0; t < actions.size(); ++t) {
      const std::optional<Action>& a = actions[t];
      if (!a || a->type == ActionType::kBackwardWeight) continue;
      slot[index(a->stage, a->type != ActionType::kForward, *a->microbatch)] = static_cast<int>(t);
    }
  }
  Misaligned misaligned;
  for (int stage = 0; stage < num_stages; ++stage) {
    for (int mb = 0; mb < num_microbatches; ++mb) {
      if (stage > 0 && slot[index(stage, false, mb)] <= slot[index(stage - 1, false, mb)]) {
        ++misaligned.forwards;
      }
      const int producer =
          stage + 1 < num_stages ? index(stage + 1, true, mb) : index(stage, false, mb);
      if (slot[index(stage, true, mb)] <= slot[producer]) ++misaligned.backwards;
    }
  }
  return misaligned;
}

TEST(LoopedBFS, TwoRanksTwoStagesTwoMicrobatches) {
  // Each local stage runs all microbatches forward; rank 0 then idles two slots while the first
  // gradient comes back from rank 1; backwards go last stage first, microbatches in reverse.
  EXPECT_EQ(Generated(ScheduleConfigFor(ScheduleKind::kLoopedBFS, 2, 2, 2)),
            (std::vector<std::string>{
                "0F0,0F1,2F0,2F1,,,2B1,2B0,0B1,0B0",
                ",1F0,1F1,3F0,3F1,3B1,3B0,1B1,1B0",
            }));
}

TEST(LoopedBFS, OneStagePerRankIsFillDrainWithReversedBackwards) {
  EXPECT_EQ(Generated(ScheduleConfigFor(ScheduleKind::kLoopedBFS, 3, 1, 2)),
            (std::vector<std::string>{
                "0F0,0F1,,,,,0B1,0B0",
                ",1F0,1F1,,,1B1,1B0",
                ",,2F0,2F1,2B1,2B0",
            }));
}

TEST(Interleaved1F1B, TwoRanksOneStageThreeMicrobatches) {
  // rounds = max(1, 3 / 2) = 1, so one round of 3. Rank 0 warms up with 2 forwards (two per hop
  // to the last rank) and idles until its first backward at slot 1 * 2 + 2 = 4; in the cool-down
  // an idle slot precedes each backward. Rank 1 has no warm-up and no post-warm-up idle slot.
  EXPECT_EQ(Generated(ScheduleConfigFor(ScheduleKind::kInterleaved1F1B, 2, 1, 3)),
            (std::vector<std::string>{
                "0F0,0F1,,,0F2,0B0,,0B1,,0B2",
                ",1F0,1B0,1F1,1B1,1F2,1B2",
            }));
}

TEST(Interleaved1F1B, ThreeLocalStagesInChunksOfOneRound) {
  // r2 s3 m2: one round of 2, so forwards go in chunks of 2 per local stage (0,0,2,2,4,4 on rank
  // 0) and backwards mirror them (4,4,2,2,0,0). Rank 0's warm-up, 2 * 2 + 2 * 1 = 6, is every
  // forward; it idles until slot 3 * 2 + 2 = 8 and then runs the cool-down. Rank 1 warms up with
  // 4, idles one slot to reach slot 6, runs the last chunk as F/B pairs, then the cool-down.
  EXPECT_EQ(Generated(ScheduleConfigFor(ScheduleKind::kInterleaved1F1B, 2, 3, 2)),
            (std::vector<std::string>{
                "0F0,0F1,2F0,2F1,4F0,4F1,,,,4B0,,4B1,,2B0,,2B1,,0B0,,0B1",
                ",1F0,1F1,3F0,3F1,,5F0,5B0,5F1,5B1,,3B0,,3B1,,1B0,,1B1",
            }));
}

TEST(Interleaved1F1B, FewerMicrobatchesThanRanksKeepsPyTorchsSlots) {
  // r2 s2 m1: one round of one microbatch. PyTorch's slots assume a round of num_ranks
  // microbatches, so with fewer they are not time: 2F0 shares slot 1 with the 1F0 it consumes
  // and 1B0 shares slot 7 with 2B0. As an order it is valid, and we keep it as PyTorch has it.
  const ScheduleConfig config = ScheduleConfigFor(ScheduleKind::kInterleaved1F1B, 2, 2, 1);
  EXPECT_EQ(Generated(config), (std::vector<std::string>{
                                   "0F0,2F0,,,,,,2B0,,0B0",
                                   ",1F0,,,3F0,3B0,,1B0",
                               }));
  absl::StatusOr<PipelineOrder> order = GenerateSchedule(config);
  ASSERT_TRUE(order.ok());
  const Misaligned misaligned = CountMisaligned(*order, 4, 1);
  EXPECT_EQ(misaligned.forwards, 1);
  EXPECT_EQ(misaligned.backwards, 1);
}

TEST(InterleavedZeroBubble, BubblesDelayForwardsButNeverBackwards) {
  // r2 s2 m1. Before bubble insertion rank 0 is 0F0,2F0,,2I0,2W0,0I0,0W0 and rank 1 is
  // ,1F0,3F0,3I0,1I0,3W0,1W0. 2F0 must wait for 1F0 (slot 1) and 3F0 for 2F0 (slot 2), so each
  // gets one idle slot before it. I is never delayed (as in PyTorch), so 2I0 shares slot 4 with
  // the 3I0 it depends on; the order still lowers.
  EXPECT_EQ(Generated(ScheduleConfigFor(ScheduleKind::kInterleavedZeroBubble, 2, 2, 1)),
            (std::vector<std::string>{
                "0F0,,2F0,,2I0,2W0,0I0,0W0",
                ",1F0,,3F0,3I0,1I0,3W0,1W0",
            }));
}

TEST(InterleavedZeroBubble, WeightsFollowInputGradientsAfterRankWarmup) {
  // r2 s1 m2: rank 0 issues a W after every I; rank 1 holds back its first W (num_1f1b = rank)
  // and issues it after its second I, then the last W closes the list.
  EXPECT_EQ(Generated(ScheduleConfigFor(ScheduleKind::kInterleavedZeroBubble, 2, 1, 2)),
            (std::vector<std::string>{
                "0F0,,0F1,0I0,0W0,0I1,0W1",
                ",1F0,1I0,1F1,1I1,1W0,1W1",
            }));
}

TEST(RoundsRule, NineMicrobatchesOnFourRanksIsRefused) {
  // rounds = max(1, 9 / 4) = 2 and 9 is odd.
  for (int spr : {1, 2, 3}) {
    absl::StatusOr<PipelineOrder> interleaved =
        GenerateSchedule(ScheduleConfigFor(ScheduleKind::kInterleaved1F1B, 4, spr, 9));
    EXPECT_EQ(interleaved.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(interleaved.status().message(),
              "Interleaved 1F1B requires the number of microbatches to be a multiple of the "
              "number of rounds (2), but got 9.");
    absl::StatusOr<PipelineOrder> zero_bubble =
        GenerateSchedule(ScheduleConfigFor(ScheduleKind::kInterleavedZeroBubble, 4, spr, 9));
    EXPECT_EQ(zero_bubble.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(zero_bubble.status().message(),
              "Zero bubble requires the number of microbatches to be a multiple of the number of "
              "rounds (2), but got 9.");
    EXPECT_TRUE(GenerateSchedule(ScheduleConfigFor(ScheduleKind::kLoopedBFS, 4, spr, 9)).ok());
  }
}

TEST(RoundsRule, FewerMicrobatchesThanRanksIsOneRound) {
  // rounds = max(1, 3 / 4) = 1, which divides 3.
  for (ScheduleKind kind : {ScheduleKind::kInterleaved1F1B, ScheduleKind::kInterleavedZeroBubble}) {
    absl::StatusOr<PipelineOrder> order = GenerateSchedule(ScheduleConfigFor(kind, 4, 2, 3));
    EXPECT_TRUE(order.ok()) << ScheduleKindName(kind) << ": " << order.status();
  }
  // rounds = 15 / 4 = 3 divides 15; rounds = 14 / 4 = 3 does not divide 14.
  EXPECT_TRUE(GenerateSchedule(ScheduleConfigFor(ScheduleKind::kInterleaved1F1B, 4, 2, 15)).ok());
  EXPECT_EQ(
      GenerateSchedule(ScheduleConfigFor(ScheduleKind::kInterleaved1F1B, 4, 2, 14)).status().code(),
      absl::StatusCode::kInvalidArgument);
}

// Checks one accepted config: the compute validator passes, the inferred placement is the loop
// placement, and send/recv insertion finds an order without deadlock. Returns false (after
// recording a failure) on the first problem.
bool CheckAccepted(const ScheduleConfig& config, const PipelineOrder& order) {
  const int num_stages = NumStages(config);
  absl::StatusOr<std::vector<int>> mapping =
      ValidateComputeSchedule(order, config.num_ranks, num_stages, config.num_microbatches);
  if (!mapping.ok()) {
    ADD_FAILURE() << DescribeConfig(config) << ": " << mapping.status();
    return false;
  }
  absl::StatusOr<std::vector<int>> loop =
      StageToRank(num_stages, config.num_ranks, MappingStyle::kLoop);
  if (!loop.ok() || *mapping != *loop) {
    ADD_FAILURE() << DescribeConfig(config) << ": inferred placement is not the loop placement";
    return false;
  }
  absl::StatusOr<PipelineOrder> lowered = AddSendRecv(order, *mapping, num_stages);
  if (!lowered.ok()) {
    ADD_FAILURE() << DescribeConfig(config) << ": " << lowered.status();
    return false;
  }
  // Where PyTorch's slots are consistent with the dependencies, ours must be too: always for
  // the forwards of zero bubble (that is what its bubble insertion ensures), and for everything
  // once there are enough microbatches (Interleaved1F1B: whole rounds of num_ranks).
  const Misaligned misaligned = CountMisaligned(order, num_stages, config.num_microbatches);
  const bool full_rounds = config.num_microbatches % config.num_ranks == 0;
  const bool enough = config.num_microbatches >= config.num_ranks;
  bool aligned = true;
  switch (config.kind) {
    case ScheduleKind::kInterleavedZeroBubble:
      aligned = misaligned.forwards == 0 && (!enough || misaligned.backwards == 0);
      break;
    case ScheduleKind::kLoopedBFS:
      aligned = !enough || (misaligned.forwards == 0 && misaligned.backwards == 0);
      break;
    default:
      aligned = !full_rounds || (misaligned.forwards == 0 && misaligned.backwards == 0);
      break;
  }
  if (!aligned) {
    ADD_FAILURE() << DescribeConfig(config) << ": slots contradict " << misaligned.forwards
                  << " forward and " << misaligned.backwards << " backward dependencies";
    return false;
  }
  return true;
}

void Sweep(ScheduleKind kind) {
  int accepted = 0;
  int refused = 0;
  int failures = 0;
  for (int ranks = 1; ranks <= 16; ++ranks) {
    for (int spr = 1; spr <= 4; ++spr) {
      for (int mbs = 1; mbs <= 64 && failures < 5; ++mbs) {
        const ScheduleConfig config = ScheduleConfigFor(kind, ranks, spr, mbs);
        const std::string expected_error = PyTorchRoundsError(config);
        absl::StatusOr<PipelineOrder> order = GenerateSchedule(config);
        if (!expected_error.empty()) {
          ++refused;
          if (order.ok() || order.status().code() != absl::StatusCode::kInvalidArgument ||
              order.status().message() != expected_error) {
            ADD_FAILURE() << DescribeConfig(config) << ": expected \"" << expected_error
                          << "\", got " << (order.ok() ? "a schedule" : order.status().ToString());
            ++failures;
          }
          continue;
        }
        ++accepted;
        if (!order.ok()) {
          ADD_FAILURE() << DescribeConfig(config) << ": " << order.status();
          ++failures;
        } else if (!CheckAccepted(config, *order)) {
          ++failures;
        }
      }
    }
  }
  // 16 * 4 * 64 configurations in all; LoopedBFS refuses none.
  EXPECT_EQ(accepted + refused, 16 * 4 * 64);
  if (kind == ScheduleKind::kLoopedBFS) {
    EXPECT_EQ(refused, 0);
  } else {
    EXPECT_GT(refused, 0);
  }
}

TEST(Sweep, LoopedBFS) { Sweep(ScheduleKind::kLoopedBFS); }
TEST(Sweep, Interleaved1F1B) { Sweep(ScheduleKind::kInterleaved1F1B); }
TEST(Sweep, InterleavedZeroBubble) { Sweep(ScheduleKind::kInterleavedZeroBubble); }

}  // namespace
}  // namespace stagecoach::schedule::schedule_interleaved_test
