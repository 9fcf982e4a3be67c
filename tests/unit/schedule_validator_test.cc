// Validator and grid against PyTorch's _validate_schedule / _format_pipeline_order output, and
// one hand-broken schedule per rule.
#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/schedule/csv.h"
#include "common/schedule/generators.h"
#include "common/schedule/lowering.h"
#include "common/schedule/validator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/golden.h"
#include "tests/support/test_paths.h"

namespace stagecoach::schedule::schedule_validator_test {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

using testing::ParseActions;

std::string FirstLine(absl::string_view text) {
  return std::string(text.substr(0, text.find('\n')));
}

// Expects INVALID_ARGUMENT whose first line is `first_line` and whose grid marks `step`.
void ExpectStepError(const absl::Status& status, const std::string& first_line, int step) {
  ASSERT_FALSE(status.ok()) << "expected: " << first_line;
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  const std::string message(status.message());
  EXPECT_EQ(FirstLine(message), first_line);
  EXPECT_THAT(message, HasSubstr("\n\nFull pipeline schedule:\n"));
  const size_t marker = message.find(" <-- ERROR HERE");
  ASSERT_NE(marker, std::string::npos);
  EXPECT_EQ(message.find(" <-- ERROR HERE", marker + 1), std::string::npos);
  const std::string line = message.substr(message.rfind('\n', marker) + 1);
  ASSERT_THAT(line, StartsWith("Step "));
  EXPECT_EQ(std::stoi(line.substr(5, line.find(':') - 5)), step) << line;
}

// ---------------------------------------------------------------------------------------------
// PyTorch parity.

TEST(FormatGrid, MatchesEveryGoldenGrid) {
  int checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator(testing::GoldenDir())) {
    const std::string file = entry.path().filename().string();
    const std::string suffix = ".grid.txt";
    if (file.size() < suffix.size() || file.substr(file.size() - suffix.size()) != suffix) continue;
    SCOPED_TRACE(file);
    std::string base = file.substr(0, file.size() - suffix.size());
    std::string csv;
    if (base.size() > 4 && base.substr(base.size() - 4) == ".raw") {
      csv = base.substr(0, base.size() - 4) + ".compute_raw.csv";
    } else if (std::filesystem::exists(testing::GoldenDir() + "/" + base + ".csv")) {
      csv = base + ".csv";  // X.comms.grid.txt, X.sim.grid.txt
    } else {
      csv = base + ".compute.csv";
    }
    std::string grid = FormatGrid(testing::LoadGoldenOrder(csv));
    EXPECT_EQ(grid.back(), '\n');
    EXPECT_EQ(testing::Normalized(grid), testing::Normalized(testing::ReadGolden(file)));
    ++checked;
  }
  EXPECT_EQ(checked, 7);
}

TEST(FormatGrid, ColumnWidthIsLongestActionOrStepLabel) {
  // Rank 0's column is as wide as its overlap (22); rank 1's as "Step 0" (6), not "Rank 1".
  PipelineOrder order = {ParseActions({"0F0", "", "(0F10;3B11)OVERLAP_F_B"}),
                         ParseActions({"", "1F0"})};
  const std::string header = std::string(8, ' ') + "Rank 0" + std::string(17, ' ') + "Rank 1\n";
  const std::string row0 = "Step 0: 0F0" + std::string(19 + 1 + 6, ' ');
  const std::string row1 = "Step 1: " + std::string(22 + 1, ' ') + "1F0   ";
  const std::string row2 = "Step 2: (0F10;3B11)OVERLAP_F_B" + std::string(1 + 6, ' ');
  EXPECT_EQ(FormatGrid(order), header + row0 + "\n" + row1 + "\n" + row2 + "\n");
  EXPECT_EQ(FormatGrid(order, 1), header + row0 + "\n" + row1 + " <-- ERROR HERE\n" + row2 + "\n");
  EXPECT_EQ(FormatGrid({{}, {}}), "        Rank 0 Rank 1\n");
  // 10 steps: labels "Step 0".."Step 9"; 11 steps: "Step 00".."Step 10".
  PipelineOrder ten = {RankActions(10)};
  EXPECT_THAT(FormatGrid(ten), HasSubstr("\nStep 9: "));
  PipelineOrder eleven = {RankActions(11)};
  EXPECT_THAT(FormatGrid(eleven), HasSubstr("\nStep 00: "));
  EXPECT_THAT(FormatGrid(eleven), HasSubstr("\nStep 10: "));
}

TEST(ValidateComputeSchedule, ReproducesPyTorchErrorOnItsRaw1F1BList) {
  PipelineOrder raw = testing::LoadGoldenOrder("1F1B_r4_s1_m8.compute_raw.csv");
  auto result = ValidateComputeSchedule(raw, 4, 4, 8);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string want = testing::ReadGolden("1F1B_r4_s1_m8.raw.validate_error.txt");
  EXPECT_EQ(FirstLine(result.status().message()),
            "Rank 3, step 4: Running Full Backward for stage 3, microbatch 0 without first "
            "running Forward");
  EXPECT_EQ(testing::Normalized(std::string(result.status().message())), testing::Normalized(want));
}

TEST(ValidateComputeSchedule, EveryGoldenComputeListValidatesExceptPyTorch1F1B) {
  int valid = 0, defective = 0;
  for (const char* suffix : {".compute.csv", ".compute_raw.csv", ".merge_bw.csv"}) {
    for (const testing::GoldenFile& g : testing::GoldenFiles(suffix)) {
      SCOPED_TRACE(g.file);
      auto mapping = ValidateComputeSchedule(testing::LoadGoldenOrder(g.file), g.ranks,
                                             g.num_stages(), g.microbatches);
      if (g.schedule == "1F1B") {
        // PyTorch's last rank runs F1..Fm: its B0 comes without an F0.
        ASSERT_FALSE(mapping.ok());
        EXPECT_THAT(FirstLine(mapping.status().message()),
                    ::testing::MatchesRegex(absl::StrCat(
                        "Rank ", g.ranks - 1, ", step [0-9]+: Running Full Backward for stage ",
                        g.ranks - 1, ", microbatch 0 without first running Forward")));
        ++defective;
        continue;
      }
      ASSERT_TRUE(mapping.ok()) << mapping.status();
      const bool v = g.schedule == "ZBVZeroBubble" || g.schedule == "DualPipeV";
      EXPECT_EQ(*mapping,
                *StageToRank(g.num_stages(), g.ranks, v ? MappingStyle::kV : MappingStyle::kLoop));
      ++valid;
    }
  }
  EXPECT_EQ(defective, 10);
  EXPECT_EQ(valid, 28 + 5 + 14);
}

TEST(ValidateLoweredSchedule, EveryGoldenLoweredListValidates) {
  int checked = 0;
  for (const char* suffix : {".comms.csv", ".sendrecv_only.csv", ".sim.csv"}) {
    for (const testing::GoldenFile& g : testing::GoldenFiles(suffix)) {
      SCOPED_TRACE(g.file);
      const bool v = g.schedule == "ZBVZeroBubble" || g.schedule == "DualPipeV";
      std::vector<int> mapping =
          *StageToRank(g.num_stages(), g.ranks, v ? MappingStyle::kV : MappingStyle::kLoop);
      absl::Status status = ValidateLoweredSchedule(testing::LoadGoldenOrder(g.file), mapping,
                                                    g.num_stages(), g.microbatches);
      EXPECT_TRUE(status.ok()) << status;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 23 + 2 + 2);
}

// ---------------------------------------------------------------------------------------------
// Compute rules, one broken schedule each.

// A valid 2-rank, 2-stage, 2-microbatch schedule; tests break one thing at a time.
PipelineOrder Good() {
  return {ParseActions({"0F0", "0F1", "", "", "0B0", "0B1"}),
          ParseActions({"", "1F0", "1B0", "1F1", "1B1"})};
}

TEST(ValidateComputeSchedule, AcceptsAndInfersMapping) {
  auto mapping = ValidateComputeSchedule(Good(), 2, 2, 2);
  ASSERT_TRUE(mapping.ok()) << mapping.status();
  EXPECT_EQ(*mapping, (std::vector<int>{0, 1}));
  // Stages placed the other way round are fine too; the map says where they are.
  PipelineOrder swapped = {Good()[1], Good()[0]};
  EXPECT_EQ(*ValidateComputeSchedule(swapped, 2, 2, 2), (std::vector<int>{1, 0}));
}

TEST(ValidateComputeSchedule, RankCount) {
  auto result = ValidateComputeSchedule(Good(), 3, 2, 2);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(FirstLine(result.status().message()),
            "Schedule has incorrect number of ranks - expected 3, actual 2");
}

TEST(ValidateComputeSchedule, BackwardBeforeForward) {
  PipelineOrder order = Good();
  order[1] = ParseActions({"", "1B0", "1F0", "1F1", "1B1"});
  ExpectStepError(ValidateComputeSchedule(order, 2, 2, 2).status(),
                  "Rank 1, step 1: Running Full Backward for stage 1, microbatch 0 without first "
                  "running Forward",
                  1);
}

TEST(ValidateComputeSchedule, InputBackwardBeforeForwardAndWeightBeforeInput) {
  PipelineOrder order = {ParseActions({"0F0", "0I0", "0W0"}), ParseActions({"1I0", "1F0", "1W0"})};
  ExpectStepError(ValidateComputeSchedule(order, 2, 2, 1).status(),
                  "Rank 1, step 0: Running Backward Input for stage 1, microbatch 0 without first "
                  "running Forward",
                  0);
  order = {ParseActions({"0F0", "0W0", "0I0"}), ParseActions({"1F0", "1I0", "1W0"})};
  ExpectStepError(ValidateComputeSchedule(order, 2, 2, 1).status(),
                  "Rank 0, step 1: Running Backward Weight for stage 0, microbatch 0 without first "
                  "running Backward Input",
                  1);
}

TEST(ValidateComputeSchedule, OverlapSubActionsAreCheckedOneByOne) {
  // The B1 inside the overlap has no F1 before it; the F0 beside it is fine.
  PipelineOrder order = {
      ParseActions({"0F0", "(1F0;1B1)OVERLAP_F_B", "1F1", "1B0", "0B0", "0F1", "0B1"})};
  ExpectStepError(ValidateComputeSchedule(order, 1, 2, 2).status(),
                  "Rank 0, step 1: Running Full Backward for stage 1, microbatch 1 without first "
                  "running Forward",
                  1);
  order = {ParseActions({"0F0", "(0F1;0SEND_F0)OVERLAP_F_B", "0B0", "0B1"})};
  ExpectStepError(ValidateComputeSchedule(order, 1, 1, 2).status(),
                  "Rank 0, step 1: (0F1;0SEND_F0)OVERLAP_F_B overlaps 0SEND_F0; OVERLAP_F_B may "
                  "only contain F, I, B and W",
                  1);
}

TEST(ValidateComputeSchedule, StageOnTwoRanks) {
  PipelineOrder order = {ParseActions({"0F0", "1F0"}), ParseActions({"1B0", "0B0"})};
  ExpectStepError(ValidateComputeSchedule(order, 2, 2, 1).status(),
                  "Rank 1, step 0: Stage 1 is assigned to both rank 1 and rank 0 (1B0)", 0);
}

TEST(ValidateComputeSchedule, IndicesInRange) {
  PipelineOrder order = Good();
  order[1][3] = *ParseAction("1F2");
  ExpectStepError(ValidateComputeSchedule(order, 2, 2, 2).status(),
                  "Rank 1, step 3: action 1F2 names microbatch 2, outside [0, 2)", 3);
  order = Good();
  order[0][1] = *ParseAction("2F1");
  ExpectStepError(ValidateComputeSchedule(order, 2, 2, 2).status(),
                  "Rank 0, step 1: action 2F1 names stage 2, outside [0, 2)", 1);
}

TEST(ValidateComputeSchedule, ForwardCount) {
  PipelineOrder order = {ParseActions({"0F0", "0B0"}), ParseActions({"1F0", "1B0"})};
  auto result = ValidateComputeSchedule(order, 2, 2, 2);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(FirstLine(result.status().message()), "Got 1 F microbatches for stage 0, expected 2");
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("Full pipeline schedule:\n"));
}

TEST(ValidateComputeSchedule, BackwardCounts) {
  PipelineOrder order = {ParseActions({"0F0", "0F1", "0I0", "0I1", "0W0"})};
  auto result = ValidateComputeSchedule(order, 1, 1, 2);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(FirstLine(result.status().message()),
            "Invalid backward microbatches for stage 0: I and W must have equal counts, but got "
            "I=2, W=1");
  order = {ParseActions({"0F0", "0F1", "0B0"})};
  result = ValidateComputeSchedule(order, 1, 1, 2);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(FirstLine(result.status().message()),
            "Invalid backward microbatches for stage 0: expected 2 total backwards, but got B=1, "
            "I=0, W=0");
}

TEST(ValidateComputeSchedule, StricterThanPyTorch) {
  PipelineOrder order = {ParseActions({"0F0", "0F0", "0B0"})};
  ExpectStepError(ValidateComputeSchedule(order, 1, 1, 1).status(),
                  "Rank 0, step 1: Forward for stage 0, microbatch 0 (0F0) runs a second time", 1);
  order = {ParseActions({"0F0", "0F1", "0I0", "0B0", "0W0", "0B1"})};
  ExpectStepError(ValidateComputeSchedule(order, 1, 1, 2).status(),
                  "Rank 0, step 3: Full Backward for stage 0, microbatch 0 (0B0) after its "
                  "Backward Input already ran",
                  3);
  order = {ParseActions({"0F0", "0F1", "0B0", "0REDUCE_GRAD", "0B1"})};
  ExpectStepError(ValidateComputeSchedule(order, 1, 1, 2).status(),
                  "Rank 0, step 3: 0REDUCE_GRAD runs before the last backward of stage 0 (1 of "
                  "2 B/W done)",
                  3);
  order = {ParseActions({"0F0", "0B0", "0REDUCE_GRAD", "0REDUCE_GRAD"})};
  ExpectStepError(ValidateComputeSchedule(order, 1, 1, 1).status(),
                  "Rank 0, step 3: 0REDUCE_GRAD runs a second time for stage 0", 3);
  order = {ParseActions({"0F0", "0SEND_F0", "0B0"})};
  ExpectStepError(ValidateComputeSchedule(order, 1, 1, 1).status(),
                  "Rank 0, step 1: communication action 0SEND_F0 in a compute schedule (validate "
                  "lowered schedules with ValidateLoweredSchedule)",
                  1);
  // UNSHARD/RESHARD/REDUCE_GRAD in their places are fine.
  order = {ParseActions({"0UNSHARD", "0F0", "0B0", "0REDUCE_GRAD", "0RESHARD"})};
  EXPECT_TRUE(ValidateComputeSchedule(order, 1, 1, 1).ok());
}

TEST(ValidateComputeSchedule, RejectsBadCounts) {
  EXPECT_FALSE(ValidateComputeSchedule(Good(), 0, 2, 2).ok());
  EXPECT_FALSE(ValidateComputeSchedule(Good(), 2, 0, 2).ok());
  EXPECT_FALSE(ValidateComputeSchedule(Good(), 2, 2, 0).ok());
}

// ---------------------------------------------------------------------------------------------
// Lowered rules.

// GPipe on 2 ranks, 2 microbatches, lowered:
//   rank 0: 0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1,0REDUCE_GRAD
//   rank 1: 1RECV_F0,1F0,1RECV_F1,1F1,1B0,1SEND_B0,1B1,1SEND_B1,1REDUCE_GRAD
PipelineOrder Lowered() {
  ScheduleConfig config;
  config.kind = ScheduleKind::kGPipe;
  config.num_ranks = 2;
  config.num_microbatches = 2;
  return *AddSendRecv(*GenerateSchedule(config), {0, 1}, 2);
}

TEST(ValidateLoweredSchedule, AcceptsLoweredGPipe) {
  PipelineOrder lowered = Lowered();
  EXPECT_EQ(FormatScheduleCsv(lowered),
            "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1,0REDUCE_GRAD\n"
            "1RECV_F0,1F0,1RECV_F1,1F1,1B0,1SEND_B0,1B1,1SEND_B1,1REDUCE_GRAD\n");
  EXPECT_TRUE(ValidateLoweredSchedule(lowered, {0, 1}, 2, 2).ok());
}

// Lowered() with each rank's stage gathered before its first action and released after its last.
PipelineOrder ShardedLowered() {
  PipelineOrder lowered = Lowered();
  for (int r = 0; r < 2; ++r) {
    lowered[r].insert(lowered[r].begin(), Action::Make(r, ActionType::kUnshard));
    lowered[r].push_back(Action::Make(r, ActionType::kReshard));
  }
  return lowered;
}

TEST(ValidateLoweredSchedule, ShardedParametersAreGatheredAroundEveryComputeAction) {
  ValidationOptions sharded;
  sharded.sharded_parameters = true;
  EXPECT_TRUE(ValidateLoweredSchedule(ShardedLowered(), {0, 1}, 2, 2, sharded).ok());
  // Unsharded stages take any UNSHARD/RESHARD, or none.
  EXPECT_TRUE(ValidateLoweredSchedule(Lowered(), {0, 1}, 2, 2).ok());
  PipelineOrder unpaired = ShardedLowered();
  unpaired[0].pop_back();
  EXPECT_TRUE(ValidateLoweredSchedule(unpaired, {0, 1}, 2, 2).ok());

  ExpectStepError(ValidateLoweredSchedule(Lowered(), {0, 1}, 2, 2, sharded),
                  "Rank 0, step 0: 0F0 runs while stage 0's parameters are sharded (no UNSHARD "
                  "before it since the stage's last RESHARD)",
                  0);
  // Released between the forwards and the backwards: 0UNSHARD,0F0,0SEND_F0,0F1,0RESHARD,...
  PipelineOrder early = ShardedLowered();
  early[0].insert(early[0].begin() + 4, Action::Make(0, ActionType::kReshard));
  ExpectStepError(ValidateLoweredSchedule(early, {0, 1}, 2, 2, sharded),
                  "Rank 0, step 7: 0B0 runs while stage 0's parameters are sharded (no UNSHARD "
                  "before it since the stage's last RESHARD)",
                  7);
  PipelineOrder twice = ShardedLowered();
  twice[1].insert(twice[1].begin() + 1, Action::Make(1, ActionType::kUnshard));
  ExpectStepError(ValidateLoweredSchedule(twice, {0, 1}, 2, 2, sharded),
                  "Rank 1, step 1: 1UNSHARD: stage 1's parameters are gathered already (UNSHARD "
                  "twice without a RESHARD)",
                  1);
  PipelineOrder released = ShardedLowered();
  released[1].insert(released[1].begin(), Action::Make(1, ActionType::kReshard));
  ExpectStepError(ValidateLoweredSchedule(released, {0, 1}, 2, 2, sharded),
                  "Rank 1, step 0: 1RESHARD: stage 1's parameters are not gathered (RESHARD "
                  "without an UNSHARD)",
                  0);
  const absl::Status kept = ValidateLoweredSchedule(unpaired, {0, 1}, 2, 2, sharded);
  ASSERT_FALSE(kept.ok());
  EXPECT_THAT(std::string(kept.message()),
              HasSubstr("Stage 0's parameters are still gathered at the end of the step (no "
                        "RESHARD after its last UNSHARD)"));
}

TEST(ValidateLoweredSchedule, ComputeRulesStillApply) {
  PipelineOrder lowered = Lowered();
  lowered[1].erase(lowered[1].begin() + 8);  // 1REDUCE_GRAD
  lowered[1].erase(lowered[1].begin() + 4);  // 1B0
  auto status = ValidateLoweredSchedule(lowered, {0, 1}, 2, 2);
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(std::string(status.message()), HasSubstr("expected 2 total backwards, but got B=1"));
}

TEST(ValidateLoweredSchedule, ActionsMustRunWhereTheMapSays) {
  ExpectStepError(ValidateLoweredSchedule(Lowered(), {1, 0}, 2, 2),
                  "Rank 0, step 0: action 0F0 of stage 0 is on rank 0, but stage_to_rank maps "
                  "stage 0 to rank 1",
                  0);
  EXPECT_THAT(std::string(ValidateLoweredSchedule(Lowered(), {0}, 2, 2).message()),
              HasSubstr("stage_to_rank has 1 entries"));
  EXPECT_THAT(std::string(ValidateLoweredSchedule(Lowered(), {0, 5}, 2, 2).message()),
              HasSubstr("stage 1 is mapped to rank 5, but the schedule has 2 ranks"));
}

TEST(ValidateLoweredSchedule, ConsumerNeedsItsRecvFirst) {
  PipelineOrder lowered = Lowered();
  std::swap(lowered[1][0], lowered[1][1]);  // 1F0 before 1RECV_F0
  ExpectStepError(ValidateLoweredSchedule(lowered, {0, 1}, 2, 2),
                  "Rank 1, step 0: 1F0 consumes the output of stage 0 on rank 0 but does not come "
                  "after its 1RECV_F0 on this rank",
                  0);
  lowered = Lowered();
  lowered[0].erase(lowered[0].begin() + 6);  // 0RECV_B1
  ExpectStepError(ValidateLoweredSchedule(lowered, {0, 1}, 2, 2),
                  "Rank 0, step 6: 0B1 consumes the input gradient of stage 1 on rank 1 but does "
                  "not come after its 0RECV_B1 on this rank",
                  6);
}

TEST(ValidateLoweredSchedule, SendComesAfterItsProducer) {
  PipelineOrder lowered = Lowered();
  std::swap(lowered[0][0], lowered[0][1]);  // 0SEND_F0 before 0F0
  ExpectStepError(ValidateLoweredSchedule(lowered, {0, 1}, 2, 2),
                  "Rank 0, step 0: 0SEND_F0 comes before 0F0, which produces what it sends", 0);
  lowered = Lowered();
  std::swap(lowered[1][4], lowered[1][5]);  // 1SEND_B0 before 1B0
  ExpectStepError(ValidateLoweredSchedule(lowered, {0, 1}, 2, 2),
                  "Rank 1, step 4: 1SEND_B0 comes before 1I0 or 1B0, which produces what it sends",
                  4);
}

TEST(ValidateLoweredSchedule, SendsAndRecvsPairOneToOne) {
  PipelineOrder lowered = Lowered();
  lowered[0].erase(lowered[0].begin() + 3);  // 0SEND_F1
  ExpectStepError(ValidateLoweredSchedule(lowered, {0, 1}, 2, 2),
                  "Rank 1, step 2: 1RECV_F1 has no matching 0SEND_F1 on rank 0", 2);
  lowered = Lowered();
  lowered[1].erase(lowered[1].begin() + 7);  // 1SEND_B1
  ExpectStepError(ValidateLoweredSchedule(lowered, {0, 1}, 2, 2),
                  "Rank 0, step 6: 0RECV_B1 has no matching 1SEND_B1 on rank 1", 6);
  lowered = Lowered();
  lowered[1].insert(lowered[1].begin() + 1, *ParseAction("1RECV_F0"));  // twice
  ExpectStepError(ValidateLoweredSchedule(lowered, {0, 1}, 2, 2),
                  "Rank 1, step 1: 1RECV_F0 appears twice; each send and receive must appear "
                  "once",
                  1);
  lowered = Lowered();
  lowered[0].push_back(*ParseAction("0SEND_F1"));  // a second send for one receive
  ExpectStepError(ValidateLoweredSchedule(lowered, {0, 1}, 2, 2),
                  "Rank 0, step 9: 0SEND_F1 appears twice; each send and receive must appear "
                  "once",
                  9);
}

TEST(ValidateLoweredSchedule, NoCommsBetweenStagesOnOneRank) {
  PipelineOrder lowered = {ParseActions({"0F0", "0SEND_F0", "1RECV_F0", "1F0", "1B0", "0B0"})};
  ExpectStepError(ValidateLoweredSchedule(lowered, {0, 0}, 2, 1),
                  "Rank 0, step 1: 0SEND_F0: stages 0 and 1 are both on rank 0, which exchange "
                  "tensors without send/recv",
                  1);
  lowered = {ParseActions({"0F0", "1F0", "1B0", "0B0"})};
  EXPECT_TRUE(ValidateLoweredSchedule(lowered, {0, 0}, 2, 1).ok());
  lowered = {ParseActions({"0F0", "0SEND_F0", "0B0"}), ParseActions({})};
  ExpectStepError(ValidateLoweredSchedule(lowered, {0}, 1, 1),
                  "Rank 0, step 1: 0SEND_F0 sends a forward output from the last stage", 1);
}

TEST(ValidateLoweredSchedule, DetectsCyclicWait) {
  // Rank 0 sends its activation only after its backward, which needs rank 1's gradient, which
  // needs that activation.
  PipelineOrder lowered = {ParseActions({"0F0", "0RECV_B0", "0B0", "0SEND_F0"}),
                           ParseActions({"1RECV_F0", "1F0", "1B0", "1SEND_B0"}), ParseActions({})};
  absl::Status status = ValidateLoweredSchedule(lowered, {0, 1}, 2, 1);
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FirstLine(status.message()),
            "deadlock: no rank can progress; rank 0 is blocked at step 2 on 0B0, waiting for "
            "1SEND_B0 from rank 1; rank 1 is blocked at step 1 on 1F0, waiting for 0SEND_F0 from "
            "rank 0; rank 2 has finished");
  // Same lists with the send moved up: fine.
  std::swap(lowered[0][3], lowered[0][1]);
  std::swap(lowered[0][2], lowered[0][3]);
  EXPECT_EQ(FormatScheduleCsv(lowered), "0F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n\n");
  EXPECT_TRUE(ValidateLoweredSchedule(lowered, {0, 1}, 2, 1).ok());
}

TEST(ValidateLoweredSchedule, DetectsLocalProducerComingLater) {
  PipelineOrder lowered = {ParseActions({"1F0", "0F0", "1B0", "0B0"})};
  absl::Status status = ValidateLoweredSchedule(lowered, {0, 0}, 2, 1);
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(FirstLine(status.message()),
            "deadlock: no rank can progress; rank 0 is blocked at step 0 on 1F0, waiting for 0F0 "
            "on this rank");
}

}  // namespace
}  // namespace stagecoach::schedule::schedule_validator_test
