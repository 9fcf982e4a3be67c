// Schedule CSV reader/writer against every golden CSV PyTorch wrote.
#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "common/schedule/csv.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/golden.h"
#include "tests/support/test_paths.h"

namespace stagecoach::schedule {
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

}  // namespace
}  // namespace stagecoach::schedule
