// Replicas that carry on without a lost one (restart.carry_on, docs/recovery.md) across real
// processes: 2 replicas x 2 ranks (1F1B) train an MLP on loopback, a worker is SIGKILLed while
// the job runs, and the job never leaves RUNNING: its replica leaves, the other runs both
// replicas' microbatches from the step in flight on, every step is recorded exactly once, and
// every step's loss equals the single-process reference's on the whole batch (rtol 1e-5). The
// killed worker is replica 0's last stage, so the healthy replica also takes over the
// checkpoints (it is the data-parallel group's rank 0 now) and the losses its last stage
// reported. With a spare, the lost replica is healed: the spare and the lost replica's other
// (released) worker take its ranks, receive replica 0's state over the data-parallel group
// and join at a step boundary; the job is whole again, its losses still the reference's, and
// the replacement's parameters are replica 0's bits. A worker that stalls before a step
// (STAGECOACH_FAULT_STEP_STALL) is killed there, while its peers wait inside the step's
// transfers and the gradient reduction: the step is abandoned and run again, counted once.
#include <signal.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/job_predicates.h"
#include "tests/support/local_cluster.h"
#include "tests/support/reference_mlp.h"

namespace stagecoach::testing::replica_carry_on_test {
namespace {

constexpr double kRtol = 1e-5;
constexpr double kAtol = 1e-6;

class ReplicaCarryOn : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("OMP_NUM_THREADS", "1", 1);
    setenv("MKL_NUM_THREADS", "1", 1);
  }

  // A job of 2 replicas x 2 ranks (1F1B) training the MLP of `ref` with a checkpoint every
  // `every` steps, SIGKILLed at its worker of `replica`'s `rank` once it has done 4 steps (steps
  // of some tens of milliseconds, so that the kill lands inside one). Sets id_ and victim_.
  void StartAndKill(LocalCluster& c, const ReferenceConfig& ref, int every, int replica, int rank) {
    const std::string ckpt = c.dir() + "/ckpt";
    std::string spec = MlpSpecYaml(ref, {"carry-on", "1F1B", 2, 2, 2}, ckpt);
    spec = absl::StrReplaceAll(
        spec, {{"placement: {workers: 2}", "placement: {workers: 2, replicas: 2}"},
               {"checkpoint: {dir: " + ckpt + "}",
                absl::StrCat("checkpoint: {dir: ", ckpt, ", every_steps: ", every, "}")}});
    auto id = c.Submit(spec);
    ASSERT_TRUE(id.ok()) << id.status();
    id_ = *id;
    auto running = c.WaitForJob(
        id_, [](const v1::Job& j) { return IsFinal(j) || j.global_steps_done() >= 4; },
        absl::Seconds(120));
    ASSERT_TRUE(running.ok()) << running.status() << c.Logs();
    ASSERT_EQ(running->state(), v1::JOB_STATE_RUNNING) << running->reason();
    for (const v1::RankStatus& r : running->ranks()) {
      if (r.replica() == replica && r.rank() == rank) victim_ = r.worker_id();
    }
    const int index = c.WorkerIndex(victim_);
    ASSERT_GE(index, 0);
    c.worker(index).Signal(SIGKILL);
  }

  // The job ended SUCCEEDED without a restart, never RESTARTING, every step once with the
  // reference's loss.
  static void ExpectTheStraightRun(const v1::Job& done, const ReferenceResult& want,
                                   int64_t steps) {
    EXPECT_EQ(done.restarts(), 0);
    for (const v1::JobTransition& t : done.history()) {
      EXPECT_NE(t.state(), v1::JOB_STATE_RESTARTING) << t.reason();
    }
    ASSERT_EQ(done.steps_done(), steps);
    ASSERT_EQ(done.losses_size(), steps);
    EXPECT_EQ(done.missing_loss_steps_size(), 0);
    for (int64_t step = 0; step < steps; ++step) {
      EXPECT_NEAR(done.losses(step), want.losses[step], kAtol + kRtol * std::abs(want.losses[step]))
          << "step " << step;
    }
  }

  // The last checkpoint's digests: replica 1's parameters (a replacement's, once healed) are
  // replica 0's bits.
  static void ExpectReplicasBitIdentical(const v1::Job& done) {
    for (int rank = 0; rank < 2; ++rank) {
      const auto& mine = done.ranks(rank).parameter_digests();
      const auto& theirs = done.ranks(2 + rank).parameter_digests();
      ASSERT_FALSE(mine.empty());
      for (const auto& [stage, digest] : mine) {
        ASSERT_EQ(theirs.count(stage), 1u) << "stage " << stage;
        EXPECT_EQ(theirs.at(stage), digest) << "stage " << stage;
      }
    }
  }

  // `healed` (the job once its replica was healed) still RUNNING; then the job ends SUCCEEDED,
  // whole, as the straight run, with every checkpoint's replicas bit-identical and its last
  // checkpoint after the last step.
  void ExpectWholeAndTheStraightRun(LocalCluster& c, const v1::Job& healed,
                                    const ReferenceResult& want, int64_t steps) {
    EXPECT_EQ(healed.state(), v1::JOB_STATE_RUNNING) << healed.reason() << c.Logs();
    auto done = c.WaitForJob(id_, IsFinal, absl::Seconds(180));
    ASSERT_TRUE(done.ok()) << done.status() << c.Logs();
    ASSERT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->reason() << c.Logs();
    EXPECT_EQ(done->healthy_replicas(), 2);
    ExpectTheStraightRun(*done, want, steps);
    ExpectReplicasBitIdentical(*done);
    ASSERT_EQ(done->checkpoints().rbegin()->step(), steps);
  }

  std::string id_;
  std::string victim_;
};

ReferenceConfig Mlp(int64_t steps) {
  return MlpReference({64, 256, 256, 256, 8}, 7, 99, 48, 4, steps, "mse", "adamw", 0.001, 0.0,
                      0.01);
}

TEST_F(ReplicaCarryOn, AWorkerKilledMidRunLeavesItsReplicaOutAndTheJobGoesOnWithTheSameLosses) {
  ClusterOptions options;
  options.workers = 4;  // 2 replicas x 2 ranks, no spare
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  const int64_t steps = 30;
  const ReferenceResult want = TrainReference(Mlp(steps));
  ASSERT_NO_FATAL_FAILURE(StartAndKill(c, Mlp(steps), 10, /*replica=*/0, /*rank=*/1));
  const absl::Time killed = absl::Now();

  auto degraded = c.WaitForJob(
      id_, [](const v1::Job& j) { return IsFinal(j) || j.lost_replicas_size() > 0; },
      absl::Seconds(60));
  ASSERT_TRUE(degraded.ok()) << degraded.status() << c.Logs();
  std::cout << "replica left " << absl::ToDoubleSeconds(absl::Now() - killed)
            << " s after the kill, at global step " << degraded->global_steps_done() << "\n";
  EXPECT_EQ(degraded->state(), v1::JOB_STATE_RUNNING) << degraded->reason() << c.Logs();
  EXPECT_EQ(degraded->healthy_replicas(), 1);
  EXPECT_THAT(degraded->lost_replicas(), ::testing::ElementsAre(0));
  CommandResult status = c.Stagectl({"status", id_});
  EXPECT_THAT(status.out, ::testing::HasSubstr("1/2 healthy")) << status.out;

  auto done = c.WaitForJob(id_, IsFinal, absl::Seconds(180));
  ASSERT_TRUE(done.ok()) << done.status() << c.Logs();
  ASSERT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->reason() << c.Logs();
  ExpectTheStraightRun(*done, want, steps);
  // Replica 1 writes the checkpoints after the loss (one replica 0 was writing when it was
  // killed stays incomplete): the last one is complete.
  ASSERT_GE(done->checkpoints_size(), 2) << c.Logs();
  EXPECT_EQ(done->checkpoints().rbegin()->step(), steps);
}

TEST_F(ReplicaCarryOn, ASpareHealsTheLostReplicaFromALiveOneAndItsParametersAreBitIdentical) {
  ClusterOptions options;
  options.workers = 5;  // 2 replicas x 2 ranks and a spare
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  const int64_t steps = 40;
  const ReferenceResult want = TrainReference(Mlp(steps));
  // A checkpoint every 5 steps: every replica reports its parameters' digests, and the
  // coordinator fails the job should two replicas of a stage differ.
  ASSERT_NO_FATAL_FAILURE(StartAndKill(c, Mlp(steps), 5, /*replica=*/1, /*rank=*/1));

  auto healed = c.WaitForJob(
      id_,
      [this](const v1::Job& j) {
        return IsFinal(j) || (j.lost_replicas_size() == 0 && j.healthy_replicas() == 2 &&
                              j.ranks(3).worker_id() != victim_ && j.failure().replica() == 1);
      },
      absl::Seconds(120));
  ASSERT_TRUE(healed.ok()) << healed.status() << c.Logs();
  EXPECT_NE(healed->ranks(3).worker_id(), victim_) << "a replacement holds the lost rank";
  ASSERT_NO_FATAL_FAILURE(ExpectWholeAndTheStraightRun(c, *healed, want, steps));
}

TEST_F(ReplicaCarryOn, AWorkerKilledInsideATransferIsHealedAndEveryStepCountsOnce) {
  ClusterOptions options;
  options.workers = 3;
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  // The fourth worker stalls before global step 5 (and only it): its pipeline peer waits inside
  // the step's transfers, the other replica inside the gradient reduction, when it is killed.
  setenv("STAGECOACH_FAULT_STEP_STALL", "5:60000", 1);
  auto stalling = c.AddWorker();
  unsetenv("STAGECOACH_FAULT_STEP_STALL");
  ASSERT_TRUE(stalling.ok()) << stalling.status();
  ASSERT_TRUE(c.WaitForIdleWorkers(4, absl::Seconds(30)).ok()) << c.Logs();

  const int64_t steps = 20;
  const ReferenceResult want = TrainReference(Mlp(steps));
  const std::string ckpt = c.dir() + "/ckpt";
  std::string spec = MlpSpecYaml(Mlp(steps), {"carry-on", "1F1B", 2, 2, 2}, ckpt);
  spec = absl::StrReplaceAll(
      spec,
      {{"placement: {workers: 2}", "placement: {workers: 2, replicas: 2}"},
       {"checkpoint: {dir: " + ckpt + "}", "checkpoint: {dir: " + ckpt + ", every_steps: 5}"}});
  auto id = c.Submit(spec);
  ASSERT_TRUE(id.ok()) << id.status();
  id_ = *id;
  // The spare, free in the pool once the job holds the other four.
  auto running = c.WaitForJob(
      id_, [](const v1::Job& j) { return IsFinal(j) || j.state() == v1::JOB_STATE_RUNNING; },
      absl::Seconds(120));
  ASSERT_TRUE(running.ok()) << running.status() << c.Logs();
  ASSERT_TRUE(c.AddWorker().ok()) << c.Logs();

  const std::string marker = "stalling before global step 5";
  const absl::Time deadline = absl::Now() + absl::Seconds(120);
  while (c.worker(*stalling).StderrTail(20000).find(marker) == std::string::npos) {
    ASSERT_LT(absl::Now(), deadline) << "the fourth worker never stalled\n" << c.Logs();
    absl::SleepFor(absl::Milliseconds(50));
  }
  // The reports of step 4 may still be on their way: no step after it can complete.
  auto stalled = c.WaitForJob(
      id_, [](const v1::Job& j) { return IsFinal(j) || j.global_steps_done() >= 5; },
      absl::Seconds(30));
  ASSERT_TRUE(stalled.ok()) << stalled.status() << c.Logs();
  ASSERT_EQ(stalled->state(), v1::JOB_STATE_RUNNING) << stalled->reason();
  EXPECT_EQ(stalled->global_steps_done(), 5) << "the job waits for the stalled step";
  int slot = -1;
  for (int i = 0; i < stalled->ranks_size(); ++i) {
    if (c.WorkerIndex(stalled->ranks(i).worker_id()) == *stalling) slot = i;
  }
  ASSERT_GE(slot, 0) << "the stalling worker holds a rank of the job";
  victim_ = stalled->ranks(slot).worker_id();
  const int replica = stalled->ranks(slot).replica();
  c.worker(*stalling).Signal(SIGKILL);

  auto healed = c.WaitForJob(
      id_,
      [&](const v1::Job& j) {
        return IsFinal(j) ||
               (j.lost_replicas_size() == 0 && j.healthy_replicas() == 2 &&
                j.ranks(slot).worker_id() != victim_ && j.failure().replica() == replica);
      },
      absl::Seconds(120));
  ASSERT_TRUE(healed.ok()) << healed.status() << c.Logs();
  ASSERT_NO_FATAL_FAILURE(ExpectWholeAndTheStraightRun(c, *healed, want, steps));
}

}  // namespace
}  // namespace stagecoach::testing::replica_carry_on_test
