// Schedule CSV reader/writer against every golden CSV PyTorch wrote.
#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/schedule/csv.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/golden.h"
#include "tests/support/test_paths.h"

namespace stagecoach::schedule::schedule_csv_test {
namespace {

using ::testing::HasSubstr;

std::vector<std::string> GoldenCsvFiles() {
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(testing::GoldenDir())) {
    if (entry.path().extension() == ".csv") files.push_back(entry.path().filename().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

TEST(ScheduleCsv, RoundTripsEveryGoldenFile) {
  int checked = 0;
  for (const std::string& file : GoldenCsvFiles()) {
    SCOPED_TRACE(file);
    const std::string text = testing::ReadGolden(file);
    auto order = ParseScheduleCsv(text);
    ASSERT_TRUE(order.ok()) << order.status();
    ASSERT_FALSE(order->empty());
    // Byte-identical to PyTorch's file once its CRLF is LF.
    const std::string written = FormatScheduleCsv(*order);
    EXPECT_EQ(written, testing::WithoutCR(text));
    EXPECT_EQ(written.find('\r'), std::string::npos);
    auto again = ParseScheduleCsv(written);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(*again, *order);
    ++checked;
  }
  EXPECT_EQ(checked, 84);
}

TEST(ScheduleCsv, ParsesIdleSlotsAndOverlaps) {
  auto order = ParseScheduleCsv("0F0,,(0F1;1B0)OVERLAP_F_B,\r\n,1F0\r\n");
  ASSERT_TRUE(order.ok()) << order.status();
  ASSERT_EQ(order->size(), 2u);
  ASSERT_EQ((*order)[0].size(), 4u);
  EXPECT_EQ((*order)[0][0], Action::Make(0, ActionType::kForward, 0));
  EXPECT_FALSE((*order)[0][1].has_value());
  ASSERT_TRUE((*order)[0][2].has_value());
  EXPECT_EQ((*order)[0][2]->type, ActionType::kOverlapFB);
  EXPECT_EQ((*order)[0][2]->sub_actions.size(), 2u);
  EXPECT_FALSE((*order)[0][3].has_value());
  ASSERT_EQ((*order)[1].size(), 2u);
  EXPECT_FALSE((*order)[1][0].has_value());
  EXPECT_EQ((*order)[1][1], Action::Make(1, ActionType::kForward, 0));
  EXPECT_EQ(FormatScheduleCsv(*order), "0F0,,(0F1;1B0)OVERLAP_F_B,\n,1F0\n");
}

TEST(ScheduleCsv, LineStructure) {
  // The last terminator is optional; an empty line is a rank without actions.
  auto order = ParseScheduleCsv("0F0\n\n2F0");
  ASSERT_TRUE(order.ok()) << order.status();
  ASSERT_EQ(order->size(), 3u);
  EXPECT_TRUE((*order)[1].empty());
  EXPECT_EQ(FormatScheduleCsv(*order), "0F0\n\n2F0\n");
  EXPECT_TRUE(ParseScheduleCsv("")->empty());
  // A rank that is one idle slot is written as Python's csv module writes it.
  PipelineOrder one_idle = {{std::nullopt}, {}};
  EXPECT_EQ(FormatScheduleCsv(one_idle), "\"\"\n\n");
  EXPECT_EQ(*ParseScheduleCsv(FormatScheduleCsv(one_idle)), one_idle);
  // Quoted fields; spaces around an action are ignored.
  auto quoted = ParseScheduleCsv("\"0F0\", 0B0 ,\"\"\n");
  ASSERT_TRUE(quoted.ok()) << quoted.status();
  EXPECT_EQ(FormatScheduleCsv(*quoted), "0F0,0B0,\n");
}

TEST(ScheduleCsv, ErrorsNameLineColumnAndField) {
  auto bad = ParseScheduleCsv("0F0,0B0\r\n1F0,,1X0\r\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(bad.status().message());
  EXPECT_THAT(message, HasSubstr("line 2 (rank 1), column 3 (step 2)"));
  EXPECT_THAT(message, HasSubstr("\"1X0\""));

  auto lax = ParseScheduleCsv("2F0xyz\n");
  ASSERT_FALSE(lax.ok());
  EXPECT_THAT(std::string(lax.status().message()),
              HasSubstr("line 1 (rank 0), column 1 (step 0): invalid action \"2F0xyz\""));

  auto quote = ParseScheduleCsv("0F0,0\"B0\n");
  ASSERT_FALSE(quote.ok());
  EXPECT_THAT(std::string(quote.status().message()),
              HasSubstr("line 1 (rank 0), column 2 (step 1): stray double quote in field "
                        "\"0\"B0\""));
  EXPECT_FALSE(ParseScheduleCsv("\"0F0\n").ok());
}

// Every PyTorch compute list loads as compute_only (the two PyTorch 1F1B lists excepted: PyTorch's
// own validator rejects them), every comms list as compute_comms, and lowering a compute file
// gives PyTorch's comms file.
TEST(LoadScheduleCsv, ReadsEveryGoldenScheduleInItsFormat) {
  int compute = 0, comms = 0;
  for (const testing::GoldenFile& g : testing::GoldenFiles(".compute.csv")) {
    SCOPED_TRACE(g.file);
    CsvLoadOptions options;
    options.source = g.file;
    options.num_microbatches = g.microbatches;
    auto loaded = LoadScheduleCsv(testing::ReadGolden(g.file), CsvFormat::kComputeOnly, options);
    if (g.schedule == "1F1B") {
      ASSERT_FALSE(loaded.ok());
      EXPECT_THAT(std::string(loaded.status().message()),
                  HasSubstr("Running Full Backward for stage " + std::to_string(g.ranks - 1) +
                            ", microbatch 0 without first running Forward"));
      continue;
    }
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_EQ(loaded->num_ranks, g.ranks);
    EXPECT_EQ(loaded->num_stages, g.num_stages());
    EXPECT_EQ(loaded->num_microbatches, g.microbatches);
    const std::string comms_file = g.base + ".comms.csv";
    if (std::filesystem::exists(testing::GoldenDir() + "/" + comms_file)) {
      EXPECT_EQ(FormatScheduleCsv(loaded->lowered),
                testing::WithoutCR(testing::ReadGolden(comms_file)));
    }
    ++compute;
  }
  for (const testing::GoldenFile& g : testing::GoldenFiles(".comms.csv")) {
    SCOPED_TRACE(g.file);
    auto loaded = LoadScheduleCsv(testing::ReadGolden(g.file), CsvFormat::kComputeComms);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_EQ(loaded->lowered, loaded->order);
    EXPECT_EQ(loaded->num_stages, g.num_stages());
    ++comms;
  }
  EXPECT_EQ(compute, 33 - 5);
  EXPECT_EQ(comms, 23);
}

TEST(LoadScheduleCsv, Formats) {
  EXPECT_EQ(*ParseCsvFormat("compute_only"), CsvFormat::kComputeOnly);
  EXPECT_EQ(*ParseCsvFormat("compute_comms"), CsvFormat::kComputeComms);
  EXPECT_EQ(ParseCsvFormat("comms").status().message(),
            "unknown schedule CSV format 'comms'; valid formats: compute_only, compute_comms");
  // A lowered list is not a compute_only schedule.
  auto lowered = LoadScheduleCsv("0F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n",
                                 CsvFormat::kComputeOnly);
  ASSERT_FALSE(lowered.ok());
  EXPECT_THAT(std::string(lowered.status().message()),
              HasSubstr("schedule CSV line 1 (rank 0), column 2 (step 1): 0SEND_F0 is a SEND_F "
                        "action, which a compute_only schedule cannot hold"));
  auto as_comms = LoadScheduleCsv("0F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n",
                                  CsvFormat::kComputeComms);
  ASSERT_TRUE(as_comms.ok()) << as_comms.status();
  EXPECT_EQ(as_comms->stage_to_rank, (std::vector<int>{0, 1}));
}

struct Malformed {
  const char* name;
  CsvFormat format;
  const char* text;
  const char* expected;  // a substring of the error
};

// What users get wrong, each with an error that names the line and column (or the line of the
// rank holding the stage at fault), and never a crash.
TEST(LoadScheduleCsv, MalformedFilesGiveClearErrors) {
  const std::vector<Malformed> cases = {
      {"trailing junk", CsvFormat::kComputeOnly, "0F0,0B0\n1F0,1B0x\n",
       "mine.csv line 2 (rank 1), column 2 (step 1): invalid action \"1B0x\""},
      {"unknown type", CsvFormat::kComputeOnly, "0F0,0X0\n",
       "mine.csv line 1 (rank 0), column 2 (step 1): invalid action \"0X0\""},
      {"other container", CsvFormat::kComputeOnly, "(0F0;0B0)B\n",
       "mine.csv line 1 (rank 0), column 1 (step 0)"},
      {"stage on two ranks", CsvFormat::kComputeOnly, "0F0,1F0,1B0,0B0\n,1F1,1B1\n",
       "mine.csv line 2 (rank 1), column 2 (step 1): Stage 1 is assigned to both rank 1 and rank "
       "0"},
      {"stage on two ranks, lowered", CsvFormat::kComputeComms, "0F0,0B0\n0F1,0B1\n",
       "mine.csv line 2 (rank 1), column 1 (step 0): 0F1 runs stage 0, which already runs on rank "
       "0 (mine.csv line 1 (rank 0), column 1 (step 0)); a stage runs on exactly one rank"},
      {"missing backward", CsvFormat::kComputeOnly, "0F0,0F1,0B0\n,1F0,1B0,1F1,1B1\n",
       "mine.csv line 1 (rank 0): Invalid backward microbatches for stage 0: expected 2 total "
       "backwards, but got B=1, I=0, W=0"},
      {"backward before forward", CsvFormat::kComputeOnly, "0B0,0F0\n",
       "mine.csv line 1 (rank 0), column 1 (step 0): Running Full Backward for stage 0, "
       "microbatch 0 without first running Forward"},
      {"W before I", CsvFormat::kComputeOnly, "0F0,0W0,0I0\n",
       "mine.csv line 1 (rank 0), column 2 (step 1): Running Backward Weight"},
      {"deadlock", CsvFormat::kComputeComms,
       // Each rank waits for the other's gradient before sending its own activation.
       "0F0,0RECV_B0,0B0,0SEND_F0\n1RECV_F0,1F0,1B0,1SEND_B0\n",
       "mine.csv line 1 (rank 0), column 3 (step 2): deadlock: no rank can progress; rank 0 is "
       "blocked at step 2 on 0B0, waiting for 1SEND_B0 from rank 1; rank 1 is blocked at step 1 "
       "on 1F0, waiting for 0SEND_F0 from rank 0"},
      {"missing recv", CsvFormat::kComputeComms, "0F0,0SEND_F0,0RECV_B0,0B0\n1F0,1B0,1SEND_B0\n",
       "mine.csv line 2 (rank 1), column 1 (step 0): 1F0 consumes the output of stage 0"},
      {"missing stage", CsvFormat::kComputeComms, "0F0,0B0\n2F0,2B0\n",
       "mine.csv: stage 1 has no actions on any rank"},
      {"empty", CsvFormat::kComputeOnly, "\n\n", "mine.csv holds no actions"},
  };
  for (const Malformed& c : cases) {
    SCOPED_TRACE(c.name);
    CsvLoadOptions options;
    options.source = "mine.csv";
    auto loaded = LoadScheduleCsv(c.text, c.format, options);
    ASSERT_FALSE(loaded.ok());
    EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(loaded.status().message()), HasSubstr(c.expected));
  }
}

// A compute_only file that validates but whose cross-rank order cannot be lowered.
TEST(LoadScheduleCsv, UnlowerableComputeOrder) {
  // Rank 0 runs stage 2's forward first, which needs stage 1's output, which needs stage 0's.
  auto loaded = LoadScheduleCsv("2F0,0F0,2B0,0B0\n1F0,1B0\n", CsvFormat::kComputeOnly);
  ASSERT_FALSE(loaded.ok());
  EXPECT_THAT(std::string(loaded.status().message()),
              HasSubstr("schedule CSV: malformed compute schedule, can't schedule sends/recvs"));
}

TEST(LoadScheduleCsv, ExplicitCountsAndForwardOnly) {
  CsvLoadOptions options;
  options.num_microbatches = 3;
  auto short_file = LoadScheduleCsv("0F0,0F1,0B0,0B1\n", CsvFormat::kComputeOnly, options);
  ASSERT_FALSE(short_file.ok());
  EXPECT_THAT(std::string(short_file.status().message()),
              HasSubstr("line 1 (rank 0): Got 2 F microbatches for stage 0, expected 3"));
  CsvLoadOptions inference;
  inference.has_backward = false;
  auto forward = LoadScheduleCsv("0F0,0F1\n,1F0,1F1\n", CsvFormat::kComputeOnly, inference);
  ASSERT_TRUE(forward.ok()) << forward.status();
  EXPECT_EQ(FormatScheduleCsv(forward->lowered),
            "0UNSHARD,0F0,0SEND_F0,0F1,0SEND_F1,0RESHARD\n1UNSHARD,1RECV_F0,1F0,1RECV_F1,1F1,"
            "1RESHARD\n");
  auto with_backward = LoadScheduleCsv("0F0,0B0\n", CsvFormat::kComputeOnly, inference);
  ASSERT_FALSE(with_backward.ok());
  EXPECT_THAT(std::string(with_backward.status().message()),
              HasSubstr("column 2 (step 1): 0B0 in a forward-only schedule"));
}

// Files that name huge indices or hold too many rows or fields (issue 20: stagectl schedule --csv
// died of std::bad_alloc on the first two) are refused by CsvLimits before anything is allocated
// by their numbers, in both formats, with the place and the limit.
TEST(LoadScheduleCsv, RefusesFilesPastTheLimits) {
  struct Case {
    const char* name;
    std::string text;
    CsvLimits limits;
    std::string expected;
  };
  CsvLimits two_ranks;
  two_ranks.max_ranks = 2;
  CsvLimits two_fields_per_rank;
  two_fields_per_rank.max_fields_per_rank = 2;
  CsvLimits three_fields;
  three_fields.max_fields = 3;
  const std::vector<Case> cases = {
      {"huge stage and microbatch",
       "999999999F999999999",
       {},
       "mine.csv line 1 (rank 0), column 1 (step 0): 999999999F999999999 names stage 999999999; "
       "stage indices must be below 4096 (the limit on stages)"},
      {"huge microbatch (asked for ~16 GB)",
       "0F0,0F999999999\n1F0\n",
       {},
       "mine.csv line 1 (rank 0), column 2 (step 1): 0F999999999 names microbatch 999999999; "
       "microbatch indices must be below 65536 (the limit on microbatches)"},
      {"huge microbatch in an overlap",
       "(0F0;0B70000)OVERLAP_F_B\n",
       {},
       "column 1 (step 0): 0B70000 (in (0F0;0B70000)OVERLAP_F_B) names microbatch 70000"},
      {"stage number past an int",
       "99999999999999999999F0",
       {},
       "mine.csv line 1 (rank 0), column 1 (step 0): invalid action \"99999999999999999999F0\": "
       "stage number 99999999999999999999 is too large"},
      {"microbatch index past an int",
       "0F0,0F99999999999999999999\n",
       {},
       "column 2 (step 1): invalid action \"0F99999999999999999999\": microbatch index "
       "99999999999999999999 is too large"},
      {"stages x microbatches",
       "4095F65535\n",
       {},
       "mine.csv: 4096 stages x 65536 microbatches need 268435456 forward actions, more than the "
       "limit of 1000000 fields in a file"},
      {"rows", "0F0\n1F0\n2F0\n", two_ranks,
       "mine.csv line 3 (rank 2): the file has more than 2 rows; a schedule has at most 2 ranks"},
      {"fields of a rank", "0F0,,0F1\n", two_fields_per_rank,
       "mine.csv line 1 (rank 0), column 3 (step 2): rank 0 has more than 2 fields (actions and "
       "idle slots); the limit is 2 per rank"},
      {"fields in all", "0F0,0F1\n1F0,1F1\n", three_fields,
       "mine.csv line 2 (rank 1), column 2 (step 1): the file has more than 3 fields (actions and "
       "idle slots); the limit is 3 in all"},
  };
  for (CsvFormat format : {CsvFormat::kComputeOnly, CsvFormat::kComputeComms}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(absl::StrCat(c.name, ", ", CsvFormatName(format)));
      CsvLoadOptions options;
      options.source = "mine.csv";
      options.limits = c.limits;
      auto loaded = LoadScheduleCsv(c.text, format, options);
      ASSERT_FALSE(loaded.ok());
      EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(std::string(loaded.status().message()), HasSubstr(c.expected));
    }
  }
  // ParseScheduleCsv (the coordinator's first read of schedule.csv_text) holds to them too.
  auto rows = ParseScheduleCsv("0F0,0F999999999\n1F0\n");
  ASSERT_FALSE(rows.ok());
  EXPECT_THAT(std::string(rows.status().message()),
              HasSubstr("schedule CSV line 1 (rank 0), column 2 (step 1): 0F999999999 names "
                        "microbatch 999999999"));
  // The largest indices the defaults admit still read (and fail validation, not allocation).
  auto largest = LoadScheduleCsv("0F0\n4095F0\n", CsvFormat::kComputeComms);
  ASSERT_FALSE(largest.ok());
  EXPECT_THAT(std::string(largest.status().message()), HasSubstr("stage 1 has no actions"));
}

// Counts given by the caller (stagectl --microbatches, the spec's schedule.microbatches) are
// held to the same limits.
TEST(LoadScheduleCsv, RefusesExplicitCountsPastTheLimits) {
  CsvLoadOptions options;
  options.num_microbatches = 999999999;
  auto many = LoadScheduleCsv("0F0,0B0\n", CsvFormat::kComputeOnly, options);
  ASSERT_FALSE(many.ok());
  EXPECT_THAT(std::string(many.status().message()),
              HasSubstr("schedule CSV: 999999999 microbatches is more than the limit of 65536 "
                        "microbatches"));
  CsvLoadOptions stages;
  stages.num_stages = 5000;
  auto wide = LoadScheduleCsv("0F0,0B0\n", CsvFormat::kComputeComms, stages);
  ASSERT_FALSE(wide.ok());
  EXPECT_THAT(std::string(wide.status().message()),
              HasSubstr("5000 stages is more than the limit of 4096 stages"));
  CsvLoadOptions negative;
  negative.num_stages = -1;
  auto none = LoadScheduleCsv("0F0,0B0\n", CsvFormat::kComputeComms, negative);
  ASSERT_FALSE(none.ok());
  EXPECT_THAT(std::string(none.status().message()), HasSubstr("both must be at least 1"));
}

}  // namespace
}  // namespace stagecoach::schedule::schedule_csv_test
