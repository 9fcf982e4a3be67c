// Failure handling and recovery with real processes (issue 6):
//   - restart.max_restarts: a worker SIGKILLed after 7 steps (the job held there, so the moment
//     is exact) is found lost, the job goes RESTARTING, is placed again on the spare worker and
//     continues from the checkpoint after step 5; its 20 losses equal an uninterrupted run's
//     bit for bit;
//   - no restart policy: a worker SIGKILLed mid-run fails the job within the lease plus a
//     margin, naming the rank and worker; the survivor is IDLE again and runs the next job;
//   - asynchronous checkpoints with a slowed writer: training goes on while step 2 is written,
//     its manifest lists only whole files, and a worker SIGKILLed while step 4 is being written
//     leaves step 2 the latest checkpoint and step 4 without a manifest;
//   - the coordinator SIGKILLed and started again on the same port with --data-dir: a finished
//     job is still listed with its losses; a job held after 8 steps keeps its history and
//     checkpoints, goes RESTARTING, continues from its checkpoint after step 5 on the workers
//     that registered again, and its losses equal an uninterrupted run's.
#include <signal.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/util/sha256.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/support/job_predicates.h"
#include "tests/support/local_cluster.h"

namespace stagecoach::testing::failure_recovery_test {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr int kSteps = 20;

struct MlpJob {
  std::string name;
  int64_t steps = kSteps;
  std::string checkpoint_dir;  // training.checkpoint.dir (every 5 steps), or none
  int max_restarts = -1;       // restart.max_restarts, or no restart section
};

// A 2-stage MLP on synthetic data with AdamW (so optimizer state must survive a restart).
std::string SpecYaml(const MlpJob& j) {
  std::string yaml =
      absl::StrCat("name: ", j.name, "\n",  //
                   "model:\n  builtin: {family: mlp, sizes: [8, 16, 16, 16, 16, 4], seed: 1}\n",
                   "split: {stages: 2}\n",                       //
                   "schedule: {kind: 1F1B, microbatches: 4}\n",  //
                   "training:\n  batch_size: 16\n  steps: ", j.steps,
                   "\n  loss: mse\n  optimizer: {kind: adamw, lr: 1.0e-2, weight_decay: 0.01}\n");
  if (!j.checkpoint_dir.empty()) {
    absl::StrAppend(&yaml, "  checkpoint: {dir: ", j.checkpoint_dir, ", every_steps: 5}\n");
  }
  absl::StrAppend(&yaml, "data: {kind: synthetic, seed: 4}\n");
  if (j.max_restarts >= 0)
    absl::StrAppend(&yaml, "restart: {max_restarts: ", j.max_restarts, "}\n");
  return yaml;
}

class FailureRecovery : public ::testing::Test {
 protected:
  void SetUp() override {
    // One intra-op thread in every worker (they inherit the environment), so that CPU kernels
    // sum in a fixed order and losses of restarted jobs can be compared bit for bit.
    setenv("OMP_NUM_THREADS", "1", 1);
    setenv("MKL_NUM_THREADS", "1", 1);
  }

  // Submits `j` (held before its first step when `paused`) and returns its id.
  static std::string Submit(LocalCluster& c, const MlpJob& j, bool paused = false) {
    const std::string spec = c.WriteFile(j.name + ".yaml", SpecYaml(j));
    std::vector<std::string> args = {"submit", spec};
    if (paused) args.push_back("--paused");
    CommandResult submit = c.Stagectl(args);
    EXPECT_EQ(submit.exit_code, 0) << j.name << ": " << submit.out << submit.err;
    return LastLine(submit.out);
  }

  // Runs `j` uninterrupted to SUCCEEDED and returns it.
  static absl::StatusOr<v1::Job> RunStraight(LocalCluster& c, const MlpJob& j) {
    const std::string id = Submit(c, j);
    auto done = c.WaitForJob(id, IsFinal, absl::Seconds(60));
    if (done.ok() && done->state() != v1::JOB_STATE_SUCCEEDED) {
      return absl::InternalError(
          absl::StrCat(j.name, " ended ", v1::JobState_Name(done->state()), ": ", done->reason()));
    }
    return done;
  }

  // Submits `j` paused, lets it run `steps` steps and waits until it holds there with the
  // checkpoint after step 5 complete.
  static absl::StatusOr<v1::Job> RunAndHold(LocalCluster& c, const MlpJob& j, int64_t steps) {
    const std::string id = Submit(c, j, /*paused=*/true);
    if (id.empty()) return absl::InternalError("submit failed");
    auto held = c.WaitForJob(
        id, [](const v1::Job& job) { return job.state() == v1::JOB_STATE_PAUSED || IsFinal(job); },
        absl::Seconds(60));
    if (!held.ok()) return held.status();
    CommandResult run = c.Stagectl({"run", id, "--steps", absl::StrCat(steps)});
    if (run.exit_code != 0) return absl::InternalError(absl::StrCat("stagectl run: ", run.err));
    return c.WaitForJob(
        id,
        [steps](const v1::Job& job) {
          return IsFinal(job) || (job.state() == v1::JOB_STATE_PAUSED &&
                                  job.global_steps_done() == steps && job.checkpoints_size() >= 1);
        },
        absl::Seconds(60));
  }
};

TEST_F(FailureRecovery, KilledWorkerRestartsTheJobOnTheSpareFromItsLatestCheckpoint) {
  ClusterOptions options;
  options.workers = 3;  // two ranks and a spare
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;

  auto straight = RunStraight(c, {"straight", kSteps, "", -1});
  ASSERT_TRUE(straight.ok()) << straight.status() << c.Logs();
  ASSERT_EQ(straight->losses_size(), kSteps);
  ASSERT_TRUE(c.WaitForIdleWorkers(3, absl::Seconds(60)).ok()) << c.Logs();

  const std::string ckpt = c.dir() + "/ckpt-restart";
  auto held = RunAndHold(c, {"restarted", kSteps, ckpt, 2}, 7);
  ASSERT_TRUE(held.ok()) << held.status() << c.Logs();
  ASSERT_EQ(held->state(), v1::JOB_STATE_PAUSED) << held->reason() << c.Logs();
  const std::string id = held->id();
  ASSERT_EQ(held->checkpoints(held->checkpoints_size() - 1).step(), 5) << History(*held);
  EXPECT_EQ(held->attempt(), 1);
  EXPECT_EQ(held->max_restarts(), 2);
  ASSERT_EQ(held->ranks_size(), 2);
  std::set<std::string> first_workers;
  for (const v1::RankStatus& r : held->ranks()) first_workers.insert(r.worker_id());
  const std::string victim = held->ranks(1).worker_id();
  const int index = c.WorkerIndex(victim);
  ASSERT_GE(index, 0) << victim;
  auto all = c.ListWorkers();
  ASSERT_TRUE(all.ok()) << all.status();
  std::string spare;
  for (const v1::WorkerInfo& w : *all) {
    if (!first_workers.count(w.id())) spare = w.id();
  }
  ASSERT_FALSE(spare.empty());

  c.worker(index).Signal(SIGKILL);
  // Lost (lease 3s), restarted from the checkpoint after step 5 and holding at step 7 again.
  auto again = c.WaitForJob(
      id,
      [](const v1::Job& j) {
        return IsFinal(j) || (j.attempt() == 2 && j.state() == v1::JOB_STATE_PAUSED &&
                              j.global_steps_done() == 7);
      },
      absl::Seconds(45));
  ASSERT_TRUE(again.ok()) << again.status() << c.Logs();
  ASSERT_EQ(again->state(), v1::JOB_STATE_PAUSED) << History(*again) << c.Logs();
  EXPECT_EQ(again->restarts(), 1);
  EXPECT_EQ(again->failure().rank(), 1);
  EXPECT_EQ(again->failure().worker_id(), victim);
  EXPECT_THAT(again->failure().error(), HasSubstr("lost"));
  std::set<std::string> second_workers;
  for (const v1::RankStatus& r : again->ranks()) second_workers.insert(r.worker_id());
  EXPECT_EQ(second_workers.count(victim), 0u) << "placed again on the killed worker";
  EXPECT_EQ(second_workers.count(spare), 1u) << "the spare " << spare << " was not used";

  // History: ... PAUSED (at 7), RESTARTING naming the lost rank, STARTING from step 5,
  // RUNNING (steps 5 and 6 again), PAUSED (at 7).
  const int restarting = FindState(*again, v1::JOB_STATE_RESTARTING);
  ASSERT_GE(restarting, 0) << History(*again);
  const std::string why = again->history(restarting).reason();
  EXPECT_THAT(why, HasSubstr(absl::StrCat("worker ", victim, " (rank 1)"))) << why;
  EXPECT_THAT(why, HasSubstr("lost")) << why;
  EXPECT_THAT(why, HasSubstr("restart 1 of 2 from the checkpoint after step 5")) << why;
  ASSERT_GT(again->history_size(), restarting + 3) << History(*again);
  EXPECT_EQ(again->history(restarting + 1).state(), v1::JOB_STATE_STARTING) << History(*again);
  EXPECT_THAT(again->history(restarting + 1).reason(), HasSubstr("starting attempt 2 on "));
  EXPECT_THAT(again->history(restarting + 1).reason(),
              HasSubstr("from the checkpoint after step 5"));
  EXPECT_EQ(again->history(restarting + 2).state(), v1::JOB_STATE_RUNNING) << History(*again);
  EXPECT_EQ(again->history(restarting + 3).state(), v1::JOB_STATE_PAUSED) << History(*again);
  EXPECT_EQ(again->losses_size(), 7);

  CommandResult resume = c.Stagectl({"resume", id});
  ASSERT_EQ(resume.exit_code, 0) << resume.out << resume.err;
  auto done = c.WaitForJob(id, IsFinal, absl::Seconds(60));
  ASSERT_TRUE(done.ok()) << done.status() << c.Logs();
  ASSERT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << History(*done) << c.Logs();
  EXPECT_EQ(done->attempt(), 2);
  EXPECT_EQ(done->restarts(), 1);
  EXPECT_EQ(done->steps_done(), kSteps);
  ASSERT_EQ(done->losses_size(), kSteps);
  std::cerr.precision(17);
  for (int i = 0; i < kSteps; ++i) {
    EXPECT_EQ(done->losses(i), straight->losses(i))
        << "step " << i << ": restarted " << done->losses(i) << ", straight "
        << straight->losses(i);
  }
  EXPECT_TRUE(fs::exists(absl::StrFormat("%s/step-%06d/manifest.json", ckpt, kSteps)));
  if (HasFailure()) std::cerr << History(*done) << "\n" << c.Logs();
}

// The same while the job runs (no hold): its peer sees the broken connection first, and the
// coordinator must still name the killed worker as the root cause and restart from whichever
// checkpoint was the latest.
TEST_F(FailureRecovery, WorkerKilledMidStepRestartsTheJobWithTheSameLosses) {
  constexpr int kLongSteps = 150;
  ClusterOptions options;
  options.workers = 3;
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  auto straight = RunStraight(c, {"straight", kLongSteps, "", -1});
  ASSERT_TRUE(straight.ok()) << straight.status() << c.Logs();
  ASSERT_EQ(straight->losses_size(), kLongSteps);
  ASSERT_TRUE(c.WaitForIdleWorkers(3, absl::Seconds(60)).ok()) << c.Logs();

  const std::string id = Submit(c, {"restarted", kLongSteps, c.dir() + "/ckpt-mid", 1});
  ASSERT_FALSE(id.empty());
  auto running = c.WaitForJob(
      id, [](const v1::Job& j) { return IsFinal(j) || j.steps_done() >= 7; }, absl::Seconds(60));
  ASSERT_TRUE(running.ok()) << running.status() << c.Logs();
  ASSERT_EQ(running->state(), v1::JOB_STATE_RUNNING) << History(*running) << c.Logs();
  const std::string victim = running->ranks(0).worker_id();
  const int index = c.WorkerIndex(victim);
  ASSERT_GE(index, 0) << victim;
  c.worker(index).Signal(SIGKILL);

  auto done = c.WaitForJob(id, IsFinal, absl::Seconds(90));
  ASSERT_TRUE(done.ok()) << done.status() << c.Logs();
  ASSERT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << History(*done) << c.Logs();
  EXPECT_EQ(done->attempt(), 2);
  EXPECT_EQ(done->restarts(), 1);
  EXPECT_EQ(done->failure().rank(), 0);
  EXPECT_EQ(done->failure().worker_id(), victim);
  for (const v1::RankStatus& r : done->ranks()) EXPECT_NE(r.worker_id(), victim);
  const int restarting = FindState(*done, v1::JOB_STATE_RESTARTING);
  ASSERT_GE(restarting, 0) << History(*done);
  EXPECT_THAT(done->history(restarting).reason(),
              HasSubstr(absl::StrCat("worker ", victim, " (rank 0)")));
  // It continued from a checkpoint taken before the kill (after step 5 or later), not step 0.
  ASSERT_LT(restarting + 1, done->history_size()) << History(*done);
  const std::string starting = done->history(restarting + 1).reason();
  std::cerr << "RESTARTING: " << done->history(restarting).reason() << "\nSTARTING: " << starting
            << "\n";
  const std::string marker = "from the checkpoint after step ";
  const size_t at = starting.find(marker);
  ASSERT_NE(at, std::string::npos) << starting;
  const int64_t from = std::atoll(starting.c_str() + at + marker.size());
  EXPECT_GE(from, 5) << starting;
  EXPECT_EQ(from % 5, 0) << starting;
  ASSERT_EQ(done->losses_size(), kLongSteps);
  std::cerr.precision(17);
  for (int i = 0; i < kLongSteps; ++i) {
    EXPECT_EQ(done->losses(i), straight->losses(i))
        << "step " << i << ": restarted " << done->losses(i) << ", straight "
        << straight->losses(i);
  }
  if (HasFailure()) std::cerr << History(*done) << "\n" << c.Logs();
}

TEST_F(FailureRecovery, WithoutRestartPolicyAKilledWorkerFailsTheJobAndTheSurvivorWorksOn) {
  ClusterOptions options;
  options.workers = 3;
  // A data-plane timeout far above the bound below: the coordinator must find the loss.
  options.comm_timeout = "120s";
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;

  const std::string id = Submit(c, {"doomed", 1000000, c.dir() + "/ckpt-doomed", -1});
  ASSERT_FALSE(id.empty());
  auto running = c.WaitForJob(
      id, [](const v1::Job& j) { return IsFinal(j) || j.steps_done() >= 7; }, absl::Seconds(60));
  ASSERT_TRUE(running.ok()) << running.status() << c.Logs();
  ASSERT_EQ(running->state(), v1::JOB_STATE_RUNNING) << History(*running) << c.Logs();
  ASSERT_EQ(running->ranks_size(), 2);
  const std::string victim = running->ranks(1).worker_id();
  const std::string survivor = running->ranks(0).worker_id();
  const int index = c.WorkerIndex(victim);
  ASSERT_GE(index, 0) << victim;

  const absl::Time killed = absl::Now();
  c.worker(index).Signal(SIGKILL);
  auto failed = c.WaitForJob(id, IsFinal, absl::Seconds(90));
  ASSERT_TRUE(failed.ok()) << failed.status() << c.Logs();
  const absl::Duration took = absl::Now() - killed;
  std::cerr << "FAILED " << absl::FormatDuration(took) << " after the kill: " << failed->reason()
            << "\n";
  EXPECT_EQ(failed->state(), v1::JOB_STATE_FAILED) << History(*failed);
  // The lease (3s) plus room for a loaded machine, far below the 120s data-plane timeout.
  EXPECT_LT(took, absl::Seconds(40)) << "the coordinator finds the loss, no receive times out";
  EXPECT_THAT(failed->reason(), HasSubstr(absl::StrCat("worker ", victim, " (rank 1)")));
  EXPECT_THAT(failed->reason(), HasSubstr("lost"));
  EXPECT_THAT(failed->reason(), ::testing::Not(HasSubstr("restart")));
  EXPECT_EQ(failed->failure().rank(), 1);
  EXPECT_EQ(failed->failure().worker_id(), victim);
  EXPECT_EQ(failed->restarts(), 0);
  EXPECT_EQ(failed->attempt(), 1);
  EXPECT_EQ(FindState(*failed, v1::JOB_STATE_RESTARTING), -1) << History(*failed);

  // The survivor is IDLE again (its task was stopped, nothing hangs), the victim LOST.
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  std::string survivor_state;
  while (true) {
    auto workers = c.ListWorkers();
    ASSERT_TRUE(workers.ok()) << workers.status();
    std::string victim_state;
    for (const v1::WorkerInfo& w : *workers) {
      if (w.id() == survivor) survivor_state = v1::WorkerState_Name(w.state());
      if (w.id() == victim) victim_state = v1::WorkerState_Name(w.state());
    }
    if (survivor_state == "WORKER_STATE_IDLE") {
      EXPECT_EQ(victim_state, "WORKER_STATE_LOST");
      break;
    }
    ASSERT_LT(absl::Now(), deadline)
        << "survivor " << survivor << " is " << survivor_state << c.Logs();
    absl::SleepFor(absl::Milliseconds(100));
  }

  // A next job runs on the survivor and the spare.
  const std::string next_id = Submit(c, {"next", 4, "", -1});
  auto next = c.WaitForJob(next_id, IsFinal, absl::Seconds(60));
  ASSERT_TRUE(next.ok()) << next.status() << c.Logs();
  EXPECT_EQ(next->state(), v1::JOB_STATE_SUCCEEDED) << History(*next) << c.Logs();
  std::set<std::string> used;
  for (const v1::RankStatus& r : next->ranks()) used.insert(r.worker_id());
  EXPECT_EQ(used.count(survivor), 1u) << "the survivor " << survivor << " did not run it";
}

// The coordinator writes job records off its table's lock (coordinator/jobs/job_writer.h), so a
// kill right after a transition can beat that transition's record to the disk. Waits (at most 15 s)
// until `seen`'s record in the coordinator's --data-dir has its state and history length.
absl::Status WaitForRecordOnDisk(const std::string& data_dir, const v1::Job& seen) {
  const std::string path = absl::StrCat(data_dir, "/jobs/", seen.id(), ".pb");
  const absl::Time deadline = absl::Now() + absl::Seconds(15);
  while (true) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream bytes;
    bytes << in.rdbuf();
    v1::Job record;
    if (in && record.ParseFromString(bytes.str()) && record.state() == seen.state() &&
        record.history_size() == seen.history_size()) {
      return absl::OkStatus();
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(path, " does not hold ", seen.id(), " as ", v1::JobState_Name(seen.state()),
                       " with ", seen.history_size(), " transitions after 15 s"));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
}

TEST_F(FailureRecovery, RestartedCoordinatorKeepsItsJobsAndContinuesFromTheCheckpoint) {
  TempDir data;
  ClusterOptions options;
  options.workers = 3;
  options.coordinator_args = {"--data-dir", data.path()};
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;

  // Finished before the coordinator goes: it must still be listed afterwards.
  auto straight = RunStraight(c, {"straight", kSteps, "", -1});
  ASSERT_TRUE(straight.ok()) << straight.status() << c.Logs();
  ASSERT_EQ(straight->losses_size(), kSteps);
  ASSERT_TRUE(c.WaitForIdleWorkers(3, absl::Seconds(60)).ok()) << c.Logs();

  const std::string ckpt = c.dir() + "/ckpt-recovered";
  auto held = RunAndHold(c, {"recovered", kSteps, ckpt, -1}, 8);
  ASSERT_TRUE(held.ok()) << held.status() << c.Logs();
  ASSERT_EQ(held->state(), v1::JOB_STATE_PAUSED) << held->reason() << c.Logs();
  const std::string id = held->id();
  ASSERT_EQ(held->checkpoints(held->checkpoints_size() - 1).step(), 5) << History(*held);
  ASSERT_EQ(held->losses_size(), 8);

  // This test is about what a restart keeps, so the kill comes once both records are written.
  ASSERT_TRUE(WaitForRecordOnDisk(data.path(), *straight).ok()) << c.Logs();
  ASSERT_TRUE(WaitForRecordOnDisk(data.path(), *held).ok()) << c.Logs();
  ASSERT_TRUE(c.RestartCoordinator().ok()) << c.Logs();

  // The finished job, as it was.
  auto kept = c.WaitForJob(straight->id(), IsFinal, absl::Seconds(15));
  ASSERT_TRUE(kept.ok()) << kept.status() << c.Logs();
  EXPECT_EQ(kept->state(), v1::JOB_STATE_SUCCEEDED);
  ASSERT_EQ(kept->losses_size(), kSteps);
  for (int i = 0; i < kSteps; ++i) EXPECT_EQ(kept->losses(i), straight->losses(i)) << i;
  EXPECT_EQ(History(*kept), History(*straight));

  // The held job: its history and checkpoint kept, then restarted from step 5 by the new
  // coordinator (not counted as a restart) once workers registered again, holding at 8 again.
  auto listed = c.GetJob(id);
  ASSERT_TRUE(listed.ok()) << listed.status() << c.Logs();
  ASSERT_GE(listed->history_size(), held->history_size()) << History(*listed);
  for (int i = 0; i < held->history_size(); ++i) {
    EXPECT_EQ(listed->history(i).state(), held->history(i).state()) << i;
    EXPECT_EQ(listed->history(i).reason(), held->history(i).reason()) << i;
  }
  ASSERT_GE(listed->checkpoints_size(), 1);
  EXPECT_EQ(listed->checkpoints(0).step(), 5);
  EXPECT_EQ(listed->checkpoints(0).directory(), held->checkpoints(0).directory());

  auto again = c.WaitForJob(
      id,
      [](const v1::Job& j) {
        return IsFinal(j) || (j.attempt() == 2 && j.state() == v1::JOB_STATE_PAUSED &&
                              j.global_steps_done() == 8);
      },
      absl::Seconds(45));
  ASSERT_TRUE(again.ok()) << again.status() << c.Logs();
  ASSERT_EQ(again->state(), v1::JOB_STATE_PAUSED) << History(*again) << c.Logs();
  EXPECT_EQ(again->restarts(), 0);
  const int restarting = FindState(*again, v1::JOB_STATE_RESTARTING);
  ASSERT_EQ(restarting, held->history_size()) << History(*again);
  // Which checkpoint it continues from is known once its recovery (in the background) has
  // checked it: the STARTING transition says.
  EXPECT_THAT(again->history(restarting).reason(), HasSubstr("the coordinator restarted"));
  ASSERT_GT(again->history_size(), restarting + 3) << History(*again);
  EXPECT_EQ(again->history(restarting + 1).state(), v1::JOB_STATE_STARTING) << History(*again);
  EXPECT_THAT(again->history(restarting + 1).reason(),
              HasSubstr("from the checkpoint after step 5"));
  EXPECT_EQ(again->history(restarting + 2).state(), v1::JOB_STATE_RUNNING) << History(*again);
  EXPECT_EQ(again->history(restarting + 3).state(), v1::JOB_STATE_PAUSED) << History(*again);

  CommandResult resume = c.Stagectl({"resume", id});
  ASSERT_EQ(resume.exit_code, 0) << resume.out << resume.err << c.Logs();
  auto done = c.WaitForJob(id, IsFinal, absl::Seconds(60));
  ASSERT_TRUE(done.ok()) << done.status() << c.Logs();
  ASSERT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << History(*done) << c.Logs();
  EXPECT_EQ(done->attempt(), 2);
  ASSERT_EQ(done->losses_size(), kSteps);
  std::cerr.precision(17);
  for (int i = 0; i < kSteps; ++i) {
    EXPECT_EQ(done->losses(i), straight->losses(i))
        << "step " << i << ": recovered " << done->losses(i) << ", straight "
        << straight->losses(i);
  }

  // Every worker process registered again with the new coordinator, under its own id, and is
  // IDLE (none still holds a task of the old coordinator's attempt).
  const absl::Status idle = c.WaitForIdleWorkers(3, absl::Seconds(60));
  auto workers = c.ListWorkers();
  ASSERT_TRUE(workers.ok()) << workers.status();
  std::set<std::string> addresses;
  std::string listed_workers;
  for (const v1::WorkerInfo& w : *workers) {
    absl::StrAppend(&listed_workers, " ", w.id(), "=", w.name(), "@", w.address(), ":",
                    v1::WorkerState_Name(w.state()));
    if (w.state() != v1::WORKER_STATE_LOST) addresses.insert(w.address());
  }
  EXPECT_TRUE(idle.ok()) << idle << "; workers:" << listed_workers;
  EXPECT_EQ(addresses.size(), 3u) << "workers:" << listed_workers;
  if (HasFailure()) std::cerr << History(*done) << "\n" << c.Logs();
}

// Asynchronous checkpoints (task/checkpoint_steps.h) with the writer made slow (4 s after each
// stage's files): the manifest of step 2 appears only once every file it lists is whole on disk,
// and a worker SIGKILLed while step 4's checkpoint is still being written leaves step 4 without
// a manifest and step 2 the latest checkpoint.
TEST_F(FailureRecovery, AnAsynchronousCheckpointKilledMidWriteLeavesThePreviousOneTheLatest) {
  setenv("STAGECOACH_FAULT_CHECKPOINT_STALL_MS", "4000", 1);
  ClusterOptions options;
  options.workers = 2;
  auto cluster = LocalCluster::Start(options);
  unsetenv("STAGECOACH_FAULT_CHECKPOINT_STALL_MS");
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  const std::string ckpt = c.dir() + "/ckpt-async";
  std::string spec = SpecYaml({"async", 1000, ckpt, -1});
  spec = absl::StrReplaceAll(spec, {{"every_steps: 5}", "every_steps: 2}"}});
  CommandResult submit = c.Stagectl({"submit", c.WriteFile("async.yaml", spec)});
  ASSERT_EQ(submit.exit_code, 0) << submit.out << submit.err;
  const std::string id = LastLine(submit.out);
  auto listed = c.WaitForJob(
      id, [](const v1::Job& j) { return IsFinal(j) || j.checkpoints_size() >= 1; },
      absl::Seconds(60));
  ASSERT_TRUE(listed.ok()) << listed.status() << c.Logs();
  ASSERT_EQ(listed->state(), v1::JOB_STATE_RUNNING) << History(*listed) << c.Logs();
  const v1::JobCheckpoint first = listed->checkpoints(0);
  ASSERT_EQ(first.step(), 2);
  // Training went on while step 2 was written: step 3 was reported before step 2's files were
  // durable (a synchronous write reports step 2 with its files, so step 3 would come later).
  // Step 4's report is sent only once step 2's write is drained and step 4's snapshot is handed
  // to the writer, so it may arrive just after the checkpoint: wait for it, then step 4's write
  // (stalled) is under way.
  EXPECT_GE(listed->global_steps_done(), 3) << "the step loop waited for the write";
  listed = c.WaitForJob(
      id, [](const v1::Job& j) { return IsFinal(j) || j.global_steps_done() >= 4; },
      absl::Seconds(30));
  ASSERT_TRUE(listed.ok()) << listed.status() << c.Logs();
  ASSERT_EQ(listed->state(), v1::JOB_STATE_RUNNING) << History(*listed) << c.Logs();
  c.worker(c.WorkerIndex(listed->ranks(1).worker_id())).Signal(SIGKILL);
  auto failed = c.WaitForJob(id, IsFinal, absl::Seconds(90));
  ASSERT_TRUE(failed.ok()) << failed.status() << c.Logs();
  EXPECT_EQ(failed->state(), v1::JOB_STATE_FAILED) << History(*failed);
  ASSERT_GE(failed->checkpoints_size(), 1);
  EXPECT_EQ(failed->checkpoints(failed->checkpoints_size() - 1).step(), 2)
      << "a checkpoint whose write was cut became the latest";
  // Step 2's manifest lists files that are all there, whole.
  std::ifstream in(first.manifest());
  const nlohmann::json manifest = nlohmann::json::parse(in);
  int files = 0;
  for (const auto& stage : manifest.at("stages")) {
    for (const auto& f : stage.at("files")) {
      const std::string path = first.directory() + "/" + f.at("file").get<std::string>();
      auto sha = Sha256OfFile(path);
      ASSERT_TRUE(sha.ok()) << sha.status();
      EXPECT_EQ(*sha, f.at("sha256").get<std::string>()) << path;
      ++files;
    }
  }
  EXPECT_EQ(files, 4);
  EXPECT_FALSE(fs::exists(absl::StrFormat("%s/step-%06d/manifest.json", ckpt, 4)));
  if (HasFailure()) std::cerr << History(*failed) << "\n" << c.Logs();
}

}  // namespace
}  // namespace stagecoach::testing::failure_recovery_test
