// Elastic shrink and grow (restart.elastic, docs/recovery.md; issue 39 item 5) with real
// processes: a 4-rank 1F1B job on 4 workers, a checkpoint every 10 steps, held after step 13
// (so the moment is exact) when one worker is SIGKILLed. No spare, no fifth worker: after
// restart.wait the coordinator plans it again on the 3 workers left (3 ranks, 3 stages of the
// same 8 layers) and resumes it from the checkpoint after step 10 by parameter name. A worker
// added later lets it grow back to its own 4-rank plan at the checkpoint after step 20. Its 40
// losses equal an uninterrupted run's (the contract's rtol 1e-5). With in-memory snapshots every
// 4 steps the shrink continues from the snapshot after step 12 instead (its 4 stages' files
// exchanged to the 3 new ranks and restored by name): one step lost, not three.
#include <signal.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/job_predicates.h"
#include "tests/support/local_cluster.h"

namespace stagecoach::testing::elastic_test {
namespace {

using ::testing::HasSubstr;

constexpr int kSteps = 40;
constexpr int kKillAt = 13;

std::string SpecYaml(const std::string& name, bool elastic, const std::string& ckpt,
                     int snapshot_every = 0) {
  std::string yaml = absl::StrCat(
      "name: ", name, "\n",
      "model:\n  builtin: {family: mlp, sizes: [8, 32, 32, 32, 32, 32, 32, 32, 4], seed: 3}\n",
      "split: {stages: 4}\n", "schedule: {kind: 1F1B, microbatches: 4}\n",
      "placement: {workers: 4}\n", "training:\n  batch_size: 16\n  steps: ", kSteps,
      "\n  loss: mse\n  optimizer: {kind: adamw, lr: 1.0e-2, weight_decay: 0.01}\n");
  if (elastic) {
    if (snapshot_every > 0) {
      absl::StrAppend(&yaml, "  snapshot: {every_steps: ", snapshot_every, "}\n");
    }
    absl::StrAppend(&yaml, "  checkpoint: {dir: ", ckpt, ", every_steps: 10}\n",
                    "restart: {max_restarts: 2, elastic: true, min_workers: 2, wait: 2s}\n");
  }
  absl::StrAppend(&yaml, "data: {kind: synthetic, seed: 5}\n");
  return yaml;
}

std::string Submit(LocalCluster& c, const std::string& name, const std::string& yaml, bool paused) {
  std::vector<std::string> args = {"submit", c.WriteFile(name + ".yaml", yaml)};
  if (paused) args.push_back("--paused");
  CommandResult submit = c.Stagectl(args);
  EXPECT_EQ(submit.exit_code, 0) << submit.out << submit.err;
  return LastLine(submit.out);
}

// Every transition reason of the job's history, one a line.
std::string History(const v1::Job& job) {
  std::string out;
  for (const v1::JobTransition& t : job.history()) absl::StrAppend(&out, t.reason(), "\n");
  return out;
}

// The straight run's losses, on the cluster's 4 workers (idle again after it).
std::vector<double> StraightLosses(LocalCluster& c) {
  const std::string straight_id = Submit(c, "straight", SpecYaml("straight", false, ""), false);
  auto straight = c.WaitForJob(straight_id, IsFinal, absl::Seconds(120));
  EXPECT_TRUE(straight.ok()) << straight.status() << c.Logs();
  if (!straight.ok()) return {};
  EXPECT_EQ(straight->state(), v1::JOB_STATE_SUCCEEDED) << straight->reason();
  EXPECT_TRUE(c.WaitForIdleWorkers(4, absl::Seconds(60)).ok()) << c.Logs();
  return {straight->losses().begin(), straight->losses().end()};
}

// Submits `yaml` paused, runs it to kKillAt and, once `ready` holds there, SIGKILLs the worker
// of its last rank; then waits for its second attempt to be held at kKillAt again (lease 3 s,
// no fifth worker within restart.wait 2 s: planned again on 3).
absl::StatusOr<v1::Job> HoldKillAndShrink(LocalCluster& c, const std::string& id,
                                          const std::function<bool(const v1::Job&)>& ready) {
  auto paused = c.WaitForJob(
      id, [](const v1::Job& j) { return IsFinal(j) || j.state() == v1::JOB_STATE_PAUSED; },
      absl::Seconds(60));
  if (!paused.ok()) return paused.status();
  CommandResult run = c.Stagectl({"run", id, "--steps", absl::StrCat(kKillAt)});
  if (run.exit_code != 0) return absl::InternalError(run.out + run.err);
  auto held = c.WaitForJob(
      id,
      [&](const v1::Job& j) {
        return IsFinal(j) ||
               (j.state() == v1::JOB_STATE_PAUSED && j.global_steps_done() == kKillAt && ready(j));
      },
      absl::Seconds(90));
  if (!held.ok()) return held.status();
  if (held->state() != v1::JOB_STATE_PAUSED || held->ranks_size() != 4) {
    return absl::InternalError(absl::StrCat("not held on 4 ranks: ", held->reason()));
  }
  const int victim = c.WorkerIndex(held->ranks(3).worker_id());
  if (victim < 0) return absl::InternalError("the last rank's worker is not the cluster's");
  c.worker(victim).Signal(SIGKILL);
  return c.WaitForJob(
      id,
      [](const v1::Job& j) {
        return IsFinal(j) || (j.attempt() == 2 && j.state() == v1::JOB_STATE_PAUSED &&
                              j.global_steps_done() == kKillAt);
      },
      absl::Seconds(90));
}

void ExpectLosses(const v1::Job& done, const std::vector<double>& want) {
  ASSERT_EQ(done.losses_size(), kSteps);
  ASSERT_EQ(want.size(), static_cast<size_t>(kSteps));
  for (int i = 0; i < kSteps; ++i) {
    EXPECT_NEAR(done.losses(i), want[i], 1e-5 * std::abs(want[i])) << "step " << i;
  }
}

class Elastic : public ::testing::Test {
 protected:
  void SetUp() override {
    // One intra-op thread in every worker, so that losses compare bit for bit where they can.
    setenv("OMP_NUM_THREADS", "1", 1);
    setenv("MKL_NUM_THREADS", "1", 1);
  }

  // A cluster of 4 workers, and the straight run's losses on it.
  void StartWithTheStraightRun() {
    ClusterOptions options;
    options.workers = 4;
    auto cluster = LocalCluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);
    straight_ = StraightLosses(*cluster_);
    ASSERT_FALSE(straight_.empty());
  }

  std::unique_ptr<LocalCluster> cluster_;
  std::vector<double> straight_;
};

TEST_F(Elastic, ALostWorkerShrinksTheJobToThreeAndAnAddedOneGrowsItBack) {
  ASSERT_NO_FATAL_FAILURE(StartWithTheStraightRun());
  LocalCluster& c = *cluster_;
  const std::vector<double>& straight = straight_;

  const std::string id = Submit(c, "elastic", SpecYaml("elastic", true, c.dir() + "/ckpt"), true);
  // Held after step 13 with the checkpoint after step 10; shrunk from it.
  auto shrunk =
      HoldKillAndShrink(c, id, [](const v1::Job& j) { return j.checkpoints_size() >= 1; });
  ASSERT_TRUE(shrunk.ok()) << shrunk.status() << c.Logs();
  ASSERT_EQ(shrunk->state(), v1::JOB_STATE_PAUSED) << shrunk->reason() << c.Logs();
  EXPECT_EQ(shrunk->restarts(), 1);
  EXPECT_EQ(shrunk->ranks_size(), 3);
  EXPECT_EQ(shrunk->num_stages(), 3);
  EXPECT_EQ(shrunk->num_ranks(), 3);
  const std::string shrinking = History(*shrunk);
  EXPECT_THAT(shrinking, HasSubstr("from the checkpoint after step 10 (restored by parameter "
                                   "name) (elastic: 3 of its 4 workers; 1F1B on 3 ranks x 1 "
                                   "replicas, 3 stages, 4 microbatches)"))
      << shrinking;

  // A fifth worker: the job grows back at its next checkpoint (after step 20).
  auto added = c.AddWorker();
  ASSERT_TRUE(added.ok()) << added.status();
  ASSERT_TRUE(c.WaitForIdleWorkers(1, absl::Seconds(60)).ok()) << c.Logs();
  CommandResult resume = c.Stagectl({"resume", id});
  ASSERT_EQ(resume.exit_code, 0) << resume.out << resume.err;
  auto done = c.WaitForJob(id, IsFinal, absl::Seconds(120));
  ASSERT_TRUE(done.ok()) << done.status() << c.Logs();
  ASSERT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->reason() << c.Logs();
  EXPECT_EQ(done->restarts(), 1) << "growing back is not a failure";
  EXPECT_EQ(done->ranks_size(), 4);
  EXPECT_EQ(done->num_stages(), 4);
  const std::string grown = History(*done);
  EXPECT_THAT(grown, HasSubstr("growing back from 3 to 4 workers (1 free): its own plan, 1F1B on "
                               "4 ranks x 1 replica, 4 stages, 4 microbatches, from the "
                               "checkpoint after step 20"))
      << grown;
  EXPECT_THAT(grown, ::testing::ContainsRegex("starting attempt 3 on [^\n]* from the checkpoint "
                                              "after step 20 \\(restored by parameter name\\)\n"))
      << grown;
  ExpectLosses(*done, straight);
  if (::testing::Test::HasFailure()) std::cerr << c.Logs();
}

TEST_F(Elastic, AShrinkContinuesFromTheLatestSnapshotRestoredByName) {
  ASSERT_NO_FATAL_FAILURE(StartWithTheStraightRun());
  LocalCluster& c = *cluster_;
  const std::vector<double>& straight = straight_;

  const std::string id = Submit(
      c, "elastic", SpecYaml("elastic", true, c.dir() + "/ckpt", /*snapshot_every=*/4), true);
  // Held after step 13 once the snapshot after step 12 is complete (and the checkpoint after
  // step 10): the shrink continues from the snapshot.
  auto shrunk = HoldKillAndShrink(c, id, [](const v1::Job& j) {
    return j.checkpoints_size() >= 1 && j.snapshot().step() == 12;
  });
  ASSERT_TRUE(shrunk.ok()) << shrunk.status() << c.Logs();
  ASSERT_EQ(shrunk->state(), v1::JOB_STATE_PAUSED) << shrunk->reason() << c.Logs();
  EXPECT_EQ(shrunk->ranks_size(), 3);
  EXPECT_EQ(shrunk->num_stages(), 3);
  const std::string shrinking = History(*shrunk);
  EXPECT_THAT(shrinking, HasSubstr("from the in-memory snapshot after step 12 (restored by "
                                   "parameter name) (elastic: 3 of its 4 workers; 1F1B on 3 "
                                   "ranks x 1 replicas, 3 stages, 4 microbatches)"))
      << shrinking;
  CommandResult resume = c.Stagectl({"resume", id});
  ASSERT_EQ(resume.exit_code, 0) << resume.out << resume.err;
  auto done = c.WaitForJob(id, IsFinal, absl::Seconds(120));
  ASSERT_TRUE(done.ok()) << done.status() << c.Logs();
  ASSERT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->reason() << c.Logs();
  EXPECT_EQ(done->restarts(), 1);
  EXPECT_EQ(done->ranks_size(), 3) << "no worker came back: it finishes shrunk";
  // It snapshots on its new layout too (every 4 steps after step 13: 16, 20, ...).
  EXPECT_GE(done->snapshot().step(), 16);
  ExpectLosses(*done, straight);
  if (::testing::Test::HasFailure()) std::cerr << c.Logs();
}

}  // namespace
}  // namespace stagecoach::testing::elastic_test
