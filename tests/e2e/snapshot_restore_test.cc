// In-memory snapshots and spares (docs/recovery.md, issue 39 item 4) with real processes: a
// 2-rank job without replicas takes a snapshot every 5 steps into its workers' memory (each
// rank's own worker and the other rank's), holds one idle worker as its spare, and writes a disk
// checkpoint only every 15 steps. Held after step 23 (so the moment is exact), a worker is
// SIGKILLed: the job restarts from the snapshot after step 20, not the checkpoint after step 15,
// on the surviving worker and the spare (which receives the lost rank's files from the
// survivor's memory), so the loss costs 3 steps; its losses equal an uninterrupted run's bit
// for bit.
#include <signal.h>

#include <cstdlib>
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/job_predicates.h"
#include "tests/support/local_cluster.h"
#include "tests/support/prometheus_scrape.h"

namespace stagecoach::testing::snapshot_restore_test {
namespace {

using ::testing::HasSubstr;

constexpr int kSteps = 30;
constexpr int kKillAt = 23;

// A 2-stage MLP with AdamW (its optimizer state must come back too); with `recovery`, snapshots
// every 5 steps, a checkpoint every 15, a spare and one restart.
std::string SpecYaml(const std::string& name, bool recovery, const std::string& ckpt) {
  std::string yaml = absl::StrCat(
      "name: ", name, "\n",
      "model:\n  builtin: {family: mlp, sizes: [8, 32, 32, 32, 32, 4], seed: 3}\n",
      "split: {stages: 2}\n", "schedule: {kind: 1F1B, microbatches: 4}\n",
      recovery ? "placement: {spares: 1}\n" : "", "training:\n  batch_size: 16\n  steps: ", kSteps,
      "\n  loss: mse\n  optimizer: {kind: adamw, lr: 1.0e-2, weight_decay: 0.01}\n");
  if (recovery) {
    absl::StrAppend(&yaml, "  snapshot: {every_steps: 5}\n", "  checkpoint: {dir: ", ckpt,
                    ", every_steps: 15}\n", "restart: {max_restarts: 1}\n");
  }
  absl::StrAppend(&yaml, "data: {kind: synthetic, seed: 5}\n");
  return yaml;
}

class SnapshotRestore : public ::testing::Test {
 protected:
  void SetUp() override {
    // One intra-op thread in every worker, so that losses compare bit for bit.
    setenv("OMP_NUM_THREADS", "1", 1);
    setenv("MKL_NUM_THREADS", "1", 1);
  }
};

std::string Submit(LocalCluster& c, const std::string& name, const std::string& yaml, bool paused) {
  std::vector<std::string> args = {"submit", c.WriteFile(name + ".yaml", yaml)};
  if (paused) args.push_back("--paused");
  CommandResult submit = c.Stagectl(args);
  EXPECT_EQ(submit.exit_code, 0) << submit.out << submit.err;
  return LastLine(submit.out);
}

// Kills the worker of `victim_rank`.
void KilledAt23CostsThreeSteps(int victim_rank) {
  ClusterOptions options;
  options.workers = 3;  // two ranks and a spare
  options.coordinator_args = {"--metrics-listen", "127.0.0.1:0"};
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  auto metrics_address = ReadMetricsAddress(c.coordinator());
  ASSERT_TRUE(metrics_address.ok()) << metrics_address.status();

  const std::string straight_id = Submit(c, "straight", SpecYaml("straight", false, ""), false);
  auto straight = c.WaitForJob(straight_id, IsFinal, absl::Seconds(90));
  ASSERT_TRUE(straight.ok()) << straight.status() << c.Logs();
  ASSERT_EQ(straight->state(), v1::JOB_STATE_SUCCEEDED) << straight->reason();
  ASSERT_TRUE(c.WaitForIdleWorkers(3, absl::Seconds(60)).ok()) << c.Logs();

  const std::string ckpt = c.dir() + "/ckpt";
  const std::string id = Submit(c, "snapshots", SpecYaml("snapshots", true, ckpt), true);
  auto paused = c.WaitForJob(
      id, [](const v1::Job& j) { return IsFinal(j) || j.state() == v1::JOB_STATE_PAUSED; },
      absl::Seconds(60));
  ASSERT_TRUE(paused.ok()) << paused.status() << c.Logs();
  ASSERT_EQ(paused->spare_workers_size(), 1) << "the third worker is held as the spare";
  const std::string spare = paused->spare_workers(0);
  CommandResult run = c.Stagectl({"run", id, "--steps", absl::StrCat(kKillAt)});
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  // Held after step 23 with the snapshot after step 20 complete (its exchange runs in the
  // background: it may complete after the hold).
  auto held = c.WaitForJob(
      id,
      [](const v1::Job& j) {
        return IsFinal(j) ||
               (j.state() == v1::JOB_STATE_PAUSED && j.global_steps_done() == kKillAt &&
                j.snapshot().step() == 20 && j.checkpoints_size() >= 1);
      },
      absl::Seconds(90));
  ASSERT_TRUE(held.ok()) << held.status() << c.Logs();
  ASSERT_EQ(held->state(), v1::JOB_STATE_PAUSED) << held->reason() << c.Logs();
  EXPECT_EQ(held->checkpoints(held->checkpoints_size() - 1).step(), 15);
  ASSERT_EQ(held->snapshot().ranks_size(), 2);
  for (const v1::SnapshotCopy& copy : held->snapshot().ranks()) {
    EXPECT_EQ(copy.worker_ids_size(), 2) << "rank " << copy.rank() << " is not on two workers";
  }
  CommandResult status = c.Stagectl({"status", id});
  EXPECT_THAT(status.out, HasSubstr("Snapshot:  in memory after step 20")) << status.out;
  EXPECT_THAT(status.out, HasSubstr(absl::StrCat("Spares:    ", spare))) << status.out;


  const std::string victim = held->ranks(victim_rank).worker_id();
  const std::string survivor = held->ranks(1 - victim_rank).worker_id();
  const int index = c.WorkerIndex(victim);
  ASSERT_GE(index, 0) << victim;
  c.worker(index).Signal(SIGKILL);

  // Lost (lease 3 s), restarted from the snapshot after step 20 and held at 23 again.
  auto again = c.WaitForJob(
      id,
      [](const v1::Job& j) {
        return IsFinal(j) || (j.attempt() == 2 && j.state() == v1::JOB_STATE_PAUSED &&
                              j.global_steps_done() == kKillAt);
      },
      absl::Seconds(60));
  ASSERT_TRUE(again.ok()) << again.status() << c.Logs();
  ASSERT_EQ(again->state(), v1::JOB_STATE_PAUSED) << again->reason() << c.Logs();
  EXPECT_EQ(again->restarts(), 1);
  const int restarting = [&] {
    for (int i = again->history_size() - 1; i >= 0; --i) {
      if (again->history(i).state() == v1::JOB_STATE_RESTARTING) return i;
    }
    return -1;
  }();
  ASSERT_GE(restarting, 0);
  ASSERT_LT(restarting + 1, again->history_size());
  const std::string starting = again->history(restarting + 1).reason();
  EXPECT_THAT(starting, HasSubstr("from the in-memory snapshot after step 20")) << starting;
  // The survivor keeps its rank (its own files are in its memory), the spare takes the lost one.
  EXPECT_EQ(again->ranks(1 - victim_rank).worker_id(), survivor);
  EXPECT_EQ(again->ranks(victim_rank).worker_id(), spare);
  EXPECT_EQ(again->spare_workers_size(), 0) << "no free worker is left to hold";
  // The spare keeps the files it restored: the snapshot is on two live workers again.
  ASSERT_EQ(again->snapshot().step(), 20);
  EXPECT_THAT(again->snapshot().ranks(victim_rank).worker_ids(), ::testing::Contains(spare));

  CommandResult resume = c.Stagectl({"resume", id});
  ASSERT_EQ(resume.exit_code, 0) << resume.out << resume.err;
  auto done = c.WaitForJob(id, IsFinal, absl::Seconds(90));
  ASSERT_TRUE(done.ok()) << done.status() << c.Logs();
  ASSERT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->reason() << c.Logs();
  ASSERT_EQ(done->losses_size(), kSteps);
  for (int i = 0; i < kSteps; ++i) {
    EXPECT_EQ(done->losses(i), straight->losses(i)) << "step " << i;
  }
  // `stagectl watch` of the ended job shows each completed snapshot.
  CommandResult watch = c.Stagectl({"watch", id, "-o", "json"});
  EXPECT_THAT(watch.out, HasSubstr(R"("event":"snapshot_taken")")) << watch.out << watch.err;
  EXPECT_THAT(watch.out, HasSubstr(R"("global_step":20)")) << watch.out;
  CommandResult lines = c.Stagectl({"watch", id});
  EXPECT_THAT(lines.out, HasSubstr("SNAPSHOT  in memory after global step 25")) << lines.out;
  // The steps the loss cost: those after the snapshot it restarted from.
  auto metrics = Scrape(*metrics_address);
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_EQ((*metrics)["stagecoach_job_steps_lost_total{kind=\"restart\"}"], 3);
  if (::testing::Test::HasFailure()) std::cerr << c.Logs();
}

TEST_F(SnapshotRestore, KillingTheLastRanksWorkerAt23RestartsFromTheSnapshotAfter20) {
  KilledAt23CostsThreeSteps(1);
}

TEST_F(SnapshotRestore, KillingTheFirstRanksWorkerAt23RestartsFromTheSnapshotAfter20) {
  KilledAt23CostsThreeSteps(0);
}

}  // namespace
}  // namespace stagecoach::testing::snapshot_restore_test
