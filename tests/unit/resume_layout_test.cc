// Which checkpoint files each stage of a resuming job reads (coordinator/checkpoints/
// resume_layout.h): the checkpoint's own stage on the same layout; by name, every checkpoint stage
// that holds one of the stage's layers (another stage count, other split points, layers nested
// deeper or shallower), training-state and shard files only, each once; the tied copy's source
// for the last stage; a layer of the job or of the checkpoint that the other lacks is refused
// naming it.
#include "coordinator/checkpoints/resume_layout.h"

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stagecoach::coordinator::resume_layout_test {
namespace {

using ::testing::HasSubstr;

v1::StageCheckpointFile File(int stage, const std::string& name) {
  v1::StageCheckpointFile f;
  f.set_stage(stage);
  f.set_file(name);
  f.set_size_bytes(10);
  f.set_sha256(std::string(64, 'a'));
  return f;
}

// A checkpoint of `layers` cut before each of `firsts`; stage 1 was sharded over two replicas.
CheckpointManifest Checkpoint(const std::vector<std::string>& layers,
                              const std::vector<int>& firsts) {
  CheckpointManifest m;
  m.num_stages = static_cast<int>(firsts.size());
  for (int s = 0; s < m.num_stages; ++s) {
    ManifestStage& st = m.stages.emplace_back();
    st.stage = s;
    st.first_layer = firsts[s];
    st.end_layer = s + 1 < m.num_stages ? firsts[s + 1] : static_cast<int>(layers.size());
    st.layers.assign(layers.begin() + st.first_layer, layers.begin() + st.end_layer);
    st.files = {File(s, absl::StrCat("stage-", s, ".pt")),
                File(s, absl::StrCat("stage-", s, ".state_dict.pt"))};
    if (s == 1) {
      st.files.push_back(File(s, "stage-1.optimizer-0-of-2.pt"));
      st.files.push_back(File(s, "stage-1.optimizer-1-of-2.pt"));
    }
  }
  return m;
}

std::vector<std::string> Names(const std::vector<v1::StageCheckpointFile>& files) {
  std::vector<std::string> out;
  for (const auto& f : files) out.push_back(f.file());
  return out;
}

const std::vector<std::string> kLayers = {"emb", "blocks.0", "blocks.1", "blocks.2", "head"};

TEST(ResumeLayout, TheSameLayoutReadsEachStagesOwnFiles) {
  const CheckpointManifest m = Checkpoint(kLayers, {0, 2});
  auto layout = MatchResumeLayout(m, "/c", {kLayers, {0, 2}}, false);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_FALSE(layout->by_name);
  ASSERT_EQ(layout->stage_files.size(), 2u);
  EXPECT_EQ(Names(layout->stage_files[0]),
            (std::vector<std::string>{"stage-0.pt", "stage-0.state_dict.pt"}));
  EXPECT_EQ(layout->stage_files[1].size(), 4u);
}

TEST(ResumeLayout, AnotherPartitionReadsEveryOverlappingStageByName) {
  const CheckpointManifest m = Checkpoint(kLayers, {0, 2});
  // Three stages: [emb, blocks.0], [blocks.1, blocks.2], [head]; the first cut where it was.
  auto three = MatchResumeLayout(m, "/c", {kLayers, {0, 2, 4}}, false);
  ASSERT_TRUE(three.ok()) << three.status();
  EXPECT_TRUE(three->by_name);
  EXPECT_EQ(Names(three->stage_files[0]), (std::vector<std::string>{"stage-0.pt"}));
  const std::vector<std::string> stage1 = {"stage-1.pt", "stage-1.optimizer-0-of-2.pt",
                                           "stage-1.optimizer-1-of-2.pt"};
  EXPECT_EQ(Names(three->stage_files[1]), stage1);
  EXPECT_EQ(Names(three->stage_files[2]), stage1);
  // One stage reads both; a cut inside the checkpoint's stage 0 reads stage 0 from both sides.
  auto one = MatchResumeLayout(m, "/c", {kLayers, {0}}, false);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->stage_files[0].size(), 4u);
  auto moved = MatchResumeLayout(m, "/c", {kLayers, {0, 1}}, false);
  ASSERT_TRUE(moved.ok());
  EXPECT_TRUE(moved->by_name);
  EXPECT_EQ(Names(moved->stage_files[0]), (std::vector<std::string>{"stage-0.pt"}));
  EXPECT_EQ(moved->stage_files[1].size(), 4u);
  // With a tied embedding the last stage also reads the stage holding the first layer.
  auto tied = MatchResumeLayout(m, "/c", {kLayers, {0, 2, 4}}, true);
  ASSERT_TRUE(tied.ok());
  EXPECT_EQ(Names(tied->stage_files[2]).front(), "stage-0.pt");
  EXPECT_EQ(tied->stage_files[2].size(), 4u);
}

TEST(ResumeLayout, NestedLayersMatchTheModuleThatHoldsThem) {
  // The checkpoint cut between opened blocks; the job keeps "blocks" one layer.
  const std::vector<std::string> opened = {"emb", "blocks.0", "blocks.1", "head"};
  const CheckpointManifest m = Checkpoint(opened, {0, 2});
  auto layout = MatchResumeLayout(m, "/c", {{"emb", "blocks", "head"}, {0, 2}}, false);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_TRUE(layout->by_name);
  EXPECT_EQ(layout->stage_files[0].size(), 4u);  // "blocks" is in both checkpoint stages
  EXPECT_EQ(Names(layout->stage_files[1]).front(), "stage-1.pt");
  EXPECT_TRUE(LayersOverlap("blocks", "blocks.3.attn"));
  EXPECT_FALSE(LayersOverlap("blocks", "blocks3"));
  EXPECT_FALSE(LayersOverlap("blocks.1", "blocks.10"));
}

TEST(ResumeLayout, ALayerEitherSideLacksIsRefusedNamingIt) {
  const CheckpointManifest m = Checkpoint(kLayers, {0, 2});
  std::vector<std::string> deeper = kLayers;
  deeper.insert(deeper.begin() + 4, "blocks.3");
  auto more = MatchResumeLayout(m, "/c", {deeper, {0, 3}}, false);
  ASSERT_TRUE(absl::IsInvalidArgument(more.status()));
  EXPECT_THAT(std::string(more.status().message()),
              HasSubstr("layer 'blocks.3' of this job's model (stage 1) is in no stage of "
                        "checkpoint /c"));
  std::vector<std::string> fewer = kLayers;
  fewer.erase(fewer.begin() + 3);
  auto less = MatchResumeLayout(m, "/c", {fewer, {0, 2}}, false);
  ASSERT_TRUE(absl::IsInvalidArgument(less.status()));
  EXPECT_THAT(std::string(less.status().message()),
              HasSubstr("checkpoint /c holds layer 'blocks.2' (its stage 1), which this job's "
                        "model does not have"));
}

}  // namespace
}  // namespace stagecoach::coordinator::resume_layout_test
