// The coordinator's view of in-memory snapshots (coordinator/snapshots/): a snapshot completes
// only once every rank's files are on two workers, reports of another attempt or with bad
// files are refused, and a restart from one runs each rank on a worker holding its files and
// moves the lost ones' files from the workers that kept copies.
#include "coordinator/snapshots/snapshot_copies.h"

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "coordinator/snapshots/snapshot_placement.h"
#include "gtest/gtest.h"

namespace stagecoach::coordinator {
namespace {

const std::string kSha(64, 'a');

v1::SnapshotCopy Copy(int rank, int stage) {
  v1::SnapshotCopy copy;
  copy.set_rank(rank);
  v1::StageCheckpointFile* f = copy.add_files();
  f->set_stage(stage);
  f->set_file("stage-" + std::to_string(stage) + ".pt");
  f->set_size_bytes(100 + stage);
  f->set_sha256(kSha);
  return copy;
}

google::protobuf::RepeatedPtrField<v1::SnapshotCopy> Held(std::vector<v1::SnapshotCopy> copies) {
  google::protobuf::RepeatedPtrField<v1::SnapshotCopy> held;
  for (auto& c : copies) *held.Add() = std::move(c);
  return held;
}

const absl::Time kNow = absl::FromUnixSeconds(1000);

TEST(SnapshotCopiesTest, CompletesOnceEveryRankIsOnTwoWorkers) {
  SnapshotCopies copies;
  copies.StartAttempt(1, 2);
  // w-1 runs rank 0 and keeps rank 1's copy; w-2 runs rank 1 and keeps rank 0's.
  EXPECT_FALSE(*copies.Record("w-1", 0, 1, 5, Held({Copy(0, 0)}), kNow));
  EXPECT_FALSE(*copies.Record("w-2", 1, 1, 5, Held({Copy(1, 1), Copy(0, 0)}), kNow));
  EXPECT_FALSE(copies.latest().has_value()) << "rank 1 is on one worker";
  EXPECT_EQ(copies.KeepFrom(), 5);
  EXPECT_TRUE(*copies.Record("w-1", 0, 1, 5, Held({Copy(0, 0), Copy(1, 1)}), kNow));
  ASSERT_TRUE(copies.latest().has_value());
  EXPECT_EQ(copies.latest()->step(), 5);
  EXPECT_EQ(copies.latest()->bytes(), 201);
  ASSERT_EQ(copies.latest()->ranks_size(), 2);
  EXPECT_EQ(copies.latest()->ranks(0).worker_ids_size(), 2);
  EXPECT_EQ(copies.KeepFrom(), 5);
  // A worker that restored rank 1 from it holds it too.
  EXPECT_FALSE(*copies.Record("w-3", 1, 1, 5, Held({Copy(1, 1)}), kNow));
  EXPECT_EQ(copies.latest()->ranks(1).worker_ids_size(), 3);
  v1::SnapshotCopy other = Copy(1, 1);
  other.mutable_files(0)->set_size_bytes(1);
  EXPECT_EQ(copies.Record("w-4", 1, 1, 5, Held({other}), kNow).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A repeated report changes nothing; an older step is already superseded.
  EXPECT_FALSE(*copies.Record("w-1", 0, 1, 5, Held({Copy(0, 0)}), kNow));
  EXPECT_FALSE(*copies.Record("w-1", 0, 1, 4, Held({Copy(0, 0)}), kNow));
}

TEST(SnapshotCopiesTest, TheWorkerRunningARankIsListedFirst) {
  SnapshotCopies copies;
  copies.StartAttempt(1, 2);
  // w-1 (rank 0) reports rank 1's copy before w-2 (rank 1) reports its own.
  ASSERT_TRUE(copies.Record("w-1", 0, 1, 5, Held({Copy(0, 0), Copy(1, 1)}), kNow).ok());
  ASSERT_TRUE(*copies.Record("w-2", 1, 1, 5, Held({Copy(1, 1), Copy(0, 0)}), kNow));
  EXPECT_EQ(copies.latest()->ranks(0).worker_ids(0), "w-1");
  EXPECT_EQ(copies.latest()->ranks(1).worker_ids(0), "w-2");
}

TEST(SnapshotCopiesTest, OneRankNeedsOneCopy) {
  SnapshotCopies copies;
  copies.StartAttempt(3, 1);
  EXPECT_TRUE(*copies.Record("w-1", 0, 3, 10, Held({Copy(0, 0)}), kNow));
}

TEST(SnapshotCopiesTest, RefusesOtherAttemptsAndBadReports) {
  SnapshotCopies copies;
  copies.StartAttempt(2, 2);
  EXPECT_EQ(copies.Record("w-1", 0, 1, 5, Held({Copy(0, 0)}), kNow).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(copies.Record("w-1", 0, 2, 5, Held({Copy(2, 2)}), kNow).status().code(),
            absl::StatusCode::kInvalidArgument);
  v1::SnapshotCopy bad = Copy(0, 0);
  bad.mutable_files(0)->set_file("../stage-0.pt");
  EXPECT_EQ(copies.Record("w-1", 0, 2, 5, Held({bad}), kNow).status().code(),
            absl::StatusCode::kInvalidArgument);
  v1::SnapshotCopy no_sha = Copy(0, 0);
  no_sha.mutable_files(0)->set_sha256("x");
  EXPECT_EQ(copies.Record("w-1", 0, 2, 5, Held({no_sha}), kNow).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Two workers holding different bytes of one rank.
  ASSERT_TRUE(copies.Record("w-1", 0, 2, 5, Held({Copy(0, 0)}), kNow).ok());
  v1::SnapshotCopy other = Copy(0, 0);
  other.mutable_files(0)->set_size_bytes(7);
  absl::StatusOr<bool> differs = copies.Record("w-2", 1, 2, 5, Held({other}), kNow);
  EXPECT_EQ(differs.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(differs.status().message().find("w-2"), std::string::npos);
}

TEST(SnapshotCopiesTest, NewAttemptKeepsTheLatestAndDropsThePending) {
  SnapshotCopies copies;
  copies.StartAttempt(1, 1);
  ASSERT_TRUE(*copies.Record("w-1", 0, 1, 5, Held({Copy(0, 0)}), kNow));
  copies.StartAttempt(2, 1);
  EXPECT_EQ(copies.latest()->step(), 5);
  copies.DropLatest();
  EXPECT_EQ(copies.KeepFrom(), -1);
}

v1::JobSnapshot TwoRanks() {
  v1::JobSnapshot snapshot;
  snapshot.set_step(20);
  v1::SnapshotCopy r0 = Copy(0, 0);
  r0.add_worker_ids("w-1");
  r0.add_worker_ids("w-2");
  v1::SnapshotCopy r1 = Copy(1, 1);
  r1.add_worker_ids("w-2");
  r1.add_worker_ids("w-1");
  *snapshot.add_ranks() = r0;
  *snapshot.add_ranks() = r1;
  return snapshot;
}

TEST(SnapshotPlacementTest, RanksGoBackToTheWorkersHoldingTheirFiles) {
  const auto placed = PlaceOnSnapshot(TwoRanks(), {{0}, {1}}, {"w-3", "w-2", "w-1"});
  ASSERT_TRUE(placed.has_value());
  // Each rank back on the worker that ran it (the first of its holders), whatever the order.
  EXPECT_EQ(placed->workers, (std::vector<int>{2, 1}));
  ASSERT_EQ(placed->transfers.size(), 2u);
  for (const v1::SnapshotTransfer& t : placed->transfers) EXPECT_EQ(t.from_rank(), t.to_rank());
}

TEST(SnapshotPlacementTest, ALostWorkersRankTakesASpareAndItsFilesFromTheCopy) {
  // w-2 (rank 1) is lost: rank 0 stays on w-1, rank 1 goes to the spare w-3 and receives its
  // file from rank 0's worker, which kept the copy.
  const auto placed = PlaceOnSnapshot(TwoRanks(), {{0}, {1}}, {"w-1", "w-3"});
  ASSERT_TRUE(placed.has_value());
  EXPECT_EQ(placed->workers, (std::vector<int>{0, 1}));
  ASSERT_EQ(placed->transfers.size(), 2u);
  EXPECT_EQ(placed->transfers[1].to_rank(), 1);
  EXPECT_EQ(placed->transfers[1].from_rank(), 0);
  EXPECT_EQ(placed->transfers[1].file().file(), "stage-1.pt");
}

TEST(SnapshotPlacementTest, TheSurvivorKeepsItsRankWhenTheFirstRanksWorkerIsLost) {
  // w-1 (rank 0) is lost; w-2 holds both ranks' files but stays rank 1, the spare takes rank 0.
  const auto placed = PlaceOnSnapshot(TwoRanks(), {{0}, {1}}, {"w-2", "w-3"});
  ASSERT_TRUE(placed.has_value());
  EXPECT_EQ(placed->workers, (std::vector<int>{1, 0}));
  EXPECT_EQ(placed->transfers[0].from_rank(), 1);
  EXPECT_EQ(placed->transfers[0].to_rank(), 0);
  EXPECT_EQ(placed->transfers[1].from_rank(), 1);
}

TEST(SnapshotPlacementTest, TiedCopyComesFromStageZerosHolder) {
  const auto placed = PlaceOnSnapshot(TwoRanks(), {{0}, {1, 0}}, {"w-1", "w-3"});
  ASSERT_TRUE(placed.has_value());
  ASSERT_EQ(placed->transfers.size(), 3u);
  EXPECT_EQ(placed->transfers[2].file().file(), "stage-0.pt");
  EXPECT_EQ(placed->transfers[2].to_rank(), 1);
  EXPECT_EQ(placed->transfers[2].from_rank(), 0);
}

TEST(SnapshotPlacementTest, NoneWhenAFileHasNoFreeHolderOrTooFewWorkers) {
  EXPECT_FALSE(PlaceOnSnapshot(TwoRanks(), {{0}, {1}}, {"w-3", "w-4"}).has_value());
  EXPECT_FALSE(PlaceOnSnapshot(TwoRanks(), {{0}, {1}}, {"w-1"}).has_value());
  EXPECT_FALSE(PlaceOnSnapshot(TwoRanks(), {{0}, {1}, {2}}, {"w-1", "w-2", "w-3"}).has_value())
      << "stage 2 is in no copy";
}

}  // namespace
}  // namespace stagecoach::coordinator
