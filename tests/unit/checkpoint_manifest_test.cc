// Checkpoint manifests (coordinator/checkpoints/checkpoint_manifest.h): written whole and never
// over an existing one, read back field for field, and a checkpoint refused when its manifest is
// missing (partial) or malformed, or a listed file is missing, of another size or corrupt.
#include "coordinator/checkpoints/checkpoint_manifest.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/util/sha256.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"

namespace stagecoach::coordinator::checkpoint_manifest_test {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class CheckpointManifestTest : public ::testing::Test {
 protected:
  // Writes a file of `bytes` and returns its entry.
  v1::StageCheckpointFile WriteFile(int stage, const std::string& name, const std::string& bytes) {
    std::ofstream(dir_ + "/" + name, std::ios::binary) << bytes;
    v1::StageCheckpointFile f;
    f.set_stage(stage);
    f.set_file(name);
    f.set_size_bytes(static_cast<int64_t>(bytes.size()));
    f.set_sha256(Sha256Hex(bytes));
    return f;
  }

  // A two-stage checkpoint with both files of each stage on disk.
  CheckpointManifest TwoStages() {
    CheckpointManifest m;
    m.job_id = "job-7";
    m.step = 40;
    m.data_position = 40;
    m.num_stages = 2;
    m.schedule = "1F1B";
    m.model_json = R"({"builtin":{"family":"mlp","sizes":[4,8,3]}})";
    for (int s = 0; s < 2; ++s) {
      ManifestStage& st = m.stages.emplace_back();
      st.stage = s;
      st.first_layer = s;
      st.end_layer = s + 1;
      st.layers = {absl::StrCat(s)};
      st.files.push_back(WriteFile(s, absl::StrCat("stage-", s, ".pt"),
                                   absl::StrCat("training state of stage ", s)));
      st.files.push_back(WriteFile(s, absl::StrCat("stage-", s, ".state_dict.pt"),
                                   absl::StrCat("weights of stage ", s, " and more")));
    }
    return m;
  }

  stagecoach::testing::TempDir tmp_{"checkpoint_manifest_test"};
  const std::string dir_ = tmp_.path();
};

TEST_F(CheckpointManifestTest, WriteThenVerifyRoundTrips) {
  const CheckpointManifest m = TwoStages();
  ASSERT_TRUE(WriteManifest(dir_, m).ok());
  EXPECT_EQ(ManifestPath(dir_), dir_ + "/manifest.json");
  auto back = VerifyCheckpoint(dir_);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->job_id, "job-7");
  EXPECT_EQ(back->step, 40);
  EXPECT_EQ(back->data_position, 40);
  EXPECT_EQ(back->num_stages, 2);
  EXPECT_EQ(back->schedule, "1F1B");
  EXPECT_THAT(back->model_json, HasSubstr("\"sizes\":[4,8,3]"));
  ASSERT_EQ(back->stages.size(), 2u);
  for (int s = 0; s < 2; ++s) {
    EXPECT_EQ(back->stages[s].stage, s);
    EXPECT_EQ(back->stages[s].first_layer, s);
    EXPECT_EQ(back->stages[s].end_layer, s + 1);
    EXPECT_EQ(back->stages[s].layers, std::vector<std::string>{absl::StrCat(s)});
    ASSERT_EQ(back->stages[s].files.size(), 2u);
    for (int k = 0; k < 2; ++k) {
      EXPECT_EQ(back->stages[s].files[k].stage(), s);
      EXPECT_EQ(back->stages[s].files[k].file(), m.stages[s].files[k].file());
      EXPECT_EQ(back->stages[s].files[k].size_bytes(), m.stages[s].files[k].size_bytes());
      EXPECT_EQ(back->stages[s].files[k].sha256(), m.stages[s].files[k].sha256());
    }
  }
  // No temporary file is left behind: four stage files and the manifest.
  int entries = 0;
  for (const auto& e : fs::directory_iterator(dir_)) {
    (void)e;
    ++entries;
  }
  EXPECT_EQ(entries, 5);
}

TEST_F(CheckpointManifestTest, ExistingManifestIsNotOverwritten) {
  CheckpointManifest m = TwoStages();
  ASSERT_TRUE(WriteManifest(dir_, m).ok());
  const auto before = Sha256OfFile(ManifestPath(dir_));
  m.step = 41;
  absl::Status again = WriteManifest(dir_, m);
  EXPECT_EQ(again.code(), absl::StatusCode::kAlreadyExists) << again;
  EXPECT_THAT(std::string(again.message()), HasSubstr(ManifestPath(dir_)));
  EXPECT_EQ(*Sha256OfFile(ManifestPath(dir_)), *before);
}

TEST_F(CheckpointManifestTest, InconsistentManifestIsNotWritten) {
  CheckpointManifest m = TwoStages();
  m.stages[1].files[0].set_stage(0);
  EXPECT_EQ(WriteManifest(dir_, m).code(), absl::StatusCode::kInvalidArgument);
  m = TwoStages();
  m.num_stages = 3;
  EXPECT_EQ(WriteManifest(dir_, m).code(), absl::StatusCode::kInvalidArgument);
  m = TwoStages();
  m.stages[0].files[1].set_sha256("abc");
  EXPECT_EQ(WriteManifest(dir_, m).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(fs::exists(ManifestPath(dir_)));
}

TEST_F(CheckpointManifestTest, MissingManifestIsAPartialCheckpoint) {
  TwoStages();
  auto read = VerifyCheckpoint(dir_);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(read.status().message(),
            absl::StrCat("partial checkpoint: ", dir_, " has no manifest.json"));
  auto nowhere = VerifyCheckpoint(dir_ + "/step-000099");
  EXPECT_EQ(nowhere.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(nowhere.status().message()), HasSubstr("step-000099"));
}

TEST_F(CheckpointManifestTest, MissingFileIsNamed) {
  ASSERT_TRUE(WriteManifest(dir_, TwoStages()).ok());
  fs::remove(dir_ + "/stage-1.state_dict.pt");
  auto read = VerifyCheckpoint(dir_);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(read.status().message()), HasSubstr("stage-1.state_dict.pt"));
  EXPECT_THAT(std::string(read.status().message()), HasSubstr("missing"));
}

TEST_F(CheckpointManifestTest, TruncatedFileIsNamed) {
  const CheckpointManifest m = TwoStages();
  ASSERT_TRUE(WriteManifest(dir_, m).ok());
  fs::resize_file(dir_ + "/stage-0.pt", 3);
  auto read = VerifyCheckpoint(dir_);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(read.status().message()), HasSubstr("stage-0.pt has 3 bytes"));
}

TEST_F(CheckpointManifestTest, CorruptFileIsNamedWithBothChecksums) {
  const CheckpointManifest m = TwoStages();
  ASSERT_TRUE(WriteManifest(dir_, m).ok());
  {
    std::fstream f(dir_ + "/stage-1.pt", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(2);
    f.put('X');  // same size, other bytes
  }
  auto read = VerifyCheckpoint(dir_);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(read.status().message()), HasSubstr("stage-1.pt has sha256 "));
  EXPECT_THAT(std::string(read.status().message()), HasSubstr(m.stages[1].files[0].sha256()));
}

TEST_F(CheckpointManifestTest, MalformedManifestIsRefused) {
  TwoStages();
  std::ofstream(ManifestPath(dir_)) << "{not json";
  auto read = ReadManifest(dir_);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(read.status().message()), HasSubstr("manifest.json"));

  std::ofstream(ManifestPath(dir_), std::ios::trunc)
      << R"({"format": "stagecoach-checkpoint-v1", "job_id": "j", "step": "ten"})";
  read = ReadManifest(dir_);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(read.status().message()), HasSubstr("'step'"));

  // Found by the checkpoint_manifest fuzzer: a float or out-of-range number where an integer
  // belongs was converted with undefined behaviour; it is now refused by name.
  for (const char* step : {"4.07778e+20", "1.5", "9223372036854775808", "-1e30"}) {
    std::ofstream(ManifestPath(dir_), std::ios::trunc)
        << R"({"format": "stagecoach-checkpoint-v1", "job_id": "j", "step": )" << step << "}";
    read = ReadManifest(dir_);
    EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss) << step;
    EXPECT_THAT(std::string(read.status().message()),
                HasSubstr("'step' is not an integer in range"))
        << step;
  }
  std::ofstream(ManifestPath(dir_), std::ios::trunc)
      << R"({"format": "stagecoach-checkpoint-v1", "job_id": "j", "step": 1, "data_position": 1,)"
      << R"( "num_stages": 4294967296})";
  read = ReadManifest(dir_);
  EXPECT_THAT(std::string(read.status().message()), HasSubstr("'num_stages' is not an integer"));

  std::ofstream(ManifestPath(dir_), std::ios::trunc) << R"({"format": "other"})";
  read = ReadManifest(dir_);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(read.status().message()), HasSubstr("format"));
}

}  // namespace
}  // namespace stagecoach::coordinator::checkpoint_manifest_test
