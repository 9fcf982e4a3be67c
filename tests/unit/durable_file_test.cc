// Durable files on a real directory: the content arrives whole, no temporary file is left behind
// (after success, failure or an abandoned writer), kReplace replaces and kFail refuses an
// existing target (also among concurrent writers), and errors name the path.
#include "common/util/durable_file.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"

namespace stagecoach::durable_file_test {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;
using IfExists = DurableFileOptions::IfExists;

class DurableFileTest : public ::testing::Test {
 protected:
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  // Every entry of the directory, hidden temporary files included.
  std::vector<std::string> Entries() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_)) out.push_back(e.path().filename().string());
    return out;
  }

  static std::string Read(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

  static DurableFileOptions NoOverwrite() {
    DurableFileOptions options;
    options.if_exists = IfExists::kFail;
    options.what = "checkpoint file";
    return options;
  }

  stagecoach::testing::TempDir tmp_{"durable_file_test"};
  const std::string dir_ = tmp_.path();
};

TEST_F(DurableFileTest, WritesTheContentAndLeavesNoTemporaryFile) {
  std::string bytes = "header\n";
  bytes.push_back('\0');
  bytes += std::string(1 << 20, 'x');
  ASSERT_TRUE(WriteFileDurably(Path("job-1.pb"), bytes).ok());
  EXPECT_EQ(Read(Path("job-1.pb")), bytes);
  EXPECT_THAT(Entries(), ElementsAre("job-1.pb"));

  ASSERT_TRUE(WriteFileDurably(Path("empty"), "").ok());
  EXPECT_TRUE(fs::exists(Path("empty")));
  EXPECT_EQ(fs::file_size(Path("empty")), 0u);
}

TEST_F(DurableFileTest, ReplaceModeReplacesAnExistingFile) {
  std::ofstream(Path("table")) << "old and longer than the new content";
  ASSERT_TRUE(WriteFileDurably(Path("table"), "new").ok());
  EXPECT_EQ(Read(Path("table")), "new");
  EXPECT_THAT(Entries(), ElementsAre("table"));
}

TEST_F(DurableFileTest, NoOverwriteModeRefusesAnExistingFileAndKeepsIt) {
  ASSERT_TRUE(WriteFileDurably(Path("stage-0.pt"), "first", NoOverwrite()).ok());
  absl::Status again = WriteFileDurably(Path("stage-0.pt"), "second", NoOverwrite());
  EXPECT_EQ(again.code(), absl::StatusCode::kAlreadyExists) << again;
  EXPECT_EQ(again.message(), absl::StrCat("checkpoint file ", Path("stage-0.pt"),
                                          " already exists; it is not overwritten"));
  EXPECT_EQ(Read(Path("stage-0.pt")), "first");
  EXPECT_THAT(Entries(), ElementsAre("stage-0.pt"));
}

TEST_F(DurableFileTest, NoOverwriteModeRefusesATargetThatAppearsWhileWriting) {
  auto writer = DurableFileWriter::Create(Path("manifest.json"), NoOverwrite());
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE((*writer)->Append("mine").ok());
  std::ofstream(Path("manifest.json")) << "theirs";  // another writer got there first
  absl::Status committed = (*writer)->Commit();
  EXPECT_EQ(committed.code(), absl::StatusCode::kAlreadyExists) << committed;
  EXPECT_THAT(std::string(committed.message()), HasSubstr(Path("manifest.json")));
  EXPECT_EQ(Read(Path("manifest.json")), "theirs");
  EXPECT_THAT(Entries(), ElementsAre("manifest.json"));
}

TEST_F(DurableFileTest, OfConcurrentNoOverwriteWritersExactlyOneSucceeds) {
  constexpr int kWriters = 8;
  std::vector<absl::Status> results(kWriters);
  std::vector<std::thread> threads;
  for (int i = 0; i < kWriters; ++i) {
    threads.emplace_back([&, i] {
      results[i] =
          WriteFileDurably(Path("manifest.json"), absl::StrCat("writer ", i), NoOverwrite());
    });
  }
  for (auto& t : threads) t.join();
  int won = -1;
  for (int i = 0; i < kWriters; ++i) {
    if (results[i].ok()) {
      EXPECT_EQ(won, -1) << "writers " << won << " and " << i << " both succeeded";
      won = i;
    } else {
      EXPECT_EQ(results[i].code(), absl::StatusCode::kAlreadyExists) << results[i];
    }
  }
  ASSERT_NE(won, -1);
  EXPECT_EQ(Read(Path("manifest.json")), absl::StrCat("writer ", won));
  EXPECT_THAT(Entries(), ElementsAre("manifest.json"));
}

TEST_F(DurableFileTest, WriterInPiecesAppearsOnlyAtCommit) {
  auto writer = DurableFileWriter::Create(Path("artifact"));
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE((*writer)->Append("abc").ok());
  ASSERT_TRUE((*writer)->Append("").ok());
  ASSERT_TRUE((*writer)->Append("def").ok());
  EXPECT_EQ((*writer)->bytes_written(), 6);
  EXPECT_FALSE(fs::exists(Path("artifact")));
  EXPECT_TRUE(fs::exists((*writer)->temp_path()));
  EXPECT_EQ(fs::path((*writer)->temp_path()).parent_path(), fs::path(dir_));
  ASSERT_TRUE((*writer)->Commit().ok());
  EXPECT_EQ(Read(Path("artifact")), "abcdef");
  EXPECT_THAT(Entries(), ElementsAre("artifact"));
  EXPECT_EQ((*writer)->Append("more").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*writer)->Commit().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Read(Path("artifact")), "abcdef");
}

TEST_F(DurableFileTest, AnAbandonedOrDiscardedWriterLeavesNothing) {
  std::ofstream(Path("kept")) << "as it was";
  {
    auto writer = DurableFileWriter::Create(Path("never"));
    ASSERT_TRUE(writer.ok()) << writer.status();
    ASSERT_TRUE((*writer)->Append("half").ok());
  }
  auto discarded = DurableFileWriter::Create(Path("kept"));
  ASSERT_TRUE(discarded.ok()) << discarded.status();
  ASSERT_TRUE((*discarded)->Append("replacement").ok());
  (*discarded)->Discard();
  (*discarded)->Discard();
  EXPECT_EQ((*discarded)->Commit().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Read(Path("kept")), "as it was");
  EXPECT_THAT(Entries(), ElementsAre("kept"));
}

TEST_F(DurableFileTest, TemporaryFilesCarryTheGivenPrefix) {
  DurableFileOptions options;
  options.temp_prefix = ".upload-";
  auto writer = DurableFileWriter::Create(Path("0123"), options);
  ASSERT_TRUE(writer.ok()) << writer.status();
  const std::string temp = fs::path((*writer)->temp_path()).filename().string();
  EXPECT_EQ(temp.rfind(".upload-", 0), 0u) << temp;
  EXPECT_EQ(temp.substr(temp.size() - 4), ".tmp") << temp;
  auto other = DurableFileWriter::Create(Path("0123"), options);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_NE((*other)->temp_path(), (*writer)->temp_path());
  EXPECT_THAT(Entries(), UnorderedElementsAre(temp, fs::path((*other)->temp_path()).filename()));
}

TEST_F(DurableFileTest, ErrorsNameThePathAndTheReason) {
  const std::string missing_dir = Path("no-such-dir/job-1.pb");
  absl::Status s = WriteFileDurably(missing_dir, "x");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(missing_dir));
  EXPECT_THAT(std::string(s.message()), HasSubstr("No such file or directory"));

  std::ofstream(Path("a-file")) << "not a directory";
  DurableFileOptions options = NoOverwrite();
  options.what = "checkpoint manifest";
  const std::string under_file = Path("a-file/manifest.json");
  s = WriteFileDurably(under_file, "x", options);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("checkpoint manifest " + under_file));
  EXPECT_THAT(std::string(s.message()), HasSubstr("Not a directory"));

  // A directory where the file should go: the rename fails, the directory stays.
  fs::create_directory(Path("taken"));
  s = WriteFileDurably(Path("taken"), "x");
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr(Path("taken")));
  EXPECT_TRUE(fs::is_directory(Path("taken")));
  EXPECT_THAT(Entries(), UnorderedElementsAre("a-file", "taken"));
}

}  // namespace
}  // namespace stagecoach::durable_file_test
