// The checkpoint layout both sides use (common/checkpoint/layout.h): names, paths, and the step
// of a directory name, canonical spellings only.
#include "common/checkpoint/layout.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stagecoach::checkpoint::checkpoint_layout_test {
namespace {

TEST(CheckpointLayout, NamesAndPaths) {
  EXPECT_EQ(StepDirectoryName(0), "step-000000");
  EXPECT_EQ(StepDirectoryName(40), "step-000040");
  EXPECT_EQ(StepDirectoryName(1234567), "step-1234567");
  EXPECT_EQ(CheckpointStepDirectory("/ckpt", 5), "/ckpt/step-000005");
  EXPECT_EQ(CheckpointStepDirectory("/ckpt/", 5), "/ckpt/step-000005");
  EXPECT_EQ(ManifestPath("/ckpt/step-000005"), "/ckpt/step-000005/manifest.json");
  EXPECT_EQ(StageStateFileName(3), "stage-3.pt");
  EXPECT_EQ(StageExportFileName(3), "stage-3.state_dict.pt");
}

TEST(CheckpointLayout, HfExportPartsAreTheOnlyFilesBelowTheStepDirectory) {
  EXPECT_EQ(HfShardFileName(2, 1), "hf/stage-2-00001.safetensors");
  for (const char* ok : {"stage-0.pt", "stage-3.state_dict.pt", "hf/stage-2-00001.safetensors"}) {
    EXPECT_TRUE(IsCheckpointFileName(ok)) << ok;
  }
  for (const char* bad : {"", "manifest.json", "hf/manifest.json", "hf/", "hf/../x", "hf/a/b",
                          "other/x", "/etc/passwd", "..", "hf/.."}) {
    EXPECT_FALSE(IsCheckpointFileName(bad)) << bad;
  }
}

TEST(CheckpointLayout, StepOfADirectoryNameRoundTrips) {
  for (int64_t step : {int64_t{0}, int64_t{7}, int64_t{40}, int64_t{999999}, int64_t{1000000},
                       int64_t{123456789012}}) {
    EXPECT_EQ(StepOfCheckpointDirectory(StepDirectoryName(step)), step) << step;
  }
}

TEST(CheckpointLayout, OtherNamesHaveNoStep) {
  for (const char* name :
       {"", "step-", "step", "stage-0.pt", "manifest.json", "step-40", "step-0000040",
        "step-+00040", "step--00001", "step- 00040", "step-000040 ", "step-000040.partial-2",
        "step-00004x", "Step-000040", "step-99999999999999999999", "/ckpt/step-000040"}) {
    EXPECT_EQ(StepOfCheckpointDirectory(name), std::nullopt) << "'" << name << "'";
  }
}

}  // namespace
}  // namespace stagecoach::checkpoint::checkpoint_layout_test
