// Diagnosing a running job across real processes (docs/diagnosis.md): a worker frozen with
// SIGSTOP mid-run makes the job STALLED within the stall bound, naming the frozen rank (silent)
// and the rank waiting on it (its action, peer and address), in GetJob, `stagectl status`,
// `stagectl diagnose` and the coordinator's metrics, and the condition ends when the worker
// goes on; a worker started with --debug-slow-actions is named as a straggler against its
// data-parallel peer. The rules themselves are tested on an injected clock in
// tests/unit/stall_rule_test.cc and straggler_rule_test.cc.
#include <signal.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/job_predicates.h"
#include "tests/support/local_cluster.h"
#include "tests/support/prometheus_scrape.h"
#include "tests/support/reference_mlp.h"

namespace stagecoach::testing::diagnosis_test {
namespace {

using ::testing::HasSubstr;

double Metric(const std::string& address, const std::string& series) {
  auto scraped = Scrape(address);
  if (!scraped.ok()) return -1;
  auto it = scraped->find(series);
  return it == scraped->end() ? -1 : it->second;
}

TEST(Diagnosis, AFrozenWorkerStallsTheJobAndTheStatusNamesItsRankAndTheRankWaitingOnIt) {
  ClusterOptions options;
  options.workers = 2;
  options.lease = "300s";  // the frozen worker must not be declared lost meanwhile
  options.heartbeat_interval = "500ms";
  options.coordinator_args = {"--stall-after", "4s", "--metrics-listen", "127.0.0.1:0"};
  auto started = LocalCluster::Start(options);
  ASSERT_TRUE(started.ok()) << started.status();
  LocalCluster& c = **started;
  auto metrics = ReadMetricsAddress(c.coordinator());
  ASSERT_TRUE(metrics.ok()) << metrics.status();

  const std::string spec = c.WriteFile(
      "job.yaml",
      MlpSpecYaml(SmallSgdMlp(1000000, 3, 4), {"stall", "1F1B", 2, 2, 4}, c.dir() + "/ckpt"));
  CommandResult submit = c.Stagectl({"submit", spec});
  ASSERT_EQ(submit.exit_code, 0) << submit.err;
  const std::string id = LastLine(submit.out);
  auto running = c.WaitForJob(
      id, [](const v1::Job& j) { return IsFinal(j) || j.steps_done() >= 5; }, absl::Seconds(60));
  ASSERT_TRUE(running.ok()) << running.status();
  ASSERT_EQ(running->state(), v1::JOB_STATE_RUNNING) << History(*running) << c.Logs();
  EXPECT_FALSE(running->has_stall());
  const std::string series = absl::StrCat("stagecoach_job_stalled{job=\"", id, "\"}");

  const int frozen = c.WorkerIndex(running->ranks(0).worker_id());
  ASSERT_GE(frozen, 0);
  c.worker(frozen).Signal(SIGSTOP);
  const absl::Time t0 = absl::Now();
  auto stalled = c.WaitForJob(
      id, [](const v1::Job& j) { return IsFinal(j) || j.has_stall(); }, absl::Seconds(60));
  const absl::Duration took = absl::Now() - t0;
  CommandResult status = c.Stagectl({"status", id});
  CommandResult diagnose = c.Stagectl({"diagnose", id});
  const double stalled_metric = Metric(*metrics, series);
  c.worker(frozen).Signal(SIGCONT);

  ASSERT_TRUE(stalled.ok()) << stalled.status();
  ASSERT_TRUE(stalled->has_stall()) << History(*stalled) << c.Logs();
  // The bound (4 s) plus the tick and a heartbeat or two: generously under 30 s.
  EXPECT_LT(took, absl::Seconds(30));
  const v1::JobStall& stall = stalled->stall();
  ASSERT_EQ(stall.ranks_size(), 2);
  EXPECT_GE(stall.global_step(), 5);
  EXPECT_THAT(stall.ranks(0).summary(), HasSubstr("silent for")) << stall.DebugString();
  // Rank 1 waits on rank 0: for an activation, or for its send to be taken.
  const std::string peer = absl::StrCat("rank 0 (", stall.ranks(0).address(), ")");
  EXPECT_THAT(stall.ranks(1).summary(), HasSubstr(peer)) << stall.DebugString();
  EXPECT_THAT(stall.ranks(1).summary(), HasSubstr("wait")) << stall.DebugString();
  EXPECT_EQ(status.exit_code, 0) << status.err;
  EXPECT_THAT(status.out, HasSubstr("Stalled:   step "));
  EXPECT_THAT(status.out, HasSubstr("rank 0: silent for"));
  EXPECT_EQ(diagnose.exit_code, 0) << diagnose.err;
  EXPECT_THAT(diagnose.out, HasSubstr("rank 1 on "));
  EXPECT_THAT(diagnose.out, HasSubstr(peer));
  EXPECT_EQ(stalled_metric, 1.0);

  // Going on ends the condition; the job trains on.
  const int64_t at = stalled->steps_done();
  auto resumed = c.WaitForJob(
      id,
      [at](const v1::Job& j) { return IsFinal(j) || (!j.has_stall() && j.steps_done() > at + 2); },
      absl::Seconds(60));
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->state(), v1::JOB_STATE_RUNNING) << History(*resumed) << c.Logs();
  EXPECT_FALSE(resumed->has_stall());
  EXPECT_EQ(Metric(*metrics, series), 0.0);
  c.Stagectl({"cancel", id});
}

TEST(Diagnosis, AWorkerWithSlowedComputeIsNamedAsAStragglerAgainstItsReplica) {
  // One intra-op thread per worker: four workers share the machine's cores.
  setenv("OMP_NUM_THREADS", "1", 1);
  setenv("MKL_NUM_THREADS", "1", 1);
  ClusterOptions options;
  options.workers = 3;
  options.coordinator_args = {"--straggler-window", "8", "--straggler-min-window", "3s"};
  auto started = LocalCluster::Start(options);
  ASSERT_TRUE(started.ok()) << started.status();
  LocalCluster& c = **started;
  auto slow = c.AddWorker({"--debug-slow-actions", "3"});
  ASSERT_TRUE(slow.ok()) << slow.status();
  ASSERT_TRUE(c.WaitForIdleWorkers(4, absl::Seconds(60)).ok());

  // Compute of a few milliseconds per action, so that the slowed one stands out of the noise.
  ReferenceConfig config = SmallSgdMlp(1000000, 3, 4);
  config.sizes = {256, 512, 512, 256};
  config.batch_size = 64;
  const std::string spec =
      absl::StrReplaceAll(MlpSpecYaml(config, {"straggler", "1F1B", 2, 2, 4}, c.dir() + "/ckpt"),
                          {{"placement: {workers: 2}", "placement: {workers: 2, replicas: 2}"}});
  ASSERT_THAT(spec, HasSubstr("replicas: 2"));
  CommandResult submit = c.Stagectl({"submit", c.WriteFile("job.yaml", spec)});
  ASSERT_EQ(submit.exit_code, 0) << submit.err;
  const std::string id = LastLine(submit.out);
  auto named = c.WaitForJob(
      id, [](const v1::Job& j) { return IsFinal(j) || j.stragglers_size() > 0; },
      absl::Seconds(120));
  ASSERT_TRUE(named.ok()) << named.status();
  ASSERT_EQ(named->state(), v1::JOB_STATE_RUNNING) << History(*named) << c.Logs();
  ASSERT_EQ(named->stragglers_size(), 1) << named->DebugString();
  const v1::RankStraggler& s = named->stragglers(0);
  EXPECT_EQ(c.WorkerIndex(s.worker_id()), *slow) << s.DebugString();
  EXPECT_GE(s.ratio(), 1.25);
  EXPECT_GE(s.window_steps(), 8);
  EXPECT_EQ(named->pace_size(), 4) << "every rank has its replica as a peer";
  for (const v1::RankPace& p : named->pace()) {
    if (p.rank() == s.rank() && p.replica() == s.replica()) continue;
    EXPECT_LT(p.ratio(), 1.25) << p.DebugString();
    EXPECT_FALSE(p.straggling());
  }
  CommandResult status = c.Stagectl({"status", id});
  EXPECT_THAT(status.out, HasSubstr(absl::StrCat("Straggling: replica ", s.replica(), " rank ",
                                                 s.rank(), " (", s.worker_id(), ")")));
  c.Stagectl({"cancel", id});
}

}  // namespace
}  // namespace stagecoach::testing::diagnosis_test
