// Lowering passes against PyTorch's own lowered lists (golden pytorch-schedules).
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/schedule/build.h"
#include "common/schedule/csv.h"
#include "common/schedule/generators.h"
#include "common/schedule/lowering.h"
#include "common/schedule/validator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/golden.h"

namespace stagecoach::schedule::schedule_lowering_test {
namespace {

using ::testing::HasSubstr;

// Keeps the actions for which keep(action) holds.
template <typename Pred>
PipelineOrder Filter(const PipelineOrder& order, Pred keep) {
  PipelineOrder out(order.size());
  for (size_t rank = 0; rank < order.size(); ++rank) {
    for (const auto& action : order[rank]) {
      if (action && keep(*action)) out[rank].push_back(action);
    }
  }
  return out;
}

using testing::ParseActions;

TEST(AddReduceGrad, TurnsEveryRawGoldenListIntoItsComputeList) {
  int checked = 0;
  for (const testing::GoldenFile& g : testing::GoldenFiles(".compute_raw.csv")) {
    SCOPED_TRACE(g.file);
    PipelineOrder raw = testing::LoadGoldenOrder(g.file);
    PipelineOrder want = testing::LoadGoldenOrder(g.base + ".compute.csv");
    ASSERT_EQ(raw.size(), want.size());
    for (size_t rank = 0; rank < raw.size(); ++rank) {
      EXPECT_EQ(AddReduceGrad(raw[rank], g.microbatches), want[rank]) << "rank " << rank;
    }
    ++checked;
  }
  EXPECT_EQ(checked, 10);
}

// PyTorch's runtime lowering is unshard/reshard, then reduce-grad, then send/recv; so a comms
// list without SEND/RECV/UNSHARD/RESHARD is the reduce-grad pass applied to the compute list.
TEST(AddReduceGrad, MatchesPyTorchRuntimeLoweringOfMultiStageSchedules) {
  int checked = 0;
  for (const testing::GoldenFile& g : testing::GoldenFiles(".comms.csv")) {
    SCOPED_TRACE(g.file);
    PipelineOrder compute = testing::LoadGoldenOrder(g.base + ".compute.csv");
    PipelineOrder want = Filter(testing::LoadGoldenOrder(g.file), [](const Action& a) {
      return !IsSendOrRecv(a.type) && a.type != ActionType::kUnshard &&
             a.type != ActionType::kReshard;
    });
    ASSERT_EQ(compute.size(), want.size());
    for (size_t rank = 0; rank < compute.size(); ++rank) {
      EXPECT_EQ(AddReduceGrad(compute[rank], g.microbatches), want[rank]) << "rank " << rank;
    }
    ++checked;
  }
  EXPECT_EQ(checked, 23);
}

TEST(AddReduceGrad, CountsOverlappedSubActionsAndWeightGradients) {
  // Stage 0 completes with W1; stage 3 with the B1 inside the overlap.
  RankActions actions = ParseActions(
      {"0F0", "", "3F0", "0F1", "3B0", "0I0", "(0F2;3B1)OVERLAP_F_B", "0W0", "0I1", "0W1"});
  RankActions got = AddReduceGrad(actions, 2);
  RankActions want = ParseActions({"0F0", "3F0", "0F1", "3B0", "0I0", "(0F2;3B1)OVERLAP_F_B",
                                   "3REDUCE_GRAD", "0W0", "0I1", "0W1", "0REDUCE_GRAD"});
  EXPECT_EQ(got, want);
  // I does not count; with 3 microbatches nothing completes.
  EXPECT_EQ(AddReduceGrad(actions, 3).size(), actions.size() - 1);
}

// PyTorch's unshard/reshard pass (window 3) on each golden compute list gives the golden comms
// list without its SEND/RECV and REDUCE_GRAD actions.
TEST(AddUnshardReshard, MatchesEveryGoldenCommsList) {
  int checked = 0;
  for (const testing::GoldenFile& g : testing::GoldenFiles(".comms.csv")) {
    SCOPED_TRACE(g.file);
    PipelineOrder compute = testing::LoadGoldenOrder(g.base + ".compute.csv");
    PipelineOrder want = Filter(testing::LoadGoldenOrder(g.file), [](const Action& a) {
      return !IsSendOrRecv(a.type) && a.type != ActionType::kReduceGrad;
    });
    ASSERT_EQ(compute.size(), want.size());
    for (size_t rank = 0; rank < compute.size(); ++rank) {
      EXPECT_EQ(AddUnshardReshard(compute[rank], 3), want[rank]) << "rank " << rank;
    }
    ++checked;
  }
  EXPECT_EQ(checked, 23);
}

TEST(AddUnshardReshard, WindowSizes) {
  const RankActions actions = ParseActions({"0F0", "", "2F0", "4F0", "0B0", "2B0", "4B0"});
  // Window 1: every change of stage swaps the one active stage.
  EXPECT_EQ(AddUnshardReshard(actions, 1),
            ParseActions({"0UNSHARD", "0F0", "0RESHARD", "2UNSHARD", "2F0", "2RESHARD", "4UNSHARD",
                          "4F0", "4RESHARD", "0UNSHARD", "0B0", "0RESHARD", "2UNSHARD", "2B0",
                          "2RESHARD", "4UNSHARD", "4B0", "4RESHARD"}));
  // Window 2: the next two distinct stages are kept resident.
  EXPECT_EQ(AddUnshardReshard(actions, 2),
            ParseActions({"0UNSHARD", "2UNSHARD", "0F0", "0RESHARD", "4UNSHARD", "2F0", "2RESHARD",
                          "0UNSHARD", "4F0", "4RESHARD", "2UNSHARD", "0B0", "0RESHARD", "4UNSHARD",
                          "2B0", "2RESHARD", "4B0", "4RESHARD"}));
  // Window 3 holds all three stages from the start; a stage is resharded once no later action
  // needs it.
  EXPECT_EQ(AddUnshardReshard(actions, 3),
            ParseActions({"0UNSHARD", "2UNSHARD", "4UNSHARD", "0F0", "2F0", "4F0", "0B0",
                          "0RESHARD", "2B0", "2RESHARD", "4B0", "4RESHARD"}));
  // What is still active at the end is resharded in increasing stage order.
  EXPECT_EQ(AddUnshardReshard(ParseActions({"4F0", "2F0", "0F0"}), 3),
            ParseActions({"4UNSHARD", "2UNSHARD", "0UNSHARD", "4F0", "4RESHARD", "2F0", "2RESHARD",
                          "0F0", "0RESHARD"}));
  EXPECT_EQ(AddUnshardReshard(ParseActions({"4F0", "(2F0;0B0)OVERLAP_F_B"}), 3),
            ParseActions({"4UNSHARD", "2UNSHARD", "0UNSHARD", "4F0", "4RESHARD",
                          "(2F0;0B0)OVERLAP_F_B", "0RESHARD", "2RESHARD"}));
  EXPECT_TRUE(AddUnshardReshard({}, 3).empty());
}

// An OVERLAP_F_B contributes both stages at once, so it may widen the window by one (PyTorch).
TEST(AddUnshardReshard, OverlapAddsAllItsStages) {
  const RankActions actions = ParseActions({"0F0", "(3F0;0B0)OVERLAP_F_B", "5F0"});
  EXPECT_EQ(AddUnshardReshard(actions, 1),
            ParseActions({"0UNSHARD", "0F0", "3UNSHARD", "(3F0;0B0)OVERLAP_F_B", "0RESHARD",
                          "3RESHARD", "5UNSHARD", "5F0", "5RESHARD"}));
  EXPECT_EQ(AddUnshardReshard(actions, 2),
            ParseActions({"0UNSHARD", "3UNSHARD", "0F0", "(3F0;0B0)OVERLAP_F_B", "0RESHARD",
                          "3RESHARD", "5UNSHARD", "5F0", "5RESHARD"}));
}

TEST(MergeBackward, MergesOnlyAnIDirectlyFollowedByItsW) {
  const RankActions actions = ParseActions(
      {"1F0", "1I0", "", "1W0", "1I1", "0W1", "1W1", "1I2", "1W3", "1I3", "1W3", "1I4"});
  EXPECT_EQ(MergeBackward(actions),
            ParseActions({"1F0", "1B0", "1I1", "0W1", "1W1", "1I2", "1W3", "1B3", "1I4"}));
}

// The whole runtime lowering of each golden compute list gives its golden comms list, and lowering
// GPipe's pipeline_order (which already carries REDUCE_GRAD) equals lowering its raw list.
TEST(LowerSchedule, ReproducesGoldenCommsListsFromGoldenComputeLists) {
  int checked = 0;
  for (const testing::GoldenFile& g : testing::GoldenFiles(".comms.csv")) {
    SCOPED_TRACE(g.file);
    PipelineOrder compute = testing::LoadGoldenOrder(g.base + ".compute.csv");
    auto mapping = ValidateComputeSchedule(compute, g.ranks, g.num_stages(), g.microbatches);
    ASSERT_TRUE(mapping.ok()) << mapping.status();
    auto lowered = LowerSchedule(compute, *mapping, g.num_stages(), g.microbatches);
    ASSERT_TRUE(lowered.ok()) << lowered.status();
    EXPECT_EQ(FormatScheduleCsv(*lowered), testing::WithoutCR(testing::ReadGolden(g.file)));
    ++checked;
  }
  EXPECT_EQ(checked, 23);
  PipelineOrder raw = testing::LoadGoldenOrder("GPipe_r4_s1_m4.compute_raw.csv");
  PipelineOrder with_reduce = testing::LoadGoldenOrder("GPipe_r4_s1_m4.compute.csv");
  const std::vector<int> mapping = {0, 1, 2, 3};
  auto a = LowerSchedule(raw, mapping, 4, 4);
  auto b = LowerSchedule(with_reduce, mapping, 4, 4);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
  EXPECT_EQ(FormatScheduleCsv({(*a)[3]}),
            "3UNSHARD,3RECV_F0,3F0,3RECV_F1,3F1,3RECV_F2,3F2,3RECV_F3,3F3,3B0,3SEND_B0,3B1,"
            "3SEND_B1,3B2,3SEND_B2,3B3,3SEND_B3,3REDUCE_GRAD,3RESHARD\n");
  LoweringOptions no_fsdp;
  no_fsdp.max_active_stages = 0;
  auto plain = LowerSchedule(raw, mapping, 4, 4, no_fsdp);
  ASSERT_TRUE(plain.ok());
  for (const RankActions& actions : *plain) {
    for (const auto& action : actions) {
      EXPECT_NE(action->type, ActionType::kUnshard);
      EXPECT_NE(action->type, ActionType::kReshard);
    }
  }
}

// placement.unshard's two windows on one rank of three stages (Interleaved1F1B, 2 microbatches;
// compute order 0F0 1F0 2F0 2B0 0F1 1B0 1F1 0B0 2F1 2B1 1B1 0B1), action by action.
TEST(UnshardWindow, StepGathersEachStageOnceAndStageKeepsTwoAtATime) {
  EXPECT_EQ(UnshardWindow("step", 3), 3);
  EXPECT_EQ(UnshardWindow("stage", 3), 2);
  EXPECT_EQ(UnshardWindow("", 3), 0);
  ScheduleConfig config;
  config.kind = ScheduleKind::kInterleaved1F1B;
  config.num_ranks = 1;
  config.stages_per_rank = 3;
  config.num_microbatches = 2;
  auto lowered = [&](const std::string& unshard) {
    LoweringOptions options;
    options.max_active_stages = UnshardWindow(unshard, 3);
    auto built = BuildSchedule(config, options);  // validated as running on sharded parameters
    EXPECT_TRUE(built.ok()) << built.status();
    return built.ok() ? FormatScheduleCsv(built->lowered) : std::string();
  };
  // Every stage gathered before the first action, each released after its last.
  EXPECT_EQ(lowered("step"),
            "0UNSHARD,1UNSHARD,2UNSHARD,0F0,1F0,2F0,2B0,0F1,1B0,1F1,0B0,2F1,2B1,2REDUCE_GRAD,"
            "2RESHARD,1B1,1REDUCE_GRAD,1RESHARD,0B1,0REDUCE_GRAD,0RESHARD\n");
  // The current stage and the next other one: before 1F0 the window is {1, 2}, so stage 0 goes
  // and stage 2's gather starts while 1F0 computes; stage 0 comes back before 2F0 (the window
  // {2, 0} of 2F0 2B0 0F1), and so on: 9 all-gathers instead of 3.
  EXPECT_EQ(lowered("stage"),
            "0UNSHARD,1UNSHARD,0F0,0RESHARD,2UNSHARD,1F0,1RESHARD,0UNSHARD,2F0,2B0,2RESHARD,"
            "1UNSHARD,0F1,1B0,1F1,1RESHARD,2UNSHARD,0B0,0RESHARD,1UNSHARD,2F1,2B1,2REDUCE_GRAD,"
            "2RESHARD,0UNSHARD,1B1,1REDUCE_GRAD,1RESHARD,0B1,0REDUCE_GRAD,0RESHARD\n");
}

// The two sendrecv_only files are the compute list passed through the send/recv pass alone.
TEST(AddSendRecv, MatchesSendRecvOnlyGolden) {
  int checked = 0;
  for (const testing::GoldenFile& g : testing::GoldenFiles(".sendrecv_only.csv")) {
    SCOPED_TRACE(g.file);
    PipelineOrder compute = testing::LoadGoldenOrder(g.base + ".compute.csv");
    auto mapping = ValidateComputeSchedule(compute, g.ranks, g.num_stages(), g.microbatches);
    ASSERT_TRUE(mapping.ok()) << mapping.status();
    auto lowered = AddSendRecv(compute, *mapping, g.num_stages());
    ASSERT_TRUE(lowered.ok()) << lowered.status();
    EXPECT_EQ(FormatScheduleCsv(*lowered), testing::WithoutCR(testing::ReadGolden(g.file)));
    ++checked;
  }
  EXPECT_EQ(checked, 2);
}

// Idle slots do not take a turn in the round-robin: the result depends only on each rank's order
// of actions (as in PyTorch's runtime, whose earlier passes drop them).
TEST(AddSendRecv, IdleSlotsAreIgnored) {
  for (const char* base : {"Interleaved1F1B_r4_s2_m8", "ZBVZeroBubble_r4_s2_m8"}) {
    SCOPED_TRACE(base);
    PipelineOrder compute = testing::LoadGoldenOrder(std::string(base) + ".compute.csv");
    auto mapping = ValidateComputeSchedule(compute, 4, 8, 8);
    ASSERT_TRUE(mapping.ok()) << mapping.status();
    PipelineOrder packed = Filter(compute, [](const Action&) { return true; });
    ASSERT_NE(packed, compute);
    auto from_packed = AddSendRecv(packed, *mapping, 8);
    auto from_aligned = AddSendRecv(compute, *mapping, 8);
    ASSERT_TRUE(from_packed.ok()) << from_packed.status();
    ASSERT_TRUE(from_aligned.ok()) << from_aligned.status();
    EXPECT_EQ(*from_packed, *from_aligned);
  }
  PipelineOrder spaced = {ParseActions({"", "", "0F0", "", "0B0"}),
                          ParseActions({"1F0", "", "1B0", ""})};
  auto lowered = AddSendRecv(spaced, {0, 1}, 2);
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  EXPECT_EQ(FormatScheduleCsv(*lowered), "0F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n");
}

// Every runtime-lowered golden list: its own non-comm actions, run through the pass, give it back.
// This covers UNSHARD/RESHARD/REDUCE_GRAD pass-through, V placement and OVERLAP_F_B.
TEST(AddSendRecv, ReproducesEveryGoldenCommsList) {
  int checked = 0;
  for (const testing::GoldenFile& g : testing::GoldenFiles(".comms.csv")) {
    SCOPED_TRACE(g.file);
    PipelineOrder comms = testing::LoadGoldenOrder(g.file);
    auto mapping = ValidateComputeSchedule(testing::LoadGoldenOrder(g.base + ".compute.csv"),
                                           g.ranks, g.num_stages(), g.microbatches);
    ASSERT_TRUE(mapping.ok()) << mapping.status();
    PipelineOrder input = Filter(comms, [](const Action& a) { return !IsSendOrRecv(a.type); });
    auto lowered = AddSendRecv(input, *mapping, g.num_stages());
    ASSERT_TRUE(lowered.ok()) << lowered.status();
    EXPECT_EQ(FormatScheduleCsv(*lowered), testing::WithoutCR(testing::ReadGolden(g.file)));
    ++checked;
  }
  EXPECT_EQ(checked, 23);
}

TEST(AddSendRecv, GPipeAndOneFOneBLowerToValidSchedules) {
  int checked = 0;
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B}) {
    for (int ranks = 1; ranks <= 8; ++ranks) {
      for (int mbs = 1; mbs <= 16; ++mbs) {
        if (kind == ScheduleKind::k1F1B && mbs < ranks) continue;
        SCOPED_TRACE(absl::StrCat(ScheduleKindName(kind), " ranks=", ranks, " mbs=", mbs));
        ScheduleConfig config;
        config.kind = kind;
        config.num_ranks = ranks;
        config.num_microbatches = mbs;
        auto compute = GenerateSchedule(config);
        ASSERT_TRUE(compute.ok()) << compute.status();
        std::vector<int> mapping = *StageToRank(ranks, ranks, MappingStyle::kLoop);
        auto lowered = AddSendRecv(*compute, mapping, ranks);
        ASSERT_TRUE(lowered.ok()) << lowered.status();
        absl::Status valid = ValidateLoweredSchedule(*lowered, mapping, ranks, mbs);
        ASSERT_TRUE(valid.ok()) << valid;
        // Each boundary carries one activation and one gradient per microbatch, both ways.
        int sends = 0, recvs = 0;
        for (const RankActions& actions : *lowered) {
          for (const auto& a : actions) {
            sends += a->type == ActionType::kSendF || a->type == ActionType::kSendB;
            recvs += a->type == ActionType::kRecvF || a->type == ActionType::kRecvB;
          }
        }
        EXPECT_EQ(sends, 2 * (ranks - 1) * mbs);
        EXPECT_EQ(recvs, sends);
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 128 + 100);
}

TEST(AddSendRecv, HandMadeTwoRankList) {
  PipelineOrder compute = {ParseActions({"0F0", "0F1", "0B0", "0B1"}),
                           ParseActions({"1F0", "1B0", "1F1", "1B1"})};
  auto lowered = AddSendRecv(compute, {0, 1}, 2);
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  EXPECT_EQ(FormatScheduleCsv(*lowered),
            "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1\n"
            "1RECV_F0,1F0,1RECV_F1,1B0,1SEND_B0,1F1,1B1,1SEND_B1\n");
}

TEST(AddSendRecv, SameRankStagesExchangeNothing) {
  // One rank holding both stages: no comms at all, local readiness suffices.
  PipelineOrder compute = {ParseActions({"0F0", "1F0", "1B0", "0B0"})};
  auto lowered = AddSendRecv(compute, {0, 0}, 2);
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  EXPECT_EQ(*lowered, compute);
}

TEST(AddSendRecv, NoProgressNamesEachStuckHead) {
  PipelineOrder compute = {ParseActions({"0B0", "0F0"}), ParseActions({"1F0", "1B0"}), {}};
  auto lowered = AddSendRecv(compute, {0, 1}, 2);
  ASSERT_FALSE(lowered.ok());
  EXPECT_EQ(lowered.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(lowered.status().message());
  EXPECT_THAT(message, HasSubstr("can't schedule sends/recvs"));
  EXPECT_THAT(message, HasSubstr("rank 0 is stuck at step 0 on 0B0: 0B0 needs 0RECV_B0"));
  EXPECT_THAT(message, HasSubstr("rank 1 is stuck at step 0 on 1F0: 1F0 needs 1RECV_F0"));
  EXPECT_THAT(message, HasSubstr("rank 2 has finished"));
}

TEST(AddSendRecv, RejectsInconsistentInputs) {
  PipelineOrder compute = {ParseActions({"0F0", "0B0"}), ParseActions({"1F0", "1B0"})};
  EXPECT_THAT(std::string(AddSendRecv(compute, {0}, 2).status().message()),
              HasSubstr("stage_to_rank has 1 entries"));
  EXPECT_THAT(std::string(AddSendRecv(compute, {0, 2}, 2).status().message()),
              HasSubstr("stage 1 is mapped to rank 2, but the schedule has 2 ranks"));
  EXPECT_THAT(
      std::string(AddSendRecv(compute, {1, 0}, 2).status().message()),
      HasSubstr("rank 0, step 0: action 0F0 is on rank 0, but stage 0 is mapped to rank 1"));
  PipelineOrder out_of_range = {ParseActions({"0F0", "5B0"}), ParseActions({"1F0", "1B0"})};
  EXPECT_THAT(std::string(AddSendRecv(out_of_range, {0, 1}, 2).status().message()),
              HasSubstr("rank 0, step 1: action 5B0 names stage 5"));
}

}  // namespace
}  // namespace stagecoach::schedule::schedule_lowering_test
