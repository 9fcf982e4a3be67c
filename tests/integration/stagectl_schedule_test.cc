// `stagectl schedule`, run as a process with no cluster: its CSV output is PyTorch's files byte
// for byte (LF for CRLF), it reads PyTorch's files back, and its errors and exit codes are clear.
// Also `stagectl --help`: it shows examples of the first commands people use.
#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/support/golden.h"
#include "tests/support/process.h"
#include "tests/support/test_paths.h"

namespace stagecoach::testing::stagectl_schedule_test {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

CommandResult Stagectl(std::vector<std::string> args) {
  args.insert(args.begin(), BinaryDir() + "/client/stagectl");
  return RunCommand(args, absl::Seconds(30));
}

std::vector<std::string> GenerateArgs(const GoldenFile& g) {
  return {"schedule",
          "--kind",
          g.schedule,
          "--ranks",
          std::to_string(g.ranks),
          "--microbatches",
          std::to_string(g.microbatches),
          "--stages-per-rank",
          std::to_string(g.stages_per_rank),
          "--format",
          "csv"};
}

TEST(StagectlHelp, ShowsExamplesOfTheFirstCommands) {
  CommandResult r = Stagectl({"--help"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  for (const std::string command : {"workers", "plan", "submit", "watch", "status"}) {
    EXPECT_THAT(r.out, HasSubstr("  stagectl " + command + " ")) << r.out;
  }
}

// The 1F1B files carry PyTorch's defective last rank (ScheduleKind::k1F1B); every other
// compute file is printed exactly.
TEST(StagectlSchedule, CsvOutputIsPyTorchsComputeAndCommsFiles) {
  int checked = 0;
  for (const char* suffix : {".compute.csv", ".compute_raw.csv", ".comms.csv"}) {
    for (const GoldenFile& g : GoldenFiles(suffix)) {
      if (g.schedule == "1F1B") continue;
      SCOPED_TRACE(g.file);
      std::vector<std::string> args = GenerateArgs(g);
      if (std::string(suffix) == ".comms.csv") args.push_back("--lowered");
      if (std::string(suffix) == ".compute_raw.csv") args.push_back("--time-aligned");
      CommandResult r = Stagectl(args);
      ASSERT_EQ(r.exit_code, 0) << r.err;
      EXPECT_EQ(r.out, WithoutCR(ReadGolden(g.file)));
      EXPECT_EQ(r.err, "");
      ++checked;
    }
  }
  EXPECT_EQ(checked, (33 - 5) + (10 - 5) + 23);
}

TEST(StagectlSchedule, GridIsPyTorchsGrid) {
  CommandResult r =
      Stagectl({"schedule", "--kind", "interleaved1f1b", "--ranks", "4", "--microbatches", "8"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "Interleaved1F1B: 4 ranks x 2 stages, 8 microbatches\n" +
                       Normalized(ReadGolden("Interleaved1F1B_r4_s2_m8.grid.txt")) + "\n");
}

TEST(StagectlSchedule, ValidatesUsersFilesInBothFormats) {
  for (const GoldenFile& g : GoldenFiles(".comms.csv")) {
    SCOPED_TRACE(g.file);
    const std::string comms = GoldenDir() + "/" + g.file;
    CommandResult lowered =
        Stagectl({"schedule", "--csv", comms, "--format", "compute_comms", "--validate"});
    ASSERT_EQ(lowered.exit_code, 0) << lowered.err;
    EXPECT_THAT(lowered.out, HasSubstr(": valid; stage to rank ["));
    const std::string compute = GoldenDir() + "/" + g.base + ".compute.csv";
    CommandResult as_csv = Stagectl({"schedule", "--csv", compute, "--lowered", "--emit", "csv"});
    ASSERT_EQ(as_csv.exit_code, 0) << as_csv.err;
    EXPECT_EQ(as_csv.out, WithoutCR(ReadGolden(g.file)));
  }
  // A lowered file read as compute_only names the first communication action.
  CommandResult wrong =
      Stagectl({"schedule", "--csv", GoldenDir() + "/LoopedBFS_r2_s2_m4.comms.csv", "--validate"});
  EXPECT_EQ(wrong.exit_code, 1);
  EXPECT_THAT(wrong.err, HasSubstr("LoopedBFS_r2_s2_m4.comms.csv line 1 (rank 0), column 1 "
                                   "(step 0): 0UNSHARD is a UNSHARD action, which a compute_only "
                                   "schedule cannot hold"));
}

TEST(StagectlSchedule, MalformedFileNamesLineAndColumn) {
  TempDir dir;
  const std::string path = dir.path() + "/mine.csv";
  std::ofstream(path) << "0F0,0F1,0B0,0B1\n,1F0,1B0,1F1,1B1x\n";
  CommandResult r = Stagectl({"schedule", "--csv", path, "--validate"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_THAT(r.err, HasSubstr(path + " line 2 (rank 1), column 5 (step 4): invalid action "
                                      "\"1B1x\""));
}

TEST(StagectlSchedule, SimulationInJsonAndChromeTrace) {
  CommandResult json = Stagectl({"schedule", "--kind", "1F1B", "--ranks", "4", "--microbatches",
                                 "8", "--format", "json", "--simulate", "--costs", "1,1,1,1"});
  ASSERT_EQ(json.exit_code, 0) << json.err;
  const nlohmann::json doc = nlohmann::json::parse(json.out);
  EXPECT_EQ(doc["schedule"], "1F1B");
  EXPECT_EQ(doc["stage_to_rank"], nlohmann::json({0, 1, 2, 3}));
  ASSERT_EQ(doc["actions"].size(), 4u);
  // Equal F and B costs: every rank idles (p-1)/(m+p-1) = 3/11 of the step.
  for (const auto& rank : doc["simulation"]["ranks"]) {
    EXPECT_NEAR(rank["bubble_ratio"].get<double>(), 3.0 / 11.0, 1e-9);
  }
  EXPECT_DOUBLE_EQ(doc["simulation"]["makespan"].get<double>(), 22.0);

  TempDir dir;
  const std::string trace_path = dir.path() + "/trace.json";
  CommandResult chrome =
      Stagectl({"schedule", "--kind", "ZBVZeroBubble", "--ranks", "4", "--microbatches", "8",
                "--format", "chrome", "--out", trace_path});
  ASSERT_EQ(chrome.exit_code, 0) << chrome.err;
  EXPECT_EQ(chrome.out, "");
  std::ifstream in(trace_path);
  const nlohmann::json trace = nlohmann::json::parse(in);
  EXPECT_GT(trace["traceEvents"].size(), 0u);
}

TEST(StagectlSchedule, PredictedMemoryInGridJsonAndChromeTrace) {
  const std::vector<std::string> base = {"schedule",
                                         "--kind",
                                         "1F1B",
                                         "--ranks",
                                         "4",
                                         "--microbatches",
                                         "8",
                                         "--simulate",
                                         "--activation-bytes",
                                         "1048576",
                                         "--static-bytes",
                                         "1024"};
  std::vector<std::string> args = base;
  for (const char* arg : {"--format", "json"}) args.push_back(arg);
  CommandResult json = Stagectl(args);
  ASSERT_EQ(json.exit_code, 0) << json.err;
  const nlohmann::json memory = nlohmann::json::parse(json.out)["simulation"]["memory"];
  ASSERT_EQ(memory.size(), 4u);
  for (int r = 0; r < 4; ++r) {  // rank r of 1F1B holds 4 - r microbatches
    EXPECT_EQ(memory[r]["peak_dynamic_bytes"], (4 - r) * 1048576.0);
    EXPECT_EQ(memory[r]["peak_total_bytes"], (4 - r) * 1048576.0 + 1024);
    EXPECT_EQ(memory[r]["peak_microbatches"], 4 - r);
  }
  EXPECT_EQ(memory[0]["peak_action"], "0F3");

  CommandResult grid = Stagectl(base);
  ASSERT_EQ(grid.exit_code, 0) << grid.err;
  EXPECT_THAT(grid.out, HasSubstr("peak total"));
  EXPECT_THAT(grid.out, HasSubstr("4.0 MiB"));

  TempDir dir;
  const std::string trace_path = dir.path() + "/trace.json";
  args = base;
  for (const std::string& arg :
       {std::string("--format"), std::string("chrome"), std::string("--out"), trace_path}) {
    args.push_back(arg);
  }
  CommandResult chrome = Stagectl(args);
  ASSERT_EQ(chrome.exit_code, 0) << chrome.err;
  std::ifstream in(trace_path);
  const nlohmann::json trace = nlohmann::json::parse(in);
  double highest = 0;
  for (const auto& event : trace["traceEvents"]) {
    if (event["ph"] == "C" && event["pid"] == 0) {
      EXPECT_EQ(event["name"], "memory (predicted)");
      highest = std::max(highest, event["args"]["bytes"].get<double>());
    }
  }
  EXPECT_EQ(highest, 4 * 1048576.0);

  args = base;
  for (const char* arg : {"--weight-activation-bytes", "2000000"}) args.push_back(arg);
  CommandResult bad = Stagectl(args);
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("--weight-activation-bytes (2000000) is part of "
                                 "--activation-bytes (1048576) and cannot exceed it"));
}

// --unshard lowers as a job whose stages keep their parameters sharded does, and checks a file
// as running on them.
TEST(StagectlSchedule, UnshardLowersAndChecksForShardedParameters) {
  CommandResult r =
      Stagectl({"schedule", "--kind", "Interleaved1F1B", "--ranks", "1", "--stages-per-rank", "3",
                "--microbatches", "2", "--lowered", "--unshard", "step", "--format", "csv"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out,
            "0UNSHARD,1UNSHARD,2UNSHARD,0F0,1F0,2F0,2B0,0F1,1B0,1F1,0B0,2F1,2B1,2REDUCE_GRAD,"
            "2RESHARD,1B1,1REDUCE_GRAD,1RESHARD,0B1,0REDUCE_GRAD,0RESHARD\n");
  // PyTorch's lowered files UNSHARD and RESHARD every stage around its actions...
  r = Stagectl({"schedule", "--csv", GoldenDir() + "/ZBVZeroBubble_r2_s2_m4.comms.csv", "--format",
                "compute_comms", "--unshard", "step", "--validate"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  // ... its send/recv-only files do not.
  r = Stagectl({"schedule", "--csv", GoldenDir() + "/ZBVZeroBubble_r4_s2_m8.sendrecv_only.csv",
                "--format", "compute_comms", "--unshard", "stage", "--validate"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("0F0 runs while stage 0's parameters are sharded (no UNSHARD"));
  r = Stagectl(
      {"schedule", "--kind", "GPipe", "--ranks", "2", "--microbatches", "2", "--unshard", "layer"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--unshard must be step or stage, got 'layer'"));
}

TEST(StagectlSchedule, UsageAndConstraintErrors) {
  struct Case {
    std::vector<std::string> args;
    int exit_code;
    std::string error;
  };
  const std::vector<Case> cases = {
      {{"schedule", "--kind", "1F1B", "--ranks", "4", "--microbatches", "2"},
       1,
       "Number of microbatches (2) must be greater than or equal to the number of stages (4)."},
      {{"schedule", "--kind", "DualPipeV", "--ranks", "4", "--microbatches", "4"},
       1,
       "DualPipeV requires at least as many microbatches as stages, but got 4 microbatches and "
       "8 stages."},
      {{"schedule", "--kind", "ZeroBubble", "--ranks", "4", "--microbatches", "4"},
       2,
       "--kind: unknown schedule 'ZeroBubble'; valid schedules: GPipe, 1F1B, Interleaved1F1B, "
       "LoopedBFS, InterleavedZeroBubble, ZBVZeroBubble, DualPipeV, VHalf, VMin, ForwardOnly"},
      {{"schedule", "--ranks", "4"}, 2, "give exactly one of --kind NAME"},
      {{"schedule", "--kind", "GPipe", "--microbatches", "4"}, 2, "--ranks and --microbatches"},
      {{"schedule", "--kind", "GPipe", "--ranks", "2", "--microbatches", "4", "--format", "svg"},
       2,
       "--format: unknown output 'svg'; valid: grid, csv, json, chrome"},
      {{"schedule", "--kind", "GPipe", "--ranks", "2", "--microbatches", "4", "--simulate",
        "--costs", "1,2,x,1"},
       2,
       "--costs: 'x' in '1,2,x,1' is not a non-negative number"},
      {{"schedule", "--kind", "GPipe", "--ranks", "2", "--microbatches", "4", "--format", "csv",
        "--simulate"},
       2,
       "--simulate needs an output of grid, json or chrome"},
      {{"schedule", "--csv", "/nonexistent/x.csv"}, 1, "cannot read /nonexistent/x.csv"},
      {{"schedule", "--csv", GoldenDir() + "/GPipe_r2_s1_m2.compute.csv", "--format", "pytorch"},
       2,
       "--format: unknown schedule CSV format 'pytorch'; valid formats: compute_only, "
       "compute_comms"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.args.back());
    CommandResult r = Stagectl(c.args);
    EXPECT_EQ(r.exit_code, c.exit_code) << r.err;
    EXPECT_THAT(r.err, StartsWith("stagectl schedule: "));
    EXPECT_THAT(r.err, HasSubstr(c.error));
    EXPECT_EQ(r.out, "");
  }
}

}  // namespace
}  // namespace stagecoach::testing::stagectl_schedule_test
