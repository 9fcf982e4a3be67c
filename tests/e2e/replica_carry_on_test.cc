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
// the replacement's parameters are replica 0's bits.
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
};

TEST_F(ReplicaCarryOn, AWorkerKilledMidRunLeavesItsReplicaOutAndTheJobGoesOnWithTheSameLosses) {
  ClusterOptions options;
  options.workers = 4;  // 2 replicas x 2 ranks, no spare
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  // Steps of some tens of milliseconds, so that the kill lands inside one.
  const int64_t steps = 30;
  const ReferenceConfig ref =
      MlpReference({64, 256, 256, 256, 8}, 7, 99, 48, 4, steps, "mse", "adamw", 0.001, 0.0, 0.01);
  const ReferenceResult want = TrainReference(ref);
  const std::string ckpt = c.dir() + "/ckpt";
  std::string spec = MlpSpecYaml(ref, {"carry-on", "1F1B", 2, 2, 2}, ckpt);
  spec = absl::StrReplaceAll(
      spec,
      {{"placement: {workers: 2}", "placement: {workers: 2, replicas: 2}"},
       {"checkpoint: {dir: " + ckpt + "}", "checkpoint: {dir: " + ckpt + ", every_steps: 10}"}});
  auto id = c.Submit(spec);
  ASSERT_TRUE(id.ok()) << id.status();
  auto running = c.WaitForJob(
      *id, [](const v1::Job& j) { return IsFinal(j) || j.global_steps_done() >= 4; },
      absl::Seconds(120));
  ASSERT_TRUE(running.ok()) << running.status() << c.Logs();
  ASSERT_EQ(running->state(), v1::JOB_STATE_RUNNING) << running->reason();
  std::string victim;
  for (const v1::RankStatus& r : running->ranks()) {
    if (r.replica() == 0 && r.rank() == 1) victim = r.worker_id();
  }
  const int index = c.WorkerIndex(victim);
  ASSERT_GE(index, 0);
  c.worker(index).Signal(SIGKILL);
  const absl::Time killed = absl::Now();

  auto degraded = c.WaitForJob(
      *id, [](const v1::Job& j) { return IsFinal(j) || j.lost_replicas_size() > 0; },
      absl::Seconds(60));
  ASSERT_TRUE(degraded.ok()) << degraded.status() << c.Logs();
  std::cout << "replica left " << absl::ToDoubleSeconds(absl::Now() - killed)
            << " s after the kill, at global step " << degraded->global_steps_done() << "\n";
  EXPECT_EQ(degraded->state(), v1::JOB_STATE_RUNNING) << degraded->reason() << c.Logs();
  EXPECT_EQ(degraded->healthy_replicas(), 1);
  EXPECT_THAT(degraded->lost_replicas(), ::testing::ElementsAre(0));
  CommandResult status = c.Stagectl({"status", *id});
  EXPECT_THAT(status.out, ::testing::HasSubstr("1/2 healthy")) << status.out;

  auto done = c.WaitForJob(*id, IsFinal, absl::Seconds(180));
  ASSERT_TRUE(done.ok()) << done.status() << c.Logs();
  ASSERT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->reason() << c.Logs();
  EXPECT_EQ(done->restarts(), 0);
  for (const v1::JobTransition& t : done->history()) {
    EXPECT_NE(t.state(), v1::JOB_STATE_RESTARTING) << t.reason();
  }
  // Every step once, each with the whole batch's loss.
  ASSERT_EQ(done->steps_done(), steps);
  ASSERT_EQ(done->losses_size(), steps);
  EXPECT_EQ(done->missing_loss_steps_size(), 0);
  for (int64_t step = 0; step < steps; ++step) {
    EXPECT_NEAR(done->losses(step), want.losses[step], kAtol + kRtol * std::abs(want.losses[step]))
        << "step " << step;
  }
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
  const ReferenceConfig ref =
      MlpReference({64, 256, 256, 256, 8}, 7, 99, 48, 4, steps, "mse", "adamw", 0.001, 0.0, 0.01);
  const ReferenceResult want = TrainReference(ref);
  const std::string ckpt = c.dir() + "/ckpt";
  std::string spec = MlpSpecYaml(ref, {"heal", "1F1B", 2, 2, 2}, ckpt);
  // A checkpoint every 5 steps: every replica reports its parameters' digests, and the
  // coordinator fails the job should two replicas of a stage differ.
  spec = absl::StrReplaceAll(
      spec,
      {{"placement: {workers: 2}", "placement: {workers: 2, replicas: 2}"},
       {"checkpoint: {dir: " + ckpt + "}", "checkpoint: {dir: " + ckpt + ", every_steps: 5}"}});
  auto id = c.Submit(spec);
  ASSERT_TRUE(id.ok()) << id.status();
  auto running = c.WaitForJob(
      *id, [](const v1::Job& j) { return IsFinal(j) || j.global_steps_done() >= 4; },
      absl::Seconds(120));
  ASSERT_TRUE(running.ok()) << running.status() << c.Logs();
  ASSERT_EQ(running->state(), v1::JOB_STATE_RUNNING) << running->reason();
  std::string victim;
  for (const v1::RankStatus& r : running->ranks()) {
    if (r.replica() == 1 && r.rank() == 1) victim = r.worker_id();
  }
  const int index = c.WorkerIndex(victim);
  ASSERT_GE(index, 0);
  c.worker(index).Signal(SIGKILL);

  auto healed = c.WaitForJob(
      *id,
      [&victim](const v1::Job& j) {
        return IsFinal(j) || (j.lost_replicas_size() == 0 && j.healthy_replicas() == 2 &&
                              j.ranks(3).worker_id() != victim && j.failure().replica() == 1);
      },
      absl::Seconds(120));
  ASSERT_TRUE(healed.ok()) << healed.status() << c.Logs();
  EXPECT_EQ(healed->state(), v1::JOB_STATE_RUNNING) << healed->reason() << c.Logs();
  EXPECT_NE(healed->ranks(3).worker_id(), victim) << "a replacement holds the lost rank";

  auto done = c.WaitForJob(*id, IsFinal, absl::Seconds(180));
  ASSERT_TRUE(done.ok()) << done.status() << c.Logs();
  ASSERT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->reason() << c.Logs();
  EXPECT_EQ(done->restarts(), 0);
  EXPECT_EQ(done->healthy_replicas(), 2);
  ASSERT_EQ(done->losses_size(), steps);
  for (int64_t step = 0; step < steps; ++step) {
    EXPECT_NEAR(done->losses(step), want.losses[step], kAtol + kRtol * std::abs(want.losses[step]))
        << "step " << step;
  }
  // The last checkpoint's digests: the replacement's parameters are replica 0's bits.
  for (int rank = 0; rank < 2; ++rank) {
    const auto& mine = done->ranks(rank).parameter_digests();
    const auto& theirs = done->ranks(2 + rank).parameter_digests();
    ASSERT_FALSE(mine.empty());
    for (const auto& [stage, digest] : mine) {
      ASSERT_EQ(theirs.count(stage), 1u) << "stage " << stage;
      EXPECT_EQ(theirs.at(stage), digest) << "stage " << stage;
    }
  }
  ASSERT_EQ(done->checkpoints().rbegin()->step(), steps);
}

}  // namespace
}  // namespace stagecoach::testing::replica_carry_on_test
