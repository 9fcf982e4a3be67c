// Elastic shrink and grow (restart.elastic, docs/recovery.md; issue 39 item 5) with real
// processes: a 4-rank 1F1B job on 4 workers, a checkpoint every 10 steps, held after step 13
// (so the moment is exact) when one worker is SIGKILLed. No spare, no fifth worker: after
// restart.wait the coordinator plans it again on the 3 workers left (3 ranks, 3 stages of the
// same 8 layers) and resumes it from the checkpoint after step 10 by parameter name. A worker
// added later lets it grow back to its own 4-rank plan at the checkpoint after step 20. Its 40
// losses equal an uninterrupted run's (the contract's rtol 1e-5).
#include <signal.h>

#include <cmath>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

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

std::string SpecYaml(const std::string& name, bool elastic, const std::string& ckpt) {
  std::string yaml = absl::StrCat(
      "name: ", name, "\n",
      "model:\n  builtin: {family: mlp, sizes: [8, 32, 32, 32, 32, 32, 32, 32, 4], seed: 3}\n",
      "split: {stages: 4}\n", "schedule: {kind: 1F1B, microbatches: 4}\n",
      "placement: {workers: 4}\n", "training:\n  batch_size: 16\n  steps: ", kSteps,
      "\n  loss: mse\n  optimizer: {kind: adamw, lr: 1.0e-2, weight_decay: 0.01}\n");
  if (elastic) {
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

TEST(Elastic, ALostWorkerShrinksTheJobToThreeAndAnAddedOneGrowsItBack) {
  // One intra-op thread in every worker, so that losses compare bit for bit where they can.
  setenv("OMP_NUM_THREADS", "1", 1);
  setenv("MKL_NUM_THREADS", "1", 1);
  ClusterOptions options;
  options.workers = 4;
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;

  const std::string straight_id = Submit(c, "straight", SpecYaml("straight", false, ""), false);
  auto straight = c.WaitForJob(straight_id, IsFinal, absl::Seconds(120));
  ASSERT_TRUE(straight.ok()) << straight.status() << c.Logs();
  ASSERT_EQ(straight->state(), v1::JOB_STATE_SUCCEEDED) << straight->reason();
  ASSERT_TRUE(c.WaitForIdleWorkers(4, absl::Seconds(60)).ok()) << c.Logs();

  const std::string id = Submit(c, "elastic", SpecYaml("elastic", true, c.dir() + "/ckpt"), true);
  auto paused = c.WaitForJob(
      id, [](const v1::Job& j) { return IsFinal(j) || j.state() == v1::JOB_STATE_PAUSED; },
      absl::Seconds(60));
  ASSERT_TRUE(paused.ok()) << paused.status() << c.Logs();
  CommandResult run = c.Stagectl({"run", id, "--steps", absl::StrCat(kKillAt)});
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  auto held = c.WaitForJob(
      id,
      [](const v1::Job& j) {
        return IsFinal(j) || (j.state() == v1::JOB_STATE_PAUSED &&
                              j.global_steps_done() == kKillAt && j.checkpoints_size() >= 1);
      },
      absl::Seconds(90));
  ASSERT_TRUE(held.ok()) << held.status() << c.Logs();
  ASSERT_EQ(held->state(), v1::JOB_STATE_PAUSED) << held->reason() << c.Logs();
  ASSERT_EQ(held->ranks_size(), 4);

  const int victim = c.WorkerIndex(held->ranks(3).worker_id());
  ASSERT_GE(victim, 0);
  c.worker(victim).Signal(SIGKILL);

  // Lost (lease 3 s), no fifth worker within restart.wait (2 s): planned again on 3 and held
  // after step 13 again, from the checkpoint after step 10.
  auto shrunk = c.WaitForJob(
      id,
      [](const v1::Job& j) {
        return IsFinal(j) || (j.attempt() == 2 && j.state() == v1::JOB_STATE_PAUSED &&
                              j.global_steps_done() == kKillAt);
      },
      absl::Seconds(90));
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
  ASSERT_EQ(done->losses_size(), kSteps);
  for (int i = 0; i < kSteps; ++i) {
    EXPECT_NEAR(done->losses(i), straight->losses(i), 1e-5 * std::abs(straight->losses(i)))
        << "step " << i;
  }
  if (::testing::Test::HasFailure()) std::cerr << c.Logs();
}

}  // namespace
}  // namespace stagecoach::testing::elastic_test
