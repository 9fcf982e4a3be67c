// Generators and stage mappings against the schedules PyTorch produced (golden pytorch-schedules).
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/schedule/csv.h"
#include "common/schedule/generators.h"
#include "common/schedule/validator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/support/golden.h"
#include "tests/support/test_paths.h"

namespace stagecoach::schedule::schedule_generators_test {
namespace {

using ::testing::HasSubstr;

using testing::JoinActions;

ScheduleConfig Config(ScheduleKind kind, int ranks, int microbatches) {
  ScheduleConfig config;
  config.kind = kind;
  config.num_ranks = ranks;
  config.num_microbatches = microbatches;
  return config;
}

TEST(ScheduleGenerators, GPipeEqualsEveryGoldenFile) {
  int checked = 0;
  for (const char* suffix : {".compute.csv", ".compute_raw.csv"}) {
    const bool raw = std::string(suffix) == ".compute_raw.csv";
    for (const testing::GoldenFile& g : testing::GoldenFiles(suffix, "GPipe")) {
      SCOPED_TRACE(g.file);
      ASSERT_EQ(g.stages_per_rank, 1);
      ScheduleConfig config = Config(ScheduleKind::kGPipe, g.ranks, g.microbatches);
      auto ours = raw ? GenerateTimeAligned(config) : GenerateSchedule(config);
      ASSERT_TRUE(ours.ok()) << ours.status();
      EXPECT_EQ(FormatScheduleCsv(*ours), testing::WithoutCR(testing::ReadGolden(g.file)));
      EXPECT_EQ(*ours, testing::LoadGoldenOrder(g.file));
      ++checked;
    }
  }
  EXPECT_EQ(checked, 10);
}

// PyTorch's last rank runs F1..Fm where F0..F(m-1) belong; everything else must be identical.
TEST(ScheduleGenerators, OneFOneBEqualsGoldenExceptTheFixedLastRank) {
  int checked = 0;
  for (const char* suffix : {".compute.csv", ".compute_raw.csv"}) {
    const bool raw = std::string(suffix) == ".compute_raw.csv";
    for (const testing::GoldenFile& g : testing::GoldenFiles(suffix, "1F1B")) {
      SCOPED_TRACE(g.file);
      ScheduleConfig config = Config(ScheduleKind::k1F1B, g.ranks, g.microbatches);
      auto ours = raw ? GenerateTimeAligned(config) : GenerateSchedule(config);
      ASSERT_TRUE(ours.ok()) << ours.status();
      PipelineOrder golden = testing::LoadGoldenOrder(g.file);
      ASSERT_EQ(ours->size(), golden.size());
      const int last = g.ranks - 1;
      for (int rank = 0; rank < last; ++rank) {
        EXPECT_EQ(JoinActions((*ours)[rank]), JoinActions(golden[rank])) << "rank " << rank;
      }
      // Same slots, forwards shifted down by one microbatch.
      RankActions fixed = golden[last];
      for (auto& action : fixed) {
        if (action && action->type == ActionType::kForward)
          action->microbatch = *action->microbatch - 1;
      }
      EXPECT_EQ(JoinActions((*ours)[last]), JoinActions(fixed));
      EXPECT_NE(JoinActions((*ours)[last]), JoinActions(golden[last]));
      // Ours is valid; PyTorch's is not.
      EXPECT_TRUE(ValidateComputeSchedule(*ours, g.ranks, g.ranks, g.microbatches).ok());
      EXPECT_FALSE(ValidateComputeSchedule(golden, g.ranks, g.ranks, g.microbatches).ok());
      ++checked;
    }
  }
  EXPECT_EQ(checked, 10);
}

TEST(ScheduleGenerators, OneFOneBLastRankIsForwardBackwardPairs) {
  auto order = GenerateTimeAligned(Config(ScheduleKind::k1F1B, 2, 3));
  ASSERT_TRUE(order.ok()) << order.status();
  EXPECT_EQ(JoinActions((*order)[0]), "0F0,,,0F1,0B0,0F2,0B1,,0B2");
  EXPECT_EQ(JoinActions((*order)[1]), ",1F0,1B0,1F1,1B1,1F2,1B2");
  auto lowered = GenerateSchedule(Config(ScheduleKind::k1F1B, 2, 3));
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  EXPECT_EQ(JoinActions((*lowered)[1]), "1F0,1B0,1F1,1B1,1F2,1B2,1REDUCE_GRAD");
}

TEST(ScheduleGenerators, SweepIsValidWithLoopPlacement) {
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B}) {
    for (int ranks = 1; ranks <= 8; ++ranks) {
      for (int mbs = 1; mbs <= 16; ++mbs) {
        if (kind == ScheduleKind::k1F1B && mbs < ranks) continue;
        SCOPED_TRACE(absl::StrCat(ScheduleKindName(kind), " ranks=", ranks, " mbs=", mbs));
        for (bool raw : {false, true}) {
          auto order = raw ? GenerateTimeAligned(Config(kind, ranks, mbs))
                           : GenerateSchedule(Config(kind, ranks, mbs));
          ASSERT_TRUE(order.ok()) << order.status();
          auto mapping = ValidateComputeSchedule(*order, ranks, ranks, mbs);
          ASSERT_TRUE(mapping.ok()) << mapping.status();
          EXPECT_EQ(*mapping, *StageToRank(ranks, ranks, MappingStyle::kLoop));
        }
      }
    }
  }
}

TEST(ScheduleGenerators, ConstraintErrors) {
  auto too_few = GenerateSchedule(Config(ScheduleKind::k1F1B, 4, 2));
  ASSERT_FALSE(too_few.ok());
  EXPECT_EQ(too_few.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(too_few.status().message(),
            "Number of microbatches (2) must be greater than or equal to the number of stages "
            "(4).");
  EXPECT_FALSE(GenerateTimeAligned(Config(ScheduleKind::k1F1B, 4, 3)).ok());
  EXPECT_TRUE(GenerateTimeAligned(Config(ScheduleKind::k1F1B, 4, 4)).ok());
  // GPipe has no microbatch minimum (PyTorch allows m < stages too).
  EXPECT_TRUE(GenerateSchedule(Config(ScheduleKind::kGPipe, 4, 1)).ok());

  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B}) {
    ScheduleConfig two_stages = Config(kind, 2, 4);
    two_stages.stages_per_rank = 2;
    auto status = GenerateSchedule(two_stages).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(status.message()), HasSubstr("stages_per_rank is 2"));
    EXPECT_THAT(std::string(status.message()), HasSubstr(std::string(ScheduleKindName(kind))));

    auto no_ranks = GenerateTimeAligned(Config(kind, 0, 4)).status();
    EXPECT_EQ(no_ranks.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(no_ranks.message()), HasSubstr("num_ranks must be at least 1, got 0"));
    auto no_mbs = GenerateTimeAligned(Config(kind, 2, 0)).status();
    EXPECT_THAT(std::string(no_mbs.message()),
                HasSubstr("num_microbatches must be at least 1, got 0"));
    ScheduleConfig zero_spr = Config(kind, 2, 4);
    zero_spr.stages_per_rank = 0;
    EXPECT_THAT(std::string(GenerateSchedule(zero_spr).status().message()),
                HasSubstr("stages_per_rank must be at least 1"));
  }
}

// Forward-only: each stage runs its microbatches in order as soon as its input exists; a rank
// with several stages runs the deepest ready one first.
TEST(ScheduleGenerators, ForwardOnlyPipelinesForwards) {
  auto one = GenerateSchedule(Config(ScheduleKind::kForwardOnly, 3, 2));
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(JoinActions((*one)[0]), "0F0,0F1");
  EXPECT_EQ(JoinActions((*one)[1]), ",1F0,1F1");
  EXPECT_EQ(JoinActions((*one)[2]), ",,2F0,2F1");

  ScheduleConfig two_stages = Config(ScheduleKind::kForwardOnly, 2, 3);
  two_stages.stages_per_rank = 2;
  auto two = GenerateSchedule(two_stages);
  ASSERT_TRUE(two.ok()) << two.status();
  // Stage 2 (rank 0) can start at slot 2, after 1F0; it then goes before stage 0's last forward.
  EXPECT_EQ(JoinActions((*two)[0]), "0F0,0F1,2F0,2F1,0F2,,2F2");
  EXPECT_EQ(JoinActions((*two)[1]), ",1F0,1F1,3F0,3F1,1F2,,3F2");

  ValidationOptions inference;
  inference.has_backward = false;
  auto mapping = ValidateComputeSchedule(*two, 2, 4, 3, inference);
  ASSERT_TRUE(mapping.ok()) << mapping.status();
  EXPECT_EQ(*mapping, (std::vector<int>{0, 1, 0, 1}));
  // With backward expected, the missing backwards are an error.
  EXPECT_THAT(std::string(ValidateComputeSchedule(*two, 2, 4, 3).status().message()),
              HasSubstr("Invalid backward microbatches for stage 0: expected 3 total backwards"));
  EXPECT_FALSE(HasBackward(ScheduleKind::kForwardOnly));
  EXPECT_TRUE(HasBackward(ScheduleKind::kDualPipeV));
}

TEST(ScheduleGenerators, NamesMatchGetScheduleClass) {
  std::ifstream in(testing::GoldenDir() + "/get_schedule_class.json");
  ASSERT_TRUE(in.good());
  const nlohmann::json entries = nlohmann::json::parse(in);
  const std::string valid =
      "GPipe, 1F1B, Interleaved1F1B, LoopedBFS, InterleavedZeroBubble, ZBVZeroBubble, DualPipeV, "
      "VHalf, VMin, ForwardOnly";
  int schedules = 0, base_classes = 0, unknown = 0;
  for (const auto& entry : entries) {
    const std::string name = entry["name"];
    SCOPED_TRACE(name);
    auto kind = ParseScheduleKind(name);
    const std::string cls = entry.value("class", "");
    if (cls == "PipelineScheduleSingle" || cls == "PipelineScheduleMulti") {
      // PyTorch's base classes: resolvable there, not schedules here.
      ASSERT_FALSE(kind.ok());
      EXPECT_EQ(kind.status().message(), "'" + name +
                                             "' is a PyTorch base class, not a schedule; valid "
                                             "schedules: " +
                                             valid);
      ++base_classes;
    } else if (!cls.empty()) {
      ASSERT_TRUE(kind.ok()) << kind.status();
      EXPECT_EQ("Schedule" + std::string(ScheduleKindName(*kind)), cls);
      ++schedules;
    } else {
      // Unknown to PyTorch too.
      ASSERT_FALSE(kind.ok());
      EXPECT_EQ(kind.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_EQ(kind.status().message(),
                "unknown schedule '" + name + "'; valid schedules: " + valid);
      ++unknown;
    }
  }
  EXPECT_EQ(schedules, 7);
  EXPECT_EQ(base_classes, 2);
  EXPECT_EQ(unknown, 2);
  for (const char* spelling : {"GPIPE", "gpipe", "GPipe", "1f1b", "1F1B", "forwardonly",
                               "DUALPIPEV", "interleaved1f1b", "loopedbfs"}) {
    EXPECT_TRUE(ParseScheduleKind(spelling).ok()) << spelling;
  }
  EXPECT_FALSE(ParseScheduleKind("").ok());
  EXPECT_FALSE(ParseScheduleKind("GPipe ").ok());
  EXPECT_EQ(AllScheduleKinds().size(), 10u);
  for (ScheduleKind kind : AllScheduleKinds()) {
    EXPECT_EQ(*ParseScheduleKind(ScheduleKindName(kind)), kind);
  }
}

TEST(StageMapping, MatchesGoldenMappings) {
  std::ifstream in(testing::GoldenDir() + "/stage_rank_mappings.json");
  ASSERT_TRUE(in.good());
  const nlohmann::json entries = nlohmann::json::parse(in);
  int checked = 0;
  for (const auto& entry : entries) {
    const int ranks = entry["pp_size"];
    const int stages = entry["num_stages"];
    const std::string style_name = entry["style"];
    SCOPED_TRACE(absl::StrCat(style_name, " ranks=", ranks, " stages=", stages));
    auto style = ParseMappingStyle(style_name);
    if (entry.contains("error")) {
      if (!style.ok()) {
        EXPECT_EQ(style.status().message(), "unknown stage-to-rank mapping style '" + style_name +
                                                "'; valid styles: loop, v");
      } else {
        auto mapping = StageToRank(stages, ranks, *style);
        ASSERT_FALSE(mapping.ok());
        EXPECT_EQ(mapping.status().code(), absl::StatusCode::kInvalidArgument);
        EXPECT_THAT(std::string(mapping.status().message()),
                    HasSubstr(absl::StrCat("num_stages ", stages,
                                           " must be evenly divisible by num_ranks ", ranks)));
        EXPECT_FALSE(RankToStages(stages, ranks, *style).ok());
      }
      ++checked;
      continue;
    }
    ASSERT_TRUE(style.ok()) << style.status();
    EXPECT_EQ(MappingStyleName(*style), style_name);
    auto mapping = StageToRank(stages, ranks, *style);
    ASSERT_TRUE(mapping.ok()) << mapping.status();
    std::vector<int> want(stages);
    for (const auto& [stage, rank] : entry["stage_to_rank"].items()) {
      want[std::stoi(stage)] = rank.get<int>();
    }
    EXPECT_EQ(*mapping, want);
    auto inverse = RankToStages(stages, ranks, *style);
    ASSERT_TRUE(inverse.ok()) << inverse.status();
    std::vector<std::vector<int>> want_inverse(ranks);
    for (const auto& [rank, list] : entry["rank_to_stages"].items()) {
      want_inverse[std::stoi(rank)] = list.get<std::vector<int>>();
    }
    EXPECT_EQ(*inverse, want_inverse);
    ++checked;
  }
  EXPECT_EQ(checked, 12);
}

TEST(StageMapping, ParsesStylesAndRejectsBadInputs) {
  EXPECT_EQ(*ParseMappingStyle("loop"), MappingStyle::kLoop);
  EXPECT_EQ(*ParseMappingStyle("V"), MappingStyle::kV);
  EXPECT_FALSE(ParseMappingStyle("").ok());
  EXPECT_THAT(std::string(StageToRank(0, 2, MappingStyle::kLoop).status().message()),
              HasSubstr("num_stages must be at least 1"));
  EXPECT_THAT(std::string(StageToRank(4, 0, MappingStyle::kV).status().message()),
              HasSubstr("num_ranks must be at least 1"));
  // Loop placement allows fewer stages than ranks (some ranks idle); v needs whole blocks.
  EXPECT_EQ(*StageToRank(2, 4, MappingStyle::kLoop), (std::vector<int>{0, 1}));
  EXPECT_FALSE(StageToRank(2, 4, MappingStyle::kV).ok());
  auto inverse = InvertStageToRank({0, 1, 1, 0}, 2);
  ASSERT_TRUE(inverse.ok());
  EXPECT_EQ(*inverse, (std::vector<std::vector<int>>{{0, 3}, {1, 2}}));
  EXPECT_THAT(std::string(InvertStageToRank({0, 2}, 2).status().message()),
              HasSubstr("stage 1 is mapped to rank 2"));
}

}  // namespace
}  // namespace stagecoach::schedule::schedule_generators_test
