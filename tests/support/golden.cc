#include "tests/support/golden.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/schedule/csv.h"
#include "gtest/gtest.h"
#include "tests/support/test_paths.h"

namespace stagecoach::testing {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

std::string ReadGolden(const std::string& file) { return ReadFile(GoldenDir() + "/" + file); }

std::string WithoutCR(std::string text) {
  text.erase(std::remove(text.begin(), text.end(), '\r'), text.end());
  return text;
}

std::string Normalized(std::string text) {
  text = WithoutCR(std::move(text));
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

std::vector<GoldenFile> GoldenFiles(absl::string_view suffix, absl::string_view schedule) {
  static const std::regex kName(R"(([A-Za-z0-9]+)_r(\d+)_s(\d+)_m(\d+)(\..+))");
  std::vector<GoldenFile> out;
  for (const auto& entry : std::filesystem::directory_iterator(GoldenDir())) {
    const std::string file = entry.path().filename().string();
    std::smatch m;
    if (!std::regex_match(file, m, kName) || suffix != m.str(5)) continue;
    if (!schedule.empty() && schedule != m.str(1)) continue;
    out.push_back({file, file.substr(0, m.position(5)), m.str(1), std::stoi(m.str(2)),
                   std::stoi(m.str(3)), std::stoi(m.str(4))});
  }
  std::sort(out.begin(), out.end(),
            [](const GoldenFile& a, const GoldenFile& b) { return a.file < b.file; });
  return out;
}

schedule::PipelineOrder LoadGoldenOrder(const std::string& file) {
  auto order = schedule::ParseScheduleCsv(ReadGolden(file));
  if (!order.ok()) {
    ADD_FAILURE() << "cannot parse golden schedule " << file << ": " << order.status();
    return {};
  }
  return *std::move(order);
}

schedule::RankActions ParseActions(std::initializer_list<const char*> texts) {
  schedule::RankActions out;
  for (const char* text : texts) {
    auto action = schedule::ParseAction(text);
    EXPECT_TRUE(action.ok()) << text << ": " << action.status();
    out.push_back(action.ok() ? *action : std::nullopt);
  }
  return out;
}

std::string JoinActions(const schedule::RankActions& actions) {
  std::vector<std::string> cells;
  for (const auto& action : actions) cells.push_back(action ? action->ToString() : "");
  return absl::StrJoin(cells, ",");
}

schedule::ScheduleConfig ScheduleConfigFor(schedule::ScheduleKind kind, int ranks,
                                           int stages_per_rank, int microbatches) {
  schedule::ScheduleConfig config;
  config.kind = kind;
  config.num_ranks = ranks;
  config.stages_per_rank = stages_per_rank;
  config.num_microbatches = microbatches;
  return config;
}

std::string DescribeConfig(const schedule::ScheduleConfig& config) {
  return absl::StrCat(schedule::ScheduleKindName(config.kind), " r", config.num_ranks, " s",
                      config.stages_per_rank, " m", config.num_microbatches);
}

}  // namespace stagecoach::testing
