// The coordinator's artifact store on a real directory: round trip, content addressing, size
// and checksum mismatches refused with nothing stored, the size limit (in the header and as
// bytes arrive), unknown and malformed ids, and concurrent uploads of the same bytes.
#include "coordinator/service/artifact_store.h"

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stagecoach::coordinator::artifact_store_test {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::string out(n, '\0');
  for (char& c : out) c = static_cast<char>(gen() & 0xff);
  return out;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Every file in `dir`, temporary ones included.
std::vector<std::string> Files(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& entry : fs::directory_iterator(dir)) {
    out.push_back(entry.path().filename().string());
  }
  return out;
}

class ArtifactStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("artifact_store_test-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    ArtifactStoreOptions options;
    options.dir = dir_.string();
    options.max_bytes = 1000;
    auto store = ArtifactStore::Open(options);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
  }
  void TearDown() override {
    store_.reset();
    fs::remove_all(dir_);
  }

  fs::path dir_;
  std::unique_ptr<ArtifactStore> store_;
};

TEST_F(ArtifactStoreTest, RoundTripInChunks) {
  const std::string bytes = RandomBytes(777, 1);
  auto upload = store_->BeginUpload("some/dir/model.pt", 777, Sha256Hex(bytes));
  ASSERT_TRUE(upload.ok()) << upload.status();
  for (size_t at = 0; at < bytes.size(); at += 100) {
    ASSERT_TRUE((*upload)->Append(absl::string_view(bytes).substr(at, 100)).ok());
  }
  auto info = (*upload)->Commit();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->id, Sha256Hex(bytes));
  EXPECT_EQ(info->uri, "artifact:" + Sha256Hex(bytes));
  EXPECT_EQ(info->name, "model.pt");
  EXPECT_EQ(info->size_bytes, 777);
  EXPECT_EQ(ReadAll(info->path), bytes);
  EXPECT_EQ(fs::path(info->path).parent_path(), dir_);

  for (const std::string& ref : {info->id, info->uri}) {
    auto found = store_->Lookup(ref);
    ASSERT_TRUE(found.ok()) << found.status();
    EXPECT_EQ(found->id, info->id);
    EXPECT_EQ(found->name, "model.pt");
    EXPECT_EQ(found->size_bytes, 777);
    EXPECT_EQ(ReadAll(found->path), bytes);
  }
  // Only the artifact itself is left in the directory.
  EXPECT_THAT(Files(dir_.string()), ::testing::ElementsAre(info->id));
}

TEST_F(ArtifactStoreTest, SameBytesGiveTheSameId) {
  const std::string bytes = RandomBytes(300, 2);
  auto first = store_->Put("a.bin", bytes, Sha256Hex(bytes));
  auto second = store_->Put("b.bin", bytes, Sha256Hex(bytes));
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(first->id, second->id);
  EXPECT_EQ(first->path, second->path);
  EXPECT_EQ(Files(dir_.string()).size(), 1u);
  auto other = store_->Put("c.bin", bytes + "x", Sha256Hex(bytes + "x"));
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_NE(other->id, first->id);
  EXPECT_EQ(Files(dir_.string()).size(), 2u);
}

TEST_F(ArtifactStoreTest, EmptyFileIsAnArtifact) {
  auto info = store_->Put("empty", "", Sha256Hex(""));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->size_bytes, 0);
  EXPECT_TRUE(store_->Lookup(info->id).ok());
}

TEST_F(ArtifactStoreTest, FewerBytesThanTheHeaderSaysAreRefused) {
  const std::string bytes = RandomBytes(200, 3);
  auto upload = store_->BeginUpload("d.bin", 201, Sha256Hex(bytes));
  ASSERT_TRUE(upload.ok()) << upload.status();
  ASSERT_TRUE((*upload)->Append(bytes).ok());
  auto info = (*upload)->Commit();
  ASSERT_EQ(info.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(info.status().message(), HasSubstr("size"));
  EXPECT_THAT(info.status().message(), HasSubstr("201"));
  EXPECT_THAT(info.status().message(), HasSubstr("200"));
  EXPECT_TRUE(Files(dir_.string()).empty());
  EXPECT_EQ(store_->Lookup(Sha256Hex(bytes)).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ArtifactStoreTest, MoreBytesThanTheHeaderSaysAreRefused) {
  const std::string bytes = RandomBytes(200, 4);
  auto upload = store_->BeginUpload("d.bin", 150, Sha256Hex(bytes));
  ASSERT_TRUE(upload.ok()) << upload.status();
  ASSERT_TRUE((*upload)->Append(bytes.substr(0, 100)).ok());
  absl::Status s = (*upload)->Append(bytes.substr(100));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("size_bytes (150)"));
  upload->reset();
  EXPECT_TRUE(Files(dir_.string()).empty());
}

TEST_F(ArtifactStoreTest, ChecksumMismatchIsRefusedAndNothingIsStored) {
  std::string bytes = RandomBytes(500, 5);
  const std::string declared = Sha256Hex(bytes);
  bytes[250] ^= 0x01;
  auto info = store_->Put("m.pt", bytes, declared);
  ASSERT_EQ(info.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(info.status().message(), HasSubstr("sha256"));
  EXPECT_THAT(info.status().message(), HasSubstr(declared));
  EXPECT_THAT(info.status().message(), HasSubstr(Sha256Hex(bytes)));
  EXPECT_TRUE(Files(dir_.string()).empty());
  EXPECT_EQ(store_->Lookup(declared).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->Lookup(Sha256Hex(bytes)).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ArtifactStoreTest, OverTheLimitInTheHeader) {
  auto upload = store_->BeginUpload("big.pt", 1001, Sha256Hex("x"));
  ASSERT_EQ(upload.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(upload.status().message(), HasSubstr("1001"));
  EXPECT_THAT(upload.status().message(), HasSubstr("limit of 1000 bytes"));
  EXPECT_TRUE(Files(dir_.string()).empty());
  // Exactly at the limit is fine.
  const std::string bytes = RandomBytes(1000, 6);
  EXPECT_TRUE(store_->Put("max.pt", bytes, Sha256Hex(bytes)).ok());
}

TEST_F(ArtifactStoreTest, OverTheLimitAsBytesArrive) {
  // The header claims little; the bytes keep coming past the limit.
  auto upload = store_->BeginUpload("liar.pt", 10, Sha256Hex("x"));
  ASSERT_TRUE(upload.ok()) << upload.status();
  absl::Status s = (*upload)->Append(RandomBytes(1001, 7));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("limit of 1000 bytes"));
  EXPECT_TRUE(Files(dir_.string()).empty());
}

TEST_F(ArtifactStoreTest, MalformedHeaders) {
  EXPECT_EQ(store_->BeginUpload("a", -1, Sha256Hex("")).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto bad_sha = store_->BeginUpload("a", 1, "ABC");
  EXPECT_EQ(bad_sha.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_sha.status().message(), HasSubstr("header.sha256"));
}

TEST_F(ArtifactStoreTest, UnknownAndMalformedIds) {
  const std::string id = Sha256Hex("never uploaded");
  auto missing = store_->Lookup("artifact:" + id);
  ASSERT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr(id));
  auto malformed = store_->Lookup("artifact:not-a-digest");
  EXPECT_EQ(malformed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(malformed.status().message(), HasSubstr("not-a-digest"));
  // A temporary file is never mistaken for an artifact.
  EXPECT_EQ(store_->Lookup("../" + id).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ArtifactStoreTest, AbandonedUploadLeavesNothing) {
  {
    auto upload = store_->BeginUpload("gone.pt", 100, Sha256Hex("y"));
    ASSERT_TRUE(upload.ok());
    ASSERT_TRUE((*upload)->Append("half").ok());
    EXPECT_EQ(Files(dir_.string()).size(), 1u);  // the temporary file
  }
  EXPECT_TRUE(Files(dir_.string()).empty());
}

TEST_F(ArtifactStoreTest, ConcurrentUploadsOfTheSameBytes) {
  const std::string bytes = RandomBytes(900, 8);
  std::vector<std::thread> threads;
  std::vector<absl::Status> results(8);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      auto upload = store_->BeginUpload("same.pt", 900, Sha256Hex(bytes));
      if (!upload.ok()) {
        results[t] = upload.status();
        return;
      }
      for (size_t at = 0; at < bytes.size(); at += 64) {
        if (absl::Status s = (*upload)->Append(absl::string_view(bytes).substr(at, 64)); !s.ok()) {
          results[t] = s;
          return;
        }
      }
      results[t] = (*upload)->Commit().status();
    });
  }
  for (auto& t : threads) t.join();
  for (const absl::Status& s : results) EXPECT_TRUE(s.ok()) << s;
  EXPECT_THAT(Files(dir_.string()), ::testing::ElementsAre(Sha256Hex(bytes)));
  EXPECT_EQ(ReadAll((dir_ / Sha256Hex(bytes)).string()), bytes);
}

TEST(ArtifactStoreDir, ArtifactsSurviveReopeningAndStaleUploadsAreRemoved) {
  const fs::path dir =
      fs::temp_directory_path() / ("artifact_store_reopen-" + std::to_string(getpid()));
  fs::remove_all(dir);
  const std::string bytes = RandomBytes(64, 9);
  {
    auto store = ArtifactStore::Open({dir.string(), 1000});
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->Put("k.bin", bytes, Sha256Hex(bytes)).ok());
    std::ofstream(dir / ".upload-123-0.tmp") << "left by a crash";
  }
  auto store = ArtifactStore::Open({dir.string(), 1000});
  ASSERT_TRUE(store.ok()) << store.status();
  auto info = (*store)->Lookup(Sha256Hex(bytes));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(ReadAll(info->path), bytes);
  EXPECT_THAT(Files(dir.string()), ::testing::ElementsAre(Sha256Hex(bytes)));
  store->reset();
  fs::remove_all(dir);
}

TEST(ArtifactStoreDir, PrivateDirectoryIsRemovedWithTheStore) {
  auto store = ArtifactStore::Open({});
  ASSERT_TRUE(store.ok()) << store.status();
  const std::string dir = (*store)->dir();
  EXPECT_TRUE(fs::is_directory(dir));
  ASSERT_TRUE((*store)->Put("x", "abc", Sha256Hex("abc")).ok());
  store->reset();
  EXPECT_FALSE(fs::exists(dir));
}

TEST(ArtifactStoreDir, RejectsANonPositiveLimit) {
  EXPECT_EQ(ArtifactStore::Open({"", 0}).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace stagecoach::coordinator::artifact_store_test
