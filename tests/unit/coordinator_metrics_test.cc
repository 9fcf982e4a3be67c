// The coordinator's metrics as JobManager feeds them, read from a real Prometheus registry
// (no HTTP): steps, step durations and bytes advance with reported steps, the loss gauge equals
// the job's reported loss, and jobs and workers move between states.
#include "coordinator/metrics/coordinator_metrics.h"

#include <cmath>
#include <memory>

#include "common/metrics/metrics.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "tests/unit/coordinator_test_fakes.h"

namespace stagecoach::coordinator::coordinator_metrics_test {
namespace {

// The value of the series `name{labels}`: a gauge's or counter's value, a histogram's sample
// count; NaN when there is no such series.
double Sample(const prometheus::Registry& registry, const std::string& name,
              const std::map<std::string, std::string>& labels = {}) {
  for (const prometheus::MetricFamily& family : registry.Collect()) {
    if (family.name != name) continue;
    for (const prometheus::ClientMetric& m : family.metric) {
      std::map<std::string, std::string> have;
      for (const auto& l : m.label) have[l.name] = l.value;
      if (have != labels) continue;
      switch (family.type) {
        case prometheus::MetricType::Gauge:
          return m.gauge.value;
        case prometheus::MetricType::Counter:
          return m.counter.value;
        case prometheus::MetricType::Histogram:
          return static_cast<double>(m.histogram.sample_count);
        default:
          return std::nan("");
      }
    }
  }
  return std::nan("");
}

class CoordinatorMetricsTest : public ::testing::Test {
 protected:
  CoordinatorMetricsTest() : metrics_(registry_) {
    JobManagerOptions options;
    options.lease = absl::Seconds(5);
    options.heartbeat_interval = absl::Seconds(1);
    JobManagerDeps deps{&clock_, &workers_, &kv_, &metrics_};
    deps.executor = &executor_;
    manager_ = std::make_unique<JobManager>(options, deps);
  }

  std::string Register(int n) {
    v1::RegisterWorkerRequest req;
    req.set_name(absl::StrCat("worker", n));
    req.set_address(absl::StrCat("10.0.0.", n, ":7000"));
    req.set_device("cpu");
    auto resp = manager_->RegisterWorker(req);
    EXPECT_TRUE(resp.ok()) << resp.status();
    return resp->worker_id();
  }
  absl::Status Step(const std::string& job, const std::string& worker, int rank, int step,
                    absl::Duration step_time, double bubble, std::vector<double> losses = {}) {
    v1::ReportStepRequest r;
    r.set_worker_id(worker);
    r.set_job_id(job);
    r.set_attempt(1);
    r.set_rank(rank);
    r.set_step(step);
    for (double l : losses) r.add_microbatch_losses(l);
    r.set_bytes_sent(100);
    r.set_bytes_received(40);
    r.mutable_step_time()->set_nanos(static_cast<int32_t>(absl::ToInt64Nanoseconds(step_time)));
    r.set_bubble_ratio(bubble);
    return manager_->ReportStep(r);
  }
  // A 2-stage 1F1B MLP job of 4 microbatches and 2 steps, RUNNING on the registered workers.
  absl::StatusOr<std::string> SubmitRunningMlp() {
    auto id = manager_->SubmitJob(
        "name: t\nmodel: {builtin: {family: mlp, sizes: [4, 8, 8, 8, 2]}}\nsplit: {stages: 2}\n"
        "schedule: {kind: 1F1B, microbatches: 4}\ntraining: {batch_size: 8, steps: 2}\n",
        "spec.yaml");
    if (!id.ok()) return id.status();
    if (!Eventually([&] { return State(*id) == v1::JOB_STATE_RUNNING; })) {
      return absl::DeadlineExceededError(absl::StrCat(*id, " is not RUNNING"));
    }
    return id;
  }
  // Runs what the manager queued (calls to the fake workers), then checks `cond`.
  bool Eventually(const std::function<bool()>& cond) {
    executor_.RunUntilIdle();
    return cond();
  }
  v1::JobState State(const std::string& id) {
    auto job = manager_->GetJob(id);
    return job.ok() ? job->state() : v1::JOB_STATE_UNSPECIFIED;
  }
  double Jobs(const std::string& state) {
    manager_->Tick();  // the counts are refreshed each tick
    return Sample(registry_, "stagecoach_jobs", {{"state", state}});
  }
  double Workers(const std::string& state) {
    manager_->Tick();
    return Sample(registry_, "stagecoach_workers", {{"state", state}});
  }

  prometheus::Registry registry_;
  CoordinatorMetrics metrics_;
  FakeClock clock_;
  FakeWorkerClient workers_;
  KvStore kv_;
  ManualExecutor executor_;
  std::unique_ptr<JobManager> manager_;
};

TEST_F(CoordinatorMetricsTest, KnownStatesAndCountersStartAtZero) {
  for (const char* state : {"pending", "running", "succeeded", "failed", "cancelled"}) {
    EXPECT_EQ(Sample(registry_, "stagecoach_jobs", {{"state", state}}), 0) << state;
  }
  for (const char* state : {"idle", "busy", "lost"}) {
    EXPECT_EQ(Sample(registry_, "stagecoach_workers", {{"state", state}}), 0) << state;
  }
  EXPECT_EQ(Sample(registry_, "stagecoach_steps_total"), 0);
  EXPECT_EQ(Sample(registry_, "stagecoach_data_plane_bytes_total", {{"direction", "sent"}}), 0);
  EXPECT_EQ(Sample(registry_, "stagecoach_step_duration_seconds"), 0);
}

TEST_F(CoordinatorMetricsTest, StepsLossAndStatesFollowTheJob) {
  const std::string w1 = Register(1), w2 = Register(2);
  EXPECT_EQ(Workers("idle"), 2);
  auto id = SubmitRunningMlp();
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(Jobs("running"), 1);
  EXPECT_EQ(Jobs("pending"), 0);
  EXPECT_EQ(Workers("busy"), 2);
  EXPECT_EQ(Workers("idle"), 0);

  // Step 0: nothing counts until every rank reported; bytes count per report.
  ASSERT_TRUE(Step(*id, w2, 1, 0, absl::Milliseconds(300), 0.25, {1.0, 2.0, 3.0, 6.0}).ok());
  EXPECT_EQ(Sample(registry_, "stagecoach_steps_total"), 0);
  EXPECT_EQ(Sample(registry_, "stagecoach_data_plane_bytes_total", {{"direction", "sent"}}), 100);
  ASSERT_TRUE(Step(*id, w1, 0, 0, absl::Milliseconds(400), 0.5).ok());
  EXPECT_EQ(Sample(registry_, "stagecoach_steps_total"), 1);
  EXPECT_EQ(Sample(registry_, "stagecoach_step_duration_seconds"), 1);
  EXPECT_EQ(Sample(registry_, "stagecoach_loss", {{"job", *id}}), 3.0);
  // batch_size 8 over the slowest rank's 0.4 s.
  EXPECT_DOUBLE_EQ(Sample(registry_, "stagecoach_samples_per_second", {{"job", *id}}), 20.0);
  EXPECT_EQ(
      Sample(registry_, "stagecoach_bubble_ratio", {{"job", *id}, {"rank", "0"}, {"replica", "0"}}),
      0.5);
  EXPECT_EQ(
      Sample(registry_, "stagecoach_bubble_ratio", {{"job", *id}, {"rank", "1"}, {"replica", "0"}}),
      0.25);

  // Step 1: the gauges follow the last step, the counters add up.
  ASSERT_TRUE(Step(*id, w1, 0, 1, absl::Milliseconds(100), 0.125).ok());
  ASSERT_TRUE(Step(*id, w2, 1, 1, absl::Milliseconds(200), 0.375, {0.5, 0.5, 0.5, 0.5}).ok());
  EXPECT_EQ(Sample(registry_, "stagecoach_steps_total"), 2);
  EXPECT_EQ(Sample(registry_, "stagecoach_step_duration_seconds"), 2);
  auto job = manager_->GetJob(*id);
  ASSERT_TRUE(job.ok());
  ASSERT_EQ(job->losses_size(), 2);
  EXPECT_EQ(Sample(registry_, "stagecoach_loss", {{"job", *id}}), job->losses(1));
  EXPECT_DOUBLE_EQ(Sample(registry_, "stagecoach_samples_per_second", {{"job", *id}}), 40.0);
  EXPECT_EQ(
      Sample(registry_, "stagecoach_bubble_ratio", {{"job", *id}, {"rank", "1"}, {"replica", "0"}}),
      0.375);
  EXPECT_EQ(Sample(registry_, "stagecoach_data_plane_bytes_total", {{"direction", "sent"}}), 400);
  EXPECT_EQ(Sample(registry_, "stagecoach_data_plane_bytes_total", {{"direction", "received"}}),
            160);

  // The slowest rank's times went into the histogram: 0.4 s + 0.2 s.
  double sum = -1;
  for (const auto& family : registry_.Collect()) {
    if (family.name == "stagecoach_step_duration_seconds") {
      sum = family.metric.at(0).histogram.sample_sum;
    }
  }
  EXPECT_NEAR(sum, 0.6, 1e-9);

  auto cancelled = manager_->CancelJob(*id, "test");
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(Jobs("cancelled"), 1);
  EXPECT_EQ(Jobs("running"), 0);
  EXPECT_TRUE(Eventually([&] { return Workers("idle") == 2; }));
}

TEST_F(CoordinatorMetricsTest, TokenDataStepsSetTokensPerSecondAndPaddingWaste) {
  const std::string w1 = Register(1), w2 = Register(2);
  auto id = manager_->SubmitJob(
      "name: t\nmodel: {builtin: {family: gpt, vocab: 16, d_model: 8, layers: 2, heads: 2, "
      "seq: 8}}\nsplit: {stages: 2}\nschedule: {kind: 1F1B, microbatches: 2}\n"
      "training: {batch_size: 4, steps: 2, loss: cross_entropy}\n"
      "data: {kind: tokens, path: /d/t.bin, eos: 3}\n",
      "spec.yaml");
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE(Eventually([&] { return State(*id) == v1::JOB_STATE_RUNNING; }));
  ASSERT_TRUE(Step(*id, w1, 0, 0, absl::Milliseconds(500), 0.5).ok());
  // The last stage's rank counted 24 of the 32 positions its microbatches computed.
  v1::ReportStepRequest last;
  last.set_worker_id(w2);
  last.set_job_id(*id);
  last.set_attempt(1);
  last.set_rank(1);
  last.set_step(0);
  last.add_microbatch_losses(1.0);
  last.add_microbatch_losses(2.0);
  last.set_counted_tokens(24);
  last.set_computed_positions(32);
  last.mutable_step_time()->set_nanos(250'000'000);
  ASSERT_TRUE(manager_->ReportStep(last).ok());
  // Over the slowest rank's 0.5 s; the loss normalised by tokens is the shares' sum.
  EXPECT_DOUBLE_EQ(Sample(registry_, "stagecoach_tokens_per_second", {{"job", *id}}), 48.0);
  EXPECT_DOUBLE_EQ(Sample(registry_, "stagecoach_padding_waste", {{"job", *id}}), 0.25);
  EXPECT_DOUBLE_EQ(Sample(registry_, "stagecoach_loss", {{"job", *id}}), 3.0);
}

TEST_F(CoordinatorMetricsTest, ReplicatedJobsLabelEachRankWithItsReplica) {
  prometheus::Registry registry;
  CoordinatorMetrics metrics(registry);
  // 2 ranks x 2 replicas, indexed replica by replica.
  metrics.StepCompleted("job-1", absl::Seconds(1), 1.0, 8.0, {0.1, 0.2, 0.3, 0.4},
                        {0.0, 0.5, 0.25, 0.75}, /*num_ranks=*/2);
  EXPECT_EQ(Sample(registry, "stagecoach_bubble_ratio",
                   {{"job", "job-1"}, {"rank", "0"}, {"replica", "1"}}),
            0.3);
  EXPECT_EQ(Sample(registry, "stagecoach_grad_reduction_hidden_ratio",
                   {{"job", "job-1"}, {"rank", "1"}, {"replica", "1"}}),
            0.75);
  EXPECT_EQ(Sample(registry, "stagecoach_grad_reduction_hidden_ratio",
                   {{"job", "job-1"}, {"rank", "1"}, {"replica", "0"}}),
            0.5);
}

TEST_F(CoordinatorMetricsTest, EachRanksHeldBytesAndPeakFollowItsLatestStepReport) {
  const std::string w1 = Register(1), w2 = Register(2);
  auto id = SubmitRunningMlp();
  ASSERT_TRUE(id.ok()) << id.status();
  auto report = [&](const std::string& worker, int rank, int step, int64_t params) {
    v1::ReportStepRequest r;
    r.set_worker_id(worker);
    r.set_job_id(*id);
    r.set_attempt(1);
    r.set_rank(rank);
    r.set_step(step);
    if (rank == 1) {
      for (int mb = 0; mb < 4; ++mb) r.add_microbatch_losses(1.0);
    }
    r.mutable_step_time()->set_nanos(1'000'000);
    r.set_held_parameter_bytes(params);
    r.set_held_gradient_bytes(params / 2);
    r.set_peak_live_bytes(params * 3);
    r.set_peak_activation_bytes(params * 2);
    return manager_->ReportStep(r);
  };
  const std::map<std::string, std::string> rank1 = {{"job", *id}, {"rank", "1"}, {"replica", "0"}};
  ASSERT_TRUE(report(w1, 0, 0, 1000).ok());
  EXPECT_TRUE(std::isnan(Sample(registry_, "stagecoach_held_parameter_bytes", rank1)))
      << "nothing until the step completes";
  ASSERT_TRUE(report(w2, 1, 0, 600).ok());
  EXPECT_EQ(Sample(registry_, "stagecoach_held_parameter_bytes",
                   {{"job", *id}, {"rank", "0"}, {"replica", "0"}}),
            1000);
  EXPECT_EQ(Sample(registry_, "stagecoach_held_parameter_bytes", rank1), 600);
  EXPECT_EQ(Sample(registry_, "stagecoach_held_gradient_bytes", rank1), 300);
  EXPECT_EQ(Sample(registry_, "stagecoach_peak_live_bytes", rank1), 1800);
  // The first step's activation peaks too (they once went to the metrics before the step had
  // made the job's series, and were dropped).
  EXPECT_EQ(Sample(registry_, "stagecoach_activation_peak_bytes", rank1), 1200);
  EXPECT_TRUE(std::isnan(Sample(registry_, "stagecoach_parameter_gather_hidden_ratio", rank1)))
      << "no sharded parameters, no all-gathers";
  ASSERT_TRUE(report(w1, 0, 1, 1000).ok());
  ASSERT_TRUE(report(w2, 1, 1, 400).ok());
  EXPECT_EQ(Sample(registry_, "stagecoach_held_parameter_bytes", rank1), 400);
  EXPECT_EQ(Sample(registry_, "stagecoach_peak_live_bytes", rank1), 1200);
}

TEST_F(CoordinatorMetricsTest, ShardedReplicasReportTheirGathersHiddenRatioPerRank) {
  prometheus::Registry registry;
  CoordinatorMetrics metrics(registry);
  metrics.StepCompleted("job-1", absl::Seconds(1), 1.0, 8.0, {0.1, 0.2, 0.3, 0.4},
                        {0.0, 0.5, 0.25, 0.75}, /*num_ranks=*/2);
  std::vector<TaskHeldMemory> tasks(4);
  for (int task = 0; task < 4; ++task) {
    tasks[task].held_parameter_bytes = 100 * (task + 1);
    tasks[task].gather_hidden_ratio = 0.125 * task;
  }
  metrics.HeldMemory("job-1", tasks, /*num_ranks=*/2);
  const std::map<std::string, std::string> replica1_rank0 = {
      {"job", "job-1"}, {"rank", "0"}, {"replica", "1"}};
  EXPECT_EQ(Sample(registry, "stagecoach_held_parameter_bytes", replica1_rank0), 300);
  EXPECT_EQ(Sample(registry, "stagecoach_parameter_gather_hidden_ratio", replica1_rank0), 0.25);
  // A job evicted from the series loses these too; HeldMemory does not bring them back.
  for (int i = 0; i < CoordinatorMetrics::kMaxJobSeries; ++i) {
    metrics.StepCompleted(absl::StrCat("other-", i), absl::Seconds(1), 1.0, 8.0, {0.1});
  }
  EXPECT_TRUE(std::isnan(Sample(registry, "stagecoach_held_parameter_bytes", replica1_rank0)));
  EXPECT_TRUE(
      std::isnan(Sample(registry, "stagecoach_parameter_gather_hidden_ratio", replica1_rank0)));
  metrics.HeldMemory("job-1", tasks, /*num_ranks=*/2);
  EXPECT_TRUE(std::isnan(Sample(registry, "stagecoach_held_parameter_bytes", replica1_rank0)));
}

TEST_F(CoordinatorMetricsTest, PerJobSeriesAreBoundedToTheMostRecentJobs) {
  prometheus::Registry registry;
  CoordinatorMetrics metrics(registry);
  for (int i = 0; i < CoordinatorMetrics::kMaxJobSeries + 3; ++i) {
    metrics.StepCompleted(absl::StrCat("job-", i), absl::Seconds(1), 1.0 * i, 8.0, {0.1, 0.2});
  }
  EXPECT_TRUE(std::isnan(Sample(registry, "stagecoach_loss", {{"job", "job-0"}})));
  EXPECT_TRUE(std::isnan(Sample(registry, "stagecoach_bubble_ratio",
                                {{"job", "job-2"}, {"rank", "1"}, {"replica", "0"}})));
  EXPECT_EQ(Sample(registry, "stagecoach_loss", {{"job", "job-3"}}), 3.0);
  size_t loss_series = 0;
  for (const auto& family : registry.Collect()) {
    if (family.name == "stagecoach_loss") loss_series = family.metric.size();
  }
  EXPECT_EQ(loss_series, static_cast<size_t>(CoordinatorMetrics::kMaxJobSeries));
  EXPECT_EQ(Sample(registry, "stagecoach_steps_total"), CoordinatorMetrics::kMaxJobSeries + 3);
}

TEST(CoordinatorMetricsRestarts, CountRestartsFromZero) {
  prometheus::Registry registry;
  CoordinatorMetrics metrics(registry);
  // Pre-initialised: the series exists (0, not absent) before any restart.
  EXPECT_EQ(Sample(registry, "stagecoach_job_restarts_total"), 0);
  EXPECT_NE(metrics::SerializeText(registry).find("stagecoach_job_restarts_total 0"),
            std::string::npos);
  metrics.JobRestarted();
  metrics.JobRestarted();
  EXPECT_EQ(Sample(registry, "stagecoach_job_restarts_total"), 2);
}

TEST(CoordinatorMetricsRecovery, DegradedJobsAndWhatRecoveriesCostAreSeries) {
  prometheus::Registry registry;
  CoordinatorMetrics metrics(registry);
  // Both kinds pre-initialised.
  EXPECT_EQ(Sample(registry, "stagecoach_job_recovery_seconds", {{"kind", "carry_on"}}), 0);
  EXPECT_EQ(Sample(registry, "stagecoach_job_steps_lost_total", {{"kind", "restart"}}), 0);
  metrics.recovery().Recovered(RecoveryMetrics::kCarryOn, absl::Milliseconds(70), 0);
  metrics.recovery().Recovered(RecoveryMetrics::kRestart, absl::Seconds(2), 7);
  EXPECT_EQ(Sample(registry, "stagecoach_job_recovery_seconds", {{"kind", "carry_on"}}), 1);
  EXPECT_EQ(Sample(registry, "stagecoach_job_steps_lost_total", {{"kind", "restart"}}), 7);
  // A job's replicas are series of its own once it completed a step.
  metrics.ReplicaHealth("job-1", 1, 2);
  EXPECT_TRUE(std::isnan(Sample(registry, "stagecoach_job_degraded", {{"job", "job-1"}})));
  metrics.StepCompleted("job-1", absl::Milliseconds(10), 1.0, 100.0, {0.1, 0.1});
  metrics.ReplicaHealth("job-1", 1, 2);
  EXPECT_EQ(Sample(registry, "stagecoach_job_degraded", {{"job", "job-1"}}), 1);
  EXPECT_EQ(Sample(registry, "stagecoach_job_healthy_replicas", {{"job", "job-1"}}), 1);
  metrics.ReplicaHealth("job-1", 2, 2);
  EXPECT_EQ(Sample(registry, "stagecoach_job_degraded", {{"job", "job-1"}}), 0);
}

TEST(MetricsBuildInfo, CarriesTheProjectVersion) {
  prometheus::Registry registry;
  metrics::AddBuildInfo(registry);
  EXPECT_STRNE(metrics::BuildVersion(), "");
  EXPECT_EQ(Sample(registry, "stagecoach_build_info", {{"version", metrics::BuildVersion()}}), 1);
}

}  // namespace
}  // namespace stagecoach::coordinator::coordinator_metrics_test
