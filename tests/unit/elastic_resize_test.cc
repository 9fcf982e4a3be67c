// When an elastic job is re-planned and where its next attempt starts from
// (coordinator/elastic/elastic_resize.h): a RESTARTING 4-rank job with 3 free workers is
// re-planned only once restart.wait has passed; it continues from its latest complete in-memory
// snapshot when that is newer than its starting point and covered by its recorded losses, each
// new stage reading the old stages that hold its layers (by name); otherwise its snapshots are
// forgotten and it starts from its checkpoint or initial parameters. A stale order changes
// nothing.
#include "coordinator/elastic/elastic_resize.h"

#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/elastic_specs.h"
#include "tests/unit/spec_test_util.h"

namespace stagecoach::coordinator::elastic_resize_test {
namespace {

using ::testing::HasSubstr;

const absl::Time kLost = absl::FromUnixSeconds(5000);

google::protobuf::RepeatedPtrField<v1::SnapshotCopy> Held(const std::vector<int>& ranks) {
  google::protobuf::RepeatedPtrField<v1::SnapshotCopy> held;
  for (int r : ranks) {
    v1::SnapshotCopy* copy = held.Add();
    copy->set_rank(r);
    v1::StageCheckpointFile* f = copy->add_files();
    f->set_stage(r);  // one stage a rank
    f->set_file("stage-" + std::to_string(r) + ".pt");
    f->set_size_bytes(100);
    f->set_sha256(std::string(64, 'a'));
  }
  return held;
}

class ElasticResizeTest : public ::testing::Test {
 protected:
  // A 4-rank job of kFourStageElasticJob that lost w-4 (rank 3) after `losses` steps, with the
  // snapshot after `snapshot_step` complete (each rank's worker holds its own files and the
  // previous rank's), RESTARTING since kLost; w-1..w-3 free.
  Job& LostJob(int losses, int64_t snapshot_step) {
    absl::MutexLock lock(&table_.mu());
    Job& job = table_.CreateLocked();
    job.spec_yaml = kFourStageElasticJob;
    job.spec = spec::Parsed(kFourStageElasticJob);
    auto plan = PlanJob(job.spec);
    EXPECT_TRUE(plan.ok()) << plan.status();
    job.plan = *plan;
    for (int w = 1; w <= 4; ++w) {
      auto id = registry_.Register("worker", "10.0.0." + std::to_string(w) + ":1", "cpu",
                                   {job.plan.transport}, kLost);
      EXPECT_TRUE(id.ok()) << id.status();
    }
    EXPECT_TRUE(registry_.MarkLost("w-4", "killed"));
    job.attempt = 1;
    job.snapshots.StartAttempt(1, 4);
    for (int r = 0; r < 4; ++r) {
      auto made = job.snapshots.Record("w-" + std::to_string(r + 1), r, 1, snapshot_step,
                                       Held({r, (r + 3) % 4}), kLost);
      EXPECT_TRUE(made.ok()) << made.status();
    }
    EXPECT_TRUE(job.snapshots.latest().has_value());
    job.losses.assign(losses, 1.0);
    for (v1::JobState to : {v1::JOB_STATE_PLANNING, v1::JOB_STATE_PENDING, v1::JOB_STATE_STARTING,
                            v1::JOB_STATE_RUNNING, v1::JOB_STATE_RESTARTING}) {
      EXPECT_TRUE(job.TransitionTo(to, "test", kLost).ok());
    }
    return job;
  }

  std::vector<ResizeOrder> Resizes(absl::Time now) {
    absl::MutexLock lock(&table_.mu());
    return PlanResizesLocked(table_, registry_, now);
  }

  JobTable table_{JobTableOptions{}, nullptr};
  WorkerRegistry registry_{absl::Seconds(3)};
};

// The old stages (of `from`) whose layers overlap each stage of `to`.
std::vector<std::set<int>> Overlaps(const coordinator::Plan& from, const coordinator::Plan& to) {
  std::vector<std::set<int>> out(to.num_stages);
  for (int s = 0; s < to.num_stages; ++s) {
    for (int o = 0; o < from.num_stages; ++o) {
      if (from.stages[o].first_layer < to.stages[s].end_layer &&
          to.stages[s].first_layer < from.stages[o].end_layer) {
        out[s].insert(o);
      }
    }
  }
  return out;
}

TEST_F(ElasticResizeTest, AShrinkAfterTheWaitContinuesFromTheNewerSnapshotByName) {
  Job& job = LostJob(/*losses=*/13, /*snapshot_step=*/12);
  const coordinator::Plan own = job.plan;
  EXPECT_TRUE(Resizes(kLost + absl::Seconds(4)).empty()) << "restart.wait is 5 s";
  std::vector<ResizeOrder> orders = Resizes(kLost + absl::Seconds(6));
  ASSERT_EQ(orders.size(), 1u);
  const ResizeOrder& order = orders[0];
  EXPECT_EQ(order.workers, 3);
  EXPECT_FALSE(order.start.has_value()) << "no checkpoint";
  ASSERT_TRUE(order.snapshot.has_value());
  EXPECT_EQ(order.snapshot->step(), 12);
  EXPECT_TRUE(Resizes(kLost + absl::Seconds(7)).empty()) << "being re-planned";

  ResizeResult result = PrepareResize(order);
  ASSERT_TRUE(result.plan.ok()) << result.plan.status();
  ASSERT_EQ(result.plan->plan.num_stages, 3);
  ASSERT_TRUE(result.snapshot_layout.has_value());
  ASSERT_TRUE(result.snapshot_layout->ok()) << result.snapshot_layout->status();
  const ResumeLayout& layout = **result.snapshot_layout;
  EXPECT_TRUE(layout.by_name);
  const std::vector<std::set<int>> want = Overlaps(own, result.plan->plan);
  ASSERT_EQ(layout.stage_files.size(), 3u);
  for (int s = 0; s < 3; ++s) {
    std::set<int> read;
    for (const v1::StageCheckpointFile& f : layout.stage_files[s]) {
      EXPECT_EQ(f.file(), "stage-" + std::to_string(f.stage()) + ".pt");
      read.insert(f.stage());
    }
    EXPECT_EQ(read, want[s]) << "new stage " << s;
  }

  absl::MutexLock lock(&table_.mu());
  ASSERT_TRUE(ApplyResizeLocked(job, order, std::move(result)));
  EXPECT_EQ(job.plan.num_ranks, 3);
  EXPECT_TRUE(job.elastic.shrunk());
  EXPECT_EQ(job.elastic.own->plan.num_ranks, 4);
  EXPECT_EQ(job.elastic.relayout_snapshot_step, 12);
  EXPECT_EQ(job.elastic.relayout_snapshot_files.size(), 3u);
  ASSERT_TRUE(job.snapshots.latest().has_value()) << "the next attempt restores it";
  EXPECT_EQ(job.snapshots.latest()->step(), 12);
  EXPECT_THAT(job.reason, HasSubstr("continuing from the in-memory snapshot after step 12 (else "
                                    "its initial parameters)"));
}

TEST_F(ElasticResizeTest, ASnapshotPastTheRecordedLossesIsForgotten) {
  // Step 12's snapshot, but the losses on record end at step 11: the steps before it would
  // have no loss.
  Job& job = LostJob(/*losses=*/11, /*snapshot_step=*/12);
  std::vector<ResizeOrder> orders = Resizes(kLost + absl::Seconds(6));
  ASSERT_EQ(orders.size(), 1u);
  EXPECT_FALSE(orders[0].snapshot.has_value());
  ResizeResult result = PrepareResize(orders[0]);
  EXPECT_FALSE(result.snapshot_layout.has_value());
  absl::MutexLock lock(&table_.mu());
  ASSERT_TRUE(ApplyResizeLocked(job, orders[0], std::move(result)));
  EXPECT_EQ(job.elastic.relayout_snapshot_step, -1);
  EXPECT_FALSE(job.snapshots.latest().has_value()) << "of the old layout";
  EXPECT_THAT(job.reason, ::testing::EndsWith("continuing from its initial parameters"))
      << "nothing is restored by name";
}

TEST_F(ElasticResizeTest, AnOrderOfAnEarlierAttemptChangesNothing) {
  Job& job = LostJob(/*losses=*/13, /*snapshot_step=*/12);
  std::vector<ResizeOrder> orders = Resizes(kLost + absl::Seconds(6));
  ASSERT_EQ(orders.size(), 1u);
  ResizeResult result = PrepareResize(orders[0]);
  absl::MutexLock lock(&table_.mu());
  job.attempt = 2;
  EXPECT_FALSE(ApplyResizeLocked(job, orders[0], std::move(result)));
  EXPECT_EQ(job.plan.num_ranks, 4);
  EXPECT_FALSE(job.elastic.replanning) << "a later restart may plan again";
  EXPECT_EQ(job.elastic.relayout_snapshot_step, -1);
}

}  // namespace
}  // namespace stagecoach::coordinator::elastic_resize_test
