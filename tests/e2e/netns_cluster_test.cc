// Jobs across hosts in network namespaces (tests/support/netns/hosts.h), with the network's
// faults (issue 43): the coordinator on a host of its own, each worker on another, every daemon
// reached at its advertised address over a link of the switch, never over loopback.
//   - four worker hosts, 1 ms on every link each way (2 ms between hosts) and 1 Gbit/s: the
//     job's losses equal the same job's on loopback, bit for bit;
//   - a worker's link taken down mid-step: the coordinator finds the worker lost within its
//     lease, the restart policy places the job again on the spare host, and the losses equal
//     the loopback run's;
//   - the coordinator's host partitioned (its packets dropped, the workers alive and training)
//     for less than the lease, then healed: the job runs every step once (no restart, as many
//     losses as steps, equal to the loopback run's), also when the partition outlasts a
//     worker's call deadline (10 s), so that reports sent during it fail and are sent again;
//   - partitioned for longer than the lease: both workers lost, the job restarts from its
//     checkpoint once they are back, and its losses are still one per step, equal;
//   - 1% packet loss between hosts: the job is slower, its losses unchanged.
// Every test says what made the latency and the loss (netem or the test's packet relay).
// Needs root (label netns); skipped, naming why, where namespaces cannot be made.
#include <iostream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/job_predicates.h"
#include "tests/support/local_cluster.h"
#include "tests/support/netns/hosts.h"
#include "tests/support/netns/netns_test.h"

namespace stagecoach::testing::netns_cluster_test {
namespace {

using netns::CutKind;
using netns::HostsOptions;
using netns::LinkShape;
using netns::NetnsHosts;
using ::testing::HasSubstr;

struct Job {
  int stages = 4;
  int steps = 12;
  std::string checkpoint_dir;  // every 4 steps, or none
  int max_restarts = -1;       // restart.max_restarts, or no restart section
};

// Two stages, `steps` steps; `restartable`: restart.max_restarts 1 and checkpoints (their
// directory set once the cluster has one).
Job TwoStages(int steps, bool restartable) {
  Job j;
  j.stages = 2;
  j.steps = steps;
  if (restartable) {
    j.max_restarts = 1;
    j.checkpoint_dir = "set below";
  }
  return j;
}

// An MLP cut into `stages` on synthetic data with AdamW.
std::string SpecYaml(const Job& j) {
  std::string yaml = absl::StrCat(
      "name: netns\n",
      "model:\n  builtin: {family: mlp, sizes: [8, 32, 32, 32, 32, 32, 32, 32, 4], seed: 3}\n",
      "split: {stages: ", j.stages, "}\n", "schedule: {kind: 1F1B, microbatches: 8}\n",
      "training:\n  batch_size: 64\n  steps: ", j.steps,
      "\n  loss: mse\n  optimizer: {kind: adamw, lr: 1.0e-2, weight_decay: 0.01}\n");
  if (!j.checkpoint_dir.empty()) {
    absl::StrAppend(&yaml, "  checkpoint: {dir: ", j.checkpoint_dir, ", every_steps: 4}\n");
  }
  absl::StrAppend(&yaml, "data: {kind: synthetic, seed: 5}\n");
  if (j.max_restarts >= 0)
    absl::StrAppend(&yaml, "restart: {max_restarts: ", j.max_restarts, "}\n");
  return yaml;
}

ClusterOptions Options(int workers) {
  ClusterOptions options;
  options.workers = workers;
  options.log_level = "info";
  // One compute thread everywhere: the hosts' workers and loopback's sum in the same order.
  options.worker_args = {"--threads", "1"};
  return options;
}

absl::StatusOr<v1::Job> RunToEnd(LocalCluster& c, const Job& j, absl::Duration timeout) {
  auto id = c.Submit(SpecYaml(j));
  if (!id.ok()) return id.status();
  return c.WaitForJob(*id, IsFinal, timeout);
}

// The job's losses on loopback (this process's namespace), for the hosts' runs to equal.
std::vector<double> LoopbackLosses(const Job& j) {
  Job straight = j;
  straight.max_restarts = -1;
  auto cluster = LocalCluster::Start(Options(j.stages));
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  if (!cluster.ok()) return {};
  if (!j.checkpoint_dir.empty()) straight.checkpoint_dir = (*cluster)->dir() + "/ckpt";
  auto done = RunToEnd(**cluster, straight, absl::Seconds(120));
  EXPECT_TRUE(done.ok()) << done.status() << (*cluster)->Logs();
  if (!done.ok()) return {};
  EXPECT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << History(*done) << (*cluster)->Logs();
  return {done->losses().begin(), done->losses().end()};
}

void ExpectLosses(const v1::Job& job, const std::vector<double>& expected) {
  ASSERT_EQ(job.losses_size(), static_cast<int>(expected.size())) << History(job);
  for (int i = 0; i < job.losses_size(); ++i) {
    EXPECT_EQ(job.losses(i), expected[i])
        << "step " << i << ": across hosts " << job.losses(i) << ", on loopback " << expected[i];
  }
}

class NetnsCluster : public ::testing::Test {
 protected:
  void SetUp() override { SKIP_UNLESS_NETNS(); }

  // Hosts "coord" and "host-a", "host-b", ... (`workers` of them) with `shape` on every link,
  // and a cluster on them: the coordinator on "coord", worker i on host i+1.
  void StartCluster(int workers, const LinkShape& shape, bool droppable, ClusterOptions options) {
    HostsOptions h;
    h.names = {"coord"};
    for (int i = 0; i < workers; ++i)
      h.names.push_back(absl::StrCat("host-", std::string(1, static_cast<char>('a' + i))));
    h.shape = shape;
    h.droppable = droppable;
    auto hosts = NetnsHosts::Create(h);
    ASSERT_TRUE(hosts.ok()) << hosts.status();
    hosts_ = *std::move(hosts);
    std::cerr << "hosts: " << hosts_->size() << ", latency and loss by: " << hosts_->latency_by()
              << "\n";
    options.coordinator_host = {hosts_->Launcher(0), hosts_->address(0)};
    for (int i = 1; i < hosts_->size(); ++i) {
      options.worker_hosts.push_back({hosts_->Launcher(i), hosts_->address(i)});
    }
    auto cluster = LocalCluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);
  }

  // Runs a job, partitions the coordinator's host for `partition` and heals it; the job must
  // run every step once.
  void RunPartition(absl::Duration partition, const std::string& lease);

  // The host index a worker id runs on (worker i on host i+1).
  int HostOf(const std::string& worker_id) { return cluster_->WorkerIndex(worker_id) + 1; }

  void TearDown() override {
    if (hosts_ != nullptr) {
      const netns::RelayCounters r = hosts_->relay_counters();
      std::cerr << absl::StrFormat(
          "relay: %d frames forwarded, %d lost, %d cut, %d undeliverable\n", r.forwarded, r.lost,
          r.cut, r.undeliverable);
    }
    cluster_.reset();  // the daemons go before their hosts
    hosts_.reset();
  }

  std::unique_ptr<NetnsHosts> hosts_;
  std::unique_ptr<LocalCluster> cluster_;
};

TEST_F(NetnsCluster, FourHostsWithLatencyAndGigabitLinksTrainToTheLoopbackLosses) {
  const Job job;  // 4 stages on 4 workers
  const std::vector<double> loopback = LoopbackLosses(job);
  ASSERT_EQ(loopback.size(), static_cast<size_t>(job.steps));
  StartCluster(4, LinkShape{1'000'000'000, absl::Milliseconds(1), 0}, false, Options(4));
  ASSERT_NE(cluster_, nullptr);
  // Every worker registered at its host's address.
  auto workers = cluster_->ListWorkers();
  ASSERT_TRUE(workers.ok()) << workers.status();
  for (const v1::WorkerInfo& w : *workers) {
    EXPECT_THAT(w.address(), HasSubstr("10.77.0.")) << w.name();
  }
  auto done = RunToEnd(*cluster_, job, absl::Seconds(120));
  ASSERT_TRUE(done.ok()) << done.status() << cluster_->Logs();
  ASSERT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << History(*done) << cluster_->Logs();
  ExpectLosses(*done, loopback);
  // The ranks are on four hosts.
  std::set<std::string> hosts;
  for (const v1::RankStatus& r : done->ranks()) hosts.insert(r.worker_id());
  EXPECT_EQ(hosts.size(), 4u);
}

// Waits for the job to have run `steps` steps; fails the test if it ended first.
v1::Job WaitForSteps(LocalCluster& c, const std::string& id, int64_t steps) {
  auto job = c.WaitForJob(
      id, [steps](const v1::Job& j) { return IsFinal(j) || j.global_steps_done() >= steps; },
      absl::Seconds(90));
  EXPECT_TRUE(job.ok()) << job.status() << c.Logs();
  if (!job.ok()) return v1::Job();
  EXPECT_EQ(job->state(), v1::JOB_STATE_RUNNING) << History(*job) << c.Logs();
  return *job;
}

TEST_F(NetnsCluster, ALinkCutMidStepIsFoundWithinTheLeaseAndTheJobRestartsWithUnchangedLosses) {
  Job job = TwoStages(40, /*restartable=*/true);
  const std::vector<double> loopback = LoopbackLosses(job);
  ASSERT_EQ(loopback.size(), static_cast<size_t>(job.steps));
  StartCluster(3, LinkShape{}, false, Options(3));  // two ranks and a spare
  ASSERT_NE(cluster_, nullptr);
  job.checkpoint_dir = cluster_->dir() + "/ckpt";
  auto id = cluster_->Submit(SpecYaml(job));
  ASSERT_TRUE(id.ok()) << id.status();
  const v1::Job running = WaitForSteps(*cluster_, *id, 6);
  ASSERT_EQ(running.ranks_size(), 2);
  const std::string cut_worker = running.ranks(1).worker_id();
  const int host = HostOf(cut_worker);
  ASSERT_GE(host, 1);
  const absl::Time cut_at = absl::Now();
  ASSERT_TRUE(hosts_->Cut(host, CutKind::kLinkDown).ok());
  std::cerr << "cut " << hosts_->name(host) << "'s link (" << cut_worker << ", rank 1) after "
            << running.global_steps_done() << " steps\n";

  auto done = cluster_->WaitForJob(*id, IsFinal, absl::Seconds(120));
  ASSERT_TRUE(done.ok()) << done.status() << cluster_->Logs();
  ASSERT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << History(*done) << cluster_->Logs();
  EXPECT_EQ(done->restarts(), 1) << History(*done);
  const int restarting = FindState(*done, v1::JOB_STATE_RESTARTING);
  ASSERT_GE(restarting, 0) << History(*done);
  EXPECT_THAT(done->history(restarting).reason(), HasSubstr(cut_worker));
  // Found lost by its lease (3 s from its last heartbeat, which came before the cut), with a
  // margin for the coordinator's tick.
  const absl::Duration found = EnteredAt(*done, v1::JOB_STATE_RESTARTING) - cut_at;
  std::cerr << "found after " << absl::FormatDuration(found) << "\n";
  EXPECT_LT(found, absl::Seconds(3) + absl::Seconds(2)) << History(*done);
  for (const v1::RankStatus& r : done->ranks()) EXPECT_NE(r.worker_id(), cut_worker);
  ExpectLosses(*done, loopback);
}

TEST_F(NetnsCluster, APartitionedCoordinatorNeitherLosesNorRepeatsAStepWhenItHeals) {
  RunPartition(absl::Seconds(3), "10s");
}

// Longer than a worker's call deadline (10 s): the calls made during the partition fail, and
// what they carried must still arrive.
TEST_F(NetnsCluster, APartitionLongerThanACallDeadlineLosesNoStepReport) {
  RunPartition(absl::Seconds(14), "40s");
}

void NetnsCluster::RunPartition(absl::Duration partition, const std::string& lease) {
  const Job job = TwoStages(150, /*restartable=*/false);
  const std::vector<double> loopback = LoopbackLosses(job);
  ASSERT_EQ(loopback.size(), static_cast<size_t>(job.steps));
  ClusterOptions options = Options(2);
  options.lease = lease;  // longer than the partition and TCP's retransmissions after it
  StartCluster(2, LinkShape{}, /*droppable=*/true, options);
  ASSERT_NE(cluster_, nullptr);
  auto id = cluster_->Submit(SpecYaml(job));
  ASSERT_TRUE(id.ok()) << id.status();
  const v1::Job before = WaitForSteps(*cluster_, *id, 5);
  // The coordinator's host drops every packet: the workers (and this test) cannot reach it, it
  // cannot reach them, and the workers still reach each other.
  ASSERT_TRUE(hosts_->Cut(0, CutKind::kDrop).ok());
  absl::SleepFor(partition);
  ASSERT_TRUE(hosts_->Heal(0).ok());
  // This test's own channel to the coordinator failed during the partition and may still be in
  // gRPC's reconnect backoff: retry until it answers (a bounded wait).
  auto healed = cluster_->WaitForJob(
      *id, [](const v1::Job&) { return true; }, absl::Seconds(60));
  ASSERT_TRUE(healed.ok()) << healed.status();
  std::cerr << "partitioned the coordinator for " << absl::FormatDuration(partition) << " after "
            << before.global_steps_done() << " steps; " << healed->global_steps_done()
            << " steps reported once healed\n";

  auto done = cluster_->WaitForJob(*id, IsFinal, absl::Seconds(120));
  ASSERT_TRUE(done.ok()) << done.status() << cluster_->Logs();
  ASSERT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << History(*done) << cluster_->Logs();
  EXPECT_EQ(done->attempt(), 1) << History(*done);
  EXPECT_EQ(done->restarts(), 0) << History(*done);
  EXPECT_EQ(done->global_steps_done(), job.steps);
  ExpectLosses(*done, loopback);
  EXPECT_GT(hosts_->relay_counters().cut + (hosts_->latency_by() == "netem" ? 1 : 0), 0)
      << "the partition dropped nothing";
}

// Longer than the lease: the coordinator finds both workers lost and restarts the job (its
// policy) once they are back; steps after the checkpoint run again, and the job's losses are
// still one per step, equal to the loopback run's.
TEST_F(NetnsCluster, APartitionLongerThanTheLeaseRestartsFromTheCheckpointWithEveryStepOnce) {
  Job job = TwoStages(150, /*restartable=*/true);
  const std::vector<double> loopback = LoopbackLosses(job);
  ASSERT_EQ(loopback.size(), static_cast<size_t>(job.steps));
  StartCluster(2, LinkShape{}, /*droppable=*/true, Options(2));
  ASSERT_NE(cluster_, nullptr);
  job.checkpoint_dir = cluster_->dir() + "/ckpt";
  auto id = cluster_->Submit(SpecYaml(job));
  ASSERT_TRUE(id.ok()) << id.status();
  const v1::Job before = WaitForSteps(*cluster_, *id, 9);
  ASSERT_TRUE(hosts_->Cut(0, CutKind::kDrop).ok());
  absl::SleepFor(absl::Seconds(6));  // twice the lease
  ASSERT_TRUE(hosts_->Heal(0).ok());
  std::cerr << "partitioned the coordinator for 6 s after " << before.global_steps_done()
            << " steps\n";
  auto done = cluster_->WaitForJob(*id, IsFinal, absl::Seconds(120));
  ASSERT_TRUE(done.ok()) << done.status() << cluster_->Logs();
  ASSERT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << History(*done) << cluster_->Logs();
  EXPECT_EQ(done->restarts(), 1) << History(*done);
  EXPECT_EQ(done->global_steps_done(), job.steps);
  ExpectLosses(*done, loopback);
  if (HasFailure()) std::cerr << History(*done) << "\n" << cluster_->Logs();
}

TEST_F(NetnsCluster, OnePercentPacketLossChangesNoLoss) {
  const Job job = TwoStages(40, /*restartable=*/false);
  const std::vector<double> loopback = LoopbackLosses(job);
  ASSERT_EQ(loopback.size(), static_cast<size_t>(job.steps));
  // The same switch for both runs (the relay where there is no netem), first without loss.
  StartCluster(2, LinkShape{}, /*droppable=*/true, Options(2));
  ASSERT_NE(cluster_, nullptr);
  absl::Duration took[2];
  for (int lossy = 0; lossy < 2; ++lossy) {
    if (lossy == 1) {
      // 0.5% on each link: 1% between two hosts.
      for (int h = 0; h < hosts_->size(); ++h) {
        ASSERT_TRUE(hosts_->Shape(h, LinkShape{0, absl::ZeroDuration(), 0.005}).ok());
      }
    }
    const absl::Time start = absl::Now();
    auto done = RunToEnd(*cluster_, job, absl::Seconds(180));
    ASSERT_TRUE(done.ok()) << done.status() << cluster_->Logs();
    ASSERT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << History(*done) << cluster_->Logs();
    took[lossy] = absl::Now() - start;
    ExpectLosses(*done, loopback);
  }
  // How much slower is a figure to read, not to assert (timing depends on this machine's load).
  std::cerr << "submit to end: " << absl::FormatDuration(took[0]) << " without loss, "
            << absl::FormatDuration(took[1]) << " with 1% loss\n";
  if (hosts_->latency_by() == "relay") {
    EXPECT_GT(hosts_->relay_counters().lost, 0) << "no packet was lost";
  }
}

}  // namespace
}  // namespace stagecoach::testing::netns_cluster_test
