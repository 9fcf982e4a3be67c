// Jobs through the control plane with real processes: gang placement (a job waits, visibly,
// until enough workers are free), bad input refused at submit, a worker killed mid-job (the job
// fails naming the worker and its rank within the lease plus a margin; the others recover and
// run the next job), cancellation, and stagectl's command-line contract.
#include <signal.h>

#include <fstream>
#include <iostream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/support/job_predicates.h"
#include "tests/support/local_cluster.h"
#include "tests/support/test_paths.h"

namespace stagecoach::testing::job_lifecycle_test {
namespace {

using ::testing::HasSubstr;

std::string MlpSpec(const std::string& name, int stages, const std::string& schedule, int64_t steps,
                    int microbatches = 4) {
  return absl::StrCat("name: ", name, "\n",
                      "model:\n  builtin: {family: mlp, sizes: [8, 16, 16, 16, 16, 4], seed: 1}\n",
                      "split: {stages: ", stages, "}\n", "schedule: {kind: ", schedule,
                      ", microbatches: ", microbatches, "}\n",
                      "training: {batch_size: 16, steps: ", steps, ", loss: mse}\n");
}

ClusterOptions Workers(int n) {
  ClusterOptions options;
  options.workers = n;
  return options;
}

TEST(JobLifecycle, PendingJobShowsWhatItWaitsForAndStartsWhenWorkersJoin) {
  auto cluster = LocalCluster::Start(Workers(2));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  const std::string spec = c.WriteFile("four.yaml", MlpSpec("four", 4, "1F1B", 5));
  CommandResult submit = c.Stagectl({"submit", spec});
  ASSERT_EQ(submit.exit_code, 0) << submit.err;
  const std::string job_id = LastLine(submit.out);

  CommandResult status = c.Stagectl({"status", job_id, "-o", "json"});
  ASSERT_EQ(status.exit_code, 0) << status.err;
  nlohmann::json j = nlohmann::json::parse(status.out);
  EXPECT_EQ(j["id"], job_id);
  EXPECT_EQ(j["state"], "PENDING");
  EXPECT_EQ(j["reason"], "waiting for 4 workers, 2 free");
  EXPECT_EQ(j["steps_done"], 0);
  EXPECT_TRUE(j["losses"].is_array());

  // The human view says the same; global options may also follow the command.
  CommandResult table = c.Stagectl({"status", job_id});
  EXPECT_THAT(table.out, HasSubstr("PENDING"));
  EXPECT_THAT(table.out, HasSubstr("waiting for 4 workers, 2 free"));

  ASSERT_TRUE(c.AddWorker().ok());
  ASSERT_TRUE(c.AddWorker().ok());
  auto done = c.WaitForJob(job_id, IsFinal, absl::Seconds(90));
  ASSERT_TRUE(done.ok()) << done.status() << c.Logs();
  EXPECT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->reason() << c.Logs();
  EXPECT_EQ(done->steps_done(), 5);
  EXPECT_EQ(done->losses_size(), 5);
  // History: PLANNING (submitted), PENDING (planned), STARTING, RUNNING, SUCCEEDED.
  ASSERT_EQ(done->history_size(), 5);
  EXPECT_EQ(done->history(0).state(), v1::JOB_STATE_PLANNING);
  EXPECT_EQ(done->history(1).state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(done->history(2).state(), v1::JOB_STATE_STARTING);
  EXPECT_EQ(done->history(3).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(done->history(4).state(), v1::JOB_STATE_SUCCEEDED);
}

TEST(JobLifecycle, BadSpecsAreRefusedAtSubmitWithTheFieldAndNothingIsQueued) {
  auto cluster = LocalCluster::Start(Workers(1));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  struct Bad {
    std::string name;
    std::string yaml;
    std::string message;
  };
  const std::vector<Bad> bad = {
      {"invalid-yaml", "name: x\nmodel: {builtin: [\n", "invalid YAML"},
      {"unknown-schedule", MlpSpec("s", 2, "ZeroBubbleDeluxe", 3),
       "schedule.kind: unknown schedule 'ZeroBubbleDeluxe'"},
      {"too-many-stages", MlpSpec("s", 7, "GPipe", 3), "split.stages: must be <= 5"},
      {"microbatches-over-batch", MlpSpec("s", 2, "GPipe", 3, 32),
       "schedule.microbatches: must be <= training.batch_size (16), got 32"},
      {"1f1b-too-few-microbatches", MlpSpec("s", 4, "1F1B", 3, 2),
       "Number of microbatches (2) must be greater than or equal to the number of stages (4)"},
  };
  for (const Bad& b : bad) {
    const std::string path = c.WriteFile(b.name + ".yaml", b.yaml);
    CommandResult submit = c.Stagectl({"submit", path});
    EXPECT_EQ(submit.exit_code, 1) << b.name;
    EXPECT_THAT(submit.err, HasSubstr(b.message)) << b.name;
    EXPECT_THAT(submit.err, HasSubstr(path)) << b.name;  // says which file
    EXPECT_EQ(submit.out, "") << b.name;
  }
  CommandResult list = c.Stagectl({"list", "-o", "json"});
  ASSERT_EQ(list.exit_code, 0) << list.err;
  EXPECT_EQ(nlohmann::json::parse(list.out).size(), 0u);
  CommandResult missing = c.Stagectl({"submit", c.dir() + "/no-such.yaml"});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_THAT(missing.err, HasSubstr("cannot read spec file"));
}

// A cluster whose lease is short (2s) and whose data-plane timeout is long (120s), so that a
// lost worker must be found by the coordinator, not by a peer's receive timing out.
constexpr absl::Duration kFaultCommTimeout = absl::Seconds(120);
// Bound on finding a lost worker: the lease plus room for a loaded machine (ctest -j on two
// busy cores), and still far below kFaultCommTimeout, which a peer's receive would need.
constexpr absl::Duration kLossFoundWithin = absl::Seconds(40);

absl::StatusOr<std::unique_ptr<LocalCluster>> FaultCluster(int workers) {
  ClusterOptions options;
  options.workers = workers;
  options.lease = "2s";
  options.heartbeat_interval = "400ms";
  options.comm_timeout = absl::FormatDuration(kFaultCommTimeout);
  return LocalCluster::Start(options);
}

// Submits a job of `stages` stages that runs (practically) forever; returns it once it has
// done a few steps.
absl::StatusOr<v1::Job> StartEndlessJob(LocalCluster& c, int stages, const std::string& schedule) {
  const std::string spec =
      c.WriteFile("endless.yaml", MlpSpec("endless", stages, schedule, 1000000));
  CommandResult submit = c.Stagectl({"submit", spec});
  if (submit.exit_code != 0) return absl::InternalError(submit.err);
  auto job = c.WaitForJob(
      LastLine(submit.out), [](const v1::Job& j) { return j.steps_done() >= 3 || IsFinal(j); },
      absl::Seconds(60));
  if (job.ok() && job->state() != v1::JOB_STATE_RUNNING) {
    return absl::InternalError(
        absl::StrCat("job is ", v1::JobState_Name(job->state()), ": ", job->reason()));
  }
  return job;
}

TEST(JobLifecycle, KilledWorkerFailsTheJobNamingItAndTheOthersRunTheNextJob) {
  auto cluster = FaultCluster(3);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  auto running = StartEndlessJob(c, 3, "GPipe");
  ASSERT_TRUE(running.ok()) << running.status() << c.Logs();
  const std::string job_id = running->id();

  const v1::RankStatus& victim = running->ranks(1);
  const int index = c.WorkerIndex(victim.worker_id());
  ASSERT_GE(index, 0);
  const absl::Time killed = absl::Now();
  c.worker(index).Signal(SIGKILL);
  auto failed = c.WaitForJob(job_id, IsFinal, kFaultCommTimeout / 2);
  ASSERT_TRUE(failed.ok()) << failed.status() << c.Logs();
  const absl::Duration took = absl::Now() - killed;
  std::cerr << "FAILED " << absl::FormatDuration(took) << " after the kill: " << failed->reason()
            << "\n";
  EXPECT_EQ(failed->state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(failed->reason(),
              HasSubstr(absl::StrCat("worker ", victim.worker_id(), " (rank 1)")));
  EXPECT_THAT(failed->reason(), HasSubstr("lost"));
  EXPECT_LT(took, kLossFoundWithin) << "the lease (2s) finds it, not the data-plane timeout";

  // The surviving workers return to idle; the lost one is listed as LOST.
  ASSERT_TRUE(c.WaitForIdleWorkers(2, absl::Seconds(60)).ok()) << c.Logs();
  CommandResult workers = c.Stagectl({"workers"});
  EXPECT_THAT(workers.out, HasSubstr("LOST"));

  // A next job on the two survivors succeeds.
  const std::string next = c.WriteFile("next.yaml", MlpSpec("next", 2, "1F1B", 4));
  CommandResult again = c.Stagectl({"submit", next, "--wait"});
  EXPECT_EQ(again.exit_code, 0) << again.err << c.Logs();
}

TEST(JobLifecycle, AFrozenWorkerIsDeclaredLostByItsLeaseAndComesBackAfterwards) {
  auto cluster = FaultCluster(2);  // its peer waits on the frozen worker; the lease must win
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  auto running = StartEndlessJob(c, 2, "1F1B");
  ASSERT_TRUE(running.ok()) << running.status() << c.Logs();
  const std::string job_id = running->id();
  const v1::RankStatus& victim = running->ranks(0);
  const int index = c.WorkerIndex(victim.worker_id());
  ASSERT_GE(index, 0);
  const absl::Time frozen = absl::Now();
  c.worker(index).Signal(SIGSTOP);  // alive, connections open, silent
  auto failed = c.WaitForJob(job_id, IsFinal, kFaultCommTimeout / 2);
  ASSERT_TRUE(failed.ok()) << failed.status() << c.Logs();
  const absl::Duration took = absl::Now() - frozen;
  std::cerr << "FAILED " << absl::FormatDuration(took) << " after the freeze: " << failed->reason()
            << "\n";
  EXPECT_EQ(failed->state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(failed->reason(), HasSubstr(absl::StrCat("worker ", victim.worker_id(),
                                                       " (rank 0) lost: no heartbeat")));
  EXPECT_LT(took, kLossFoundWithin) << "the lease (2s) finds it, not the data-plane timeout";
  ASSERT_TRUE(c.WaitForIdleWorkers(1, absl::Seconds(60)).ok()) << c.Logs();

  // Thawed, it learns it was forgotten, drops its stale task and registers again.
  c.worker(index).Signal(SIGCONT);
  ASSERT_TRUE(c.WaitForIdleWorkers(2, absl::Seconds(60)).ok()) << c.Logs();
  const std::string next = c.WriteFile("next.yaml", MlpSpec("next", 2, "GPipe", 3));
  CommandResult again = c.Stagectl({"submit", next, "--wait"});
  EXPECT_EQ(again.exit_code, 0) << again.err << c.Logs();
}

TEST(JobLifecycle, CancelStopsARunningJobAndFreesItsWorkers) {
  auto cluster = LocalCluster::Start(Workers(2));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  auto running = StartEndlessJob(c, 2, "1F1B");
  ASSERT_TRUE(running.ok()) << running.status() << c.Logs();
  const std::string job_id = running->id();
  CommandResult cancel = c.Stagectl({"cancel", job_id});
  EXPECT_EQ(cancel.exit_code, 0) << cancel.err;
  EXPECT_THAT(cancel.out, HasSubstr("CANCELLED"));
  auto job = c.GetJob(job_id);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(job->reason(), "cancelled by client");
  EXPECT_TRUE(c.WaitForIdleWorkers(2, absl::Seconds(60)).ok()) << c.Logs();
  // Watching an ended job replays its events and exits 1 (it did not succeed).
  CommandResult watch = c.Stagectl({"watch", job_id});
  EXPECT_EQ(watch.exit_code, 1);
  EXPECT_THAT(watch.out, HasSubstr("loss"));
  EXPECT_THAT(watch.out, HasSubstr("CANCELLED"));
  // Cancelling twice is an error that says why.
  CommandResult twice = c.Stagectl({"cancel", job_id});
  EXPECT_EQ(twice.exit_code, 1);
  EXPECT_THAT(twice.err, HasSubstr("already ended"));
}

TEST(JobLifecycle, WatchShowsEveryStepWithItsLoss) {
  auto cluster = LocalCluster::Start(Workers(2));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  const std::string spec = c.WriteFile("short.yaml", MlpSpec("short", 2, "GPipe", 6));
  CommandResult submit = c.Stagectl({"submit", spec});
  ASSERT_EQ(submit.exit_code, 0) << submit.err;
  const std::string job_id = LastLine(submit.out);
  CommandResult watch = c.Stagectl({"watch", job_id});
  EXPECT_EQ(watch.exit_code, 0) << watch.err << c.Logs();
  for (int step = 1; step <= 6; ++step) {
    EXPECT_THAT(watch.out, HasSubstr(absl::StrCat("step ", step, "/6  loss ")));
  }
  EXPECT_THAT(watch.out, HasSubstr("SUCCEEDED"));
  CommandResult list = c.Stagectl({"list"});
  EXPECT_THAT(list.out, HasSubstr(job_id));
  EXPECT_THAT(list.out, HasSubstr("6/6"));
  CommandResult yaml = c.Stagectl({"-o", "yaml", "status", job_id});
  EXPECT_THAT(yaml.out, HasSubstr("state: SUCCEEDED"));
  // Both workers listen on 127.0.0.1: each divides the CPUs it may use by the job's 2 ranks
  // there (worker/runtime/device/compute_threads.h).
  EXPECT_THAT(c.Logs(), HasSubstr("rank 0: "));
  EXPECT_THAT(c.Logs(), HasSubstr("2 of the job's ranks on this host)"));
}

// A spec that runs the schedule file `csv` (a path relative to the spec) on the MlpSpec model.
std::string MlpCsvSpec(const std::string& name, const std::string& csv, const std::string& format,
                       int64_t steps, int microbatches = 4) {
  return absl::StrCat("name: ", name, "\n",
                      "model:\n  builtin: {family: mlp, sizes: [8, 16, 16, 16, 16, 4], seed: 1}\n",
                      "schedule:\n  csv: ", csv, "\n  csv_format: ", format,
                      "\n  microbatches: ", microbatches, "\n",
                      "training: {batch_size: 16, steps: ", steps, ", loss: mse}\n");
}

std::string GoldenSchedule(const std::string& file) {
  std::ifstream in(GoldenDir() + "/" + file, std::ios::binary);
  EXPECT_TRUE(in.good()) << file;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(JobLifecycle, BrokenScheduleCsvIsRefusedAtSubmitBeforeAnyWorkerStarts) {
  auto cluster = LocalCluster::Start(Workers(2));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  ASSERT_TRUE(c.WaitForIdleWorkers(2, absl::Seconds(30)).ok()) << c.Logs();
  struct Bad {
    std::string name;
    std::string csv;  // file contents
    std::string format;
    std::string message;
  };
  const std::vector<Bad> bad = {
      {"unknown-action", "0F0,0F1,0F2,0F3\n1F0,1F1,1X2,1F3\n", "compute_only",
       "schedule.csv: unknown-action.csv line 2 (rank 1), column 3 (step 2): invalid action "
       "\"1X2\""},
      // Rank 0 waits for 0B0 before it sends F1; rank 1 needs F1 before it sends B0.
      {"deadlock",
       "0F0,0SEND_F0,0RECV_B0,0B0,0F1,0SEND_F1,0RECV_B1,0B1,0F2,0SEND_F2,0F3,0SEND_F3,0RECV_B2,"
       "0B2,0RECV_B3,0B3\n"
       "1RECV_F0,1RECV_F1,1F0,1F1,1B0,1SEND_B0,1B1,1SEND_B1,1RECV_F2,1F2,1B2,1SEND_B2,1RECV_F3,"
       "1F3,1B3,1SEND_B3\n",
       "compute_comms", "schedule.csv: deadlock.csv line 1 (rank 0), column 4 (step 3): deadlock"},
  };
  for (const Bad& b : bad) {
    c.WriteFile(b.name + ".csv", b.csv);
    const std::string spec =
        c.WriteFile(b.name + ".yaml", MlpCsvSpec(b.name, b.name + ".csv", b.format, 3));
    CommandResult submit = c.Stagectl({"submit", spec});
    EXPECT_EQ(submit.exit_code, 1) << b.name << ": " << submit.err;
    EXPECT_THAT(submit.err, HasSubstr(b.message)) << b.name;
    EXPECT_THAT(submit.err, HasSubstr(spec)) << b.name;
    EXPECT_EQ(submit.out, "") << b.name;
  }
  // A file that is not there is stagectl's own error, naming the path it tried.
  const std::string missing =
      c.WriteFile("missing.yaml", MlpCsvSpec("missing", "no-such.csv", "compute_only", 3));
  CommandResult submit = c.Stagectl({"submit", missing});
  EXPECT_EQ(submit.exit_code, 1);
  EXPECT_THAT(submit.err,
              HasSubstr(absl::StrCat("cannot read schedule.csv '", c.dir(), "/no-such.csv'")));
  // Nothing was queued and no worker was given a task.
  CommandResult list = c.Stagectl({"list", "-o", "json"});
  ASSERT_EQ(list.exit_code, 0) << list.err;
  EXPECT_EQ(nlohmann::json::parse(list.out).size(), 0u);
  auto workers = c.ListWorkers();
  ASSERT_TRUE(workers.ok()) << workers.status();
  for (const v1::WorkerInfo& w : *workers) {
    EXPECT_EQ(w.state(), v1::WORKER_STATE_IDLE) << w.id();
  }
}

// Runs the same two-worker job from PyTorch's dump of `schedule` (`golden`, compute_only) and
// from schedule.kind, and expects both to succeed with the same losses.
void RunGoldenCsvJob(const std::string& schedule, const std::string& golden, int stages) {
  auto cluster = LocalCluster::Start(Workers(2));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  c.WriteFile("pytorch.csv", GoldenSchedule(golden));
  // Flow style here; block style in the test above.
  const std::string csv_spec = c.WriteFile(
      "csv.yaml",
      absl::StrCat("name: from-csv\n",
                   "model:\n  builtin: {family: mlp, sizes: [8, 16, 16, 16, 16, 4], seed: 1}\n",
                   "schedule: {microbatches: 4, csv: pytorch.csv}  # ", golden, "\n",
                   "training: {batch_size: 16, steps: 3, loss: mse}\n"));
  CommandResult submit = c.Stagectl({"submit", csv_spec, "--wait"});
  EXPECT_EQ(submit.exit_code, 0) << submit.err << c.Logs();
  auto from_csv = c.GetJob(LastLine(submit.out));
  ASSERT_TRUE(from_csv.ok()) << from_csv.status();
  EXPECT_EQ(from_csv->state(), v1::JOB_STATE_SUCCEEDED) << from_csv->reason() << c.Logs();
  EXPECT_EQ(from_csv->schedule(), "csv:pytorch.csv");
  EXPECT_EQ(from_csv->num_ranks(), 2);
  EXPECT_EQ(from_csv->num_stages(), stages);

  const std::string kind_spec = c.WriteFile("kind.yaml", MlpSpec("from-kind", stages, schedule, 3));
  CommandResult again = c.Stagectl({"submit", kind_spec, "--wait"});
  EXPECT_EQ(again.exit_code, 0) << again.err << c.Logs();
  auto from_kind = c.GetJob(LastLine(again.out));
  ASSERT_TRUE(from_kind.ok()) << from_kind.status();
  ASSERT_EQ(from_csv->losses_size(), 3);
  ASSERT_EQ(from_kind->losses_size(), 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_NEAR(from_csv->losses(i), from_kind->losses(i), 1e-6 + 1e-5 * from_kind->losses(i))
        << "step " << i;
  }
}

TEST(JobLifecycle, PyTorchGPipeCsvJobRunsLikeTheGeneratedSchedule) {
  RunGoldenCsvJob("GPipe", "GPipe_r2_s1_m4.compute.csv", 2);
}

// Two loop-placed stages per worker: needs the executor's multi-stage support.
TEST(JobLifecycle, PyTorchInterleaved1F1BCsvJobRunsLikeTheGeneratedSchedule) {
  RunGoldenCsvJob("Interleaved1F1B", "Interleaved1F1B_r2_s2_m4.compute.csv", 4);
}

TEST(Stagectl, UnreachableCoordinatorIsAClearError) {
  CommandResult r =
      RunCommand({StagectlBinary(), "--coordinator", "127.0.0.1:1", "list"}, absl::Seconds(30));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("cannot reach the coordinator at 127.0.0.1:1"));
  EXPECT_THAT(r.err, HasSubstr("STAGECOACH_COORDINATOR"));
  // The environment variable is the default address.
  CommandResult env = RunCommand({StagectlBinary(), "workers"}, absl::Seconds(30),
                                 {{"STAGECOACH_COORDINATOR", "127.0.0.1:2"}});
  EXPECT_THAT(env.err, HasSubstr("127.0.0.1:2"));
}

TEST(Stagectl, UsageErrorsExitTwo) {
  EXPECT_EQ(RunCommand({StagectlBinary()}, absl::Seconds(10)).exit_code, 2);
  EXPECT_EQ(RunCommand({StagectlBinary(), "status"}, absl::Seconds(10)).exit_code, 2);
  EXPECT_EQ(RunCommand({StagectlBinary(), "frobnicate"}, absl::Seconds(10)).exit_code, 2);
  CommandResult format = RunCommand({StagectlBinary(), "list", "-o", "xml"}, absl::Seconds(10));
  EXPECT_EQ(format.exit_code, 2);
  EXPECT_THAT(format.err, HasSubstr("-o: must be table, json or yaml"));
  CommandResult address =
      RunCommand({StagectlBinary(), "--coordinator", "nohostport", "list"}, absl::Seconds(10));
  EXPECT_EQ(address.exit_code, 2);
  EXPECT_THAT(address.err, HasSubstr("missing port"));
}

TEST(Daemons, CheckConfigValidatesAndExits) {
  TempDir dir;
  EXPECT_EQ(RunCommand({CoordinatorBinary(), "--check-config"}, absl::Seconds(10)).exit_code, 0);
  CommandResult bad =
      RunCommand({CoordinatorBinary(), "--check-config", "--lease", "soon"}, absl::Seconds(10));
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("--lease"));
  const std::string config = dir.path() + "/worker.yaml";
  std::ofstream(config) << "coordinator: 127.0.0.1:7070\nlisten: 127.0.0.1:0\nbogus: 1\n";
  CommandResult worker =
      RunCommand({WorkerBinary(), "--config", config, "--check-config"}, absl::Seconds(10));
  EXPECT_EQ(worker.exit_code, 2);
  EXPECT_THAT(worker.err, HasSubstr("bogus: unknown option"));
  EXPECT_EQ(RunCommand({WorkerBinary(), "--check-config"}, absl::Seconds(10), {}).exit_code, 2)
      << "no coordinator given";
}

}  // namespace
}  // namespace stagecoach::testing::job_lifecycle_test
