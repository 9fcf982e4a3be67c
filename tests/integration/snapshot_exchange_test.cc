// In-memory snapshots on the worker (worker/runtime/snapshot/): the worker's store (two steps a
// job at most, what the coordinator says to keep), the exchange of snapshot files between ranks
// over real Gloo transports (ranks as threads), with every file's SHA-256 checked, and an
// attempt's restore exchange, where a rank on a new worker receives its files from the worker
// that kept a copy.
#include "worker/runtime/snapshot/snapshot_exchange.h"

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/util/sha256.h"
#include "gtest/gtest.h"
#include "worker/runtime/snapshot/snapshot_restore.h"
#include "worker/runtime/snapshot/snapshot_store.h"
#include "worker/transport/gloo/factory.h"
#include "worker/transport/in_memory_store.h"

namespace stagecoach::runtime {
namespace {

using transport::Transport;

SnapshotStore::Bytes Bytes(const std::string& text) {
  return std::make_shared<const std::vector<char>>(text.begin(), text.end());
}

v1::StageCheckpointFile Entry(int stage, const SnapshotStore::Bytes& bytes) {
  v1::StageCheckpointFile f;
  f.set_stage(stage);
  f.set_file(absl::StrCat("stage-", stage, ".pt"));
  f.set_size_bytes(static_cast<int64_t>(bytes->size()));
  f.set_sha256(Sha256Hex(absl::string_view(bytes->data(), bytes->size())));
  return f;
}

// Connects `world` Gloo ranks on threads, then runs `body(rank, transport)` on each.
void OnRanks(int world, const std::function<void(int, Transport&)>& body) {
  static std::atomic<int> groups{0};
  const std::string prefix = absl::StrCat("snapshots", groups++, "/");
  transport::InMemoryStore store;
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      transport::GlooOptions options;
      options.rank = r;
      options.world_size = world;
      options.key_prefix = prefix;
      options.connect_timeout = absl::Seconds(20);
      auto made = transport::CreateGlooTransport(options, &store);
      ASSERT_TRUE(made.ok()) << made.status();
      body(r, **made);
    });
  }
  for (auto& t : threads) t.join();
}

TEST(SnapshotStoreTest, KeepsWhatTheCoordinatorSaysAndAtMostThreeSteps) {
  SnapshotStore store;
  const auto a = Bytes("aaaa");
  store.Put("job-1", 5, 0, Entry(0, a), a);
  store.Put("job-1", 5, 1, Entry(1, Bytes("bb")), Bytes("bb"));
  store.Put("job-2", 3, 0, Entry(0, a), a);
  EXPECT_EQ(store.bytes(), 10);
  ASSERT_TRUE(store.Get("job-1", 5, "stage-0.pt").ok());
  EXPECT_EQ(std::string((*store.Get("job-1", 5, "stage-0.pt"))->data(), 4), "aaaa");
  const std::vector<v1::SnapshotCopy> held = store.Held("job-1", 5);
  ASSERT_EQ(held.size(), 2u);
  EXPECT_EQ(held[1].rank(), 1);
  EXPECT_EQ(held[1].files(0).file(), "stage-1.pt");
  // Until the coordinator names a complete one, a rank may be ahead: three steps are kept.
  store.Put("job-1", 10, 0, Entry(0, a), a);
  store.Put("job-1", 15, 0, Entry(0, a), a);
  EXPECT_TRUE(store.Get("job-1", 5, "stage-0.pt").ok());
  store.Put("job-1", 20, 0, Entry(0, a), a);  // a fourth drops the oldest
  EXPECT_EQ(store.Get("job-1", 5, "stage-0.pt").status().code(), absl::StatusCode::kNotFound);
  // The coordinator's latest complete snapshot is 15: older ones go, and two steps are kept.
  store.KeepFrom("job-1", 15);
  EXPECT_FALSE(store.Get("job-1", 10, "stage-0.pt").ok());
  EXPECT_TRUE(store.Get("job-1", 15, "stage-0.pt").ok());
  store.Put("job-1", 25, 0, Entry(0, a), a);
  EXPECT_TRUE(store.Get("job-1", 15, "stage-0.pt").ok()) << "still the latest complete one";
  // A new attempt restarting from 15 drops what the failed one left after it.
  store.DropAfter("job-1", 15);
  EXPECT_FALSE(store.Get("job-1", 20, "stage-0.pt").ok());
  EXPECT_FALSE(store.Get("job-1", 25, "stage-0.pt").ok());
  store.KeepFrom("job-2", -1);
  EXPECT_EQ(store.Jobs(), std::vector<std::string>{"job-1"});
  EXPECT_EQ(store.bytes(), 4);
}

TEST(SnapshotExchangeTest, EachRankKeepsItsSuccessorsCopyOnARing) {
  constexpr int kWorld = 3;
  std::vector<std::map<int, std::vector<SnapshotFile>>> got(kWorld);
  OnRanks(kWorld, [&](int r, Transport& t) {
    const auto bytes = Bytes(std::string(1000 + r * 37, static_cast<char>('a' + r)));
    std::map<int, std::vector<SnapshotFile>> out;
    out[(r + 1) % kWorld] = {SnapshotFile{r, Entry(r, bytes), bytes}};
    auto received = ExchangeSnapshotFiles(t, out, {(r + kWorld - 1) % kWorld}, absl::Seconds(20));
    ASSERT_TRUE(received.ok()) << received.status();
    got[r] = *std::move(received);
  });
  for (int r = 0; r < kWorld; ++r) {
    const int from = (r + kWorld - 1) % kWorld;
    ASSERT_EQ(got[r].size(), 1u);
    const std::vector<SnapshotFile>& files = got[r].at(from);
    ASSERT_EQ(files.size(), 1u);
    EXPECT_EQ(files[0].rank, from);
    EXPECT_EQ(files[0].entry.file(), absl::StrCat("stage-", from, ".pt"));
    EXPECT_EQ(files[0].bytes->size(), 1000u + from * 37);
    EXPECT_EQ((*files[0].bytes)[0], static_cast<char>('a' + from));
  }
}

TEST(SnapshotExchangeTest, BytesThatDoNotMatchTheirEntryAreRefused) {
  absl::Status status;
  OnRanks(2, [&](int r, Transport& t) {
    if (r == 0) {
      const auto bytes = Bytes("the real bytes");
      v1::StageCheckpointFile entry = Entry(0, bytes);
      entry.set_sha256(std::string(64, '0'));
      std::map<int, std::vector<SnapshotFile>> out;
      out[1] = {SnapshotFile{0, entry, bytes}};
      EXPECT_TRUE(ExchangeSnapshotFiles(t, out, {}, absl::Seconds(20)).ok());
    } else {
      status = ExchangeSnapshotFiles(t, {}, {0}, absl::Seconds(20)).status();
    }
  });
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(status.message().find("stage-0.pt"), std::string::npos) << status;
}

// A two-rank attempt restarting from the snapshot after step 20: rank 0 is back on the worker
// that held both ranks' files, rank 1 on a new worker with an empty store.
v1::TaskAssignment RestoreTask(int rank, const std::vector<v1::StageCheckpointFile>& entries) {
  v1::TaskAssignment task;
  task.set_job_id("job-7");
  task.set_rank(rank);
  task.set_world_size(2);
  task.mutable_resume()->set_step(20);
  for (int s = 0; s < 2; ++s) {
    v1::SnapshotTransfer* t = task.mutable_resume()->mutable_snapshot()->add_transfers();
    *t->mutable_file() = entries[s];
    t->set_from_rank(0);
    t->set_to_rank(s);
  }
  return task;
}

TEST(SnapshotRestoreTest, ANewWorkerReceivesItsFilesFromTheCopy) {
  const auto zero = Bytes(std::string(5000, 'z'));
  const auto one = Bytes(std::string(7000, 'o'));
  const std::vector<v1::StageCheckpointFile> entries = {Entry(0, zero), Entry(1, one)};
  SnapshotStore kept;  // rank 0's worker: its own files and rank 1's copy
  kept.Put("job-7", 20, 0, entries[0], zero);
  kept.Put("job-7", 20, 1, entries[1], one);
  SnapshotStore fresh;  // the spare that takes rank 1
  std::vector<absl::StatusOr<StateFiles>> files(2, absl::UnknownError("not run"));
  OnRanks(2, [&](int r, Transport& t) {
    files[r] = ExchangeSnapshotForRestore(RestoreTask(r, entries), r == 0 ? kept : fresh, &t,
                                          absl::Seconds(20));
  });
  ASSERT_TRUE(files[0].ok()) << files[0].status();
  ASSERT_TRUE(files[1].ok()) << files[1].status();
  ASSERT_TRUE(files[0]->Read("stage-0.pt").ok());
  auto received = files[1]->Read("stage-1.pt");
  ASSERT_TRUE(received.ok()) << received.status();
  EXPECT_EQ(**received, *one);
  EXPECT_EQ(files[1]->Read("stage-0.pt").status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(files[1]->name().find("after step 20"), std::string::npos);
}

TEST(SnapshotRestoreTest, AFileThisWorkerDoesNotHoldIsNamed) {
  const auto zero = Bytes("zero");
  const std::vector<v1::StageCheckpointFile> entries = {Entry(0, zero), Entry(1, Bytes("one"))};
  SnapshotStore empty;
  v1::TaskAssignment task = RestoreTask(0, entries);
  task.mutable_resume()->mutable_snapshot()->mutable_transfers()->DeleteSubrange(1, 1);
  task.set_world_size(1);
  absl::StatusOr<StateFiles> files =
      ExchangeSnapshotForRestore(task, empty, nullptr, absl::Seconds(1));
  EXPECT_EQ(files.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(files.status().message().find("stage-0.pt"), std::string::npos) << files.status();
}

}  // namespace
}  // namespace stagecoach::runtime
