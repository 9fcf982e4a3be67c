// Both daemons' /metrics endpoints scraped over HTTP while a real coordinator and workers run a
// short pipeline job: the step counter equals the job's steps, the loss gauge equals the loss
// `stagectl status -o json` reports, per-action-type histograms counted every F and B, and the
// byte counters agree between the workers and the coordinator.
#include <algorithm>
#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/support/job_predicates.h"
#include "tests/support/local_cluster.h"
#include "tests/support/prometheus_scrape.h"

namespace stagecoach::testing::metrics_test {
namespace {

constexpr int kSteps = 4;
constexpr int kMicrobatches = 4;

// The value of `series` in `samples`, NaN when missing.
double Value(const std::map<std::string, double>& samples, const std::string& series) {
  auto it = samples.find(series);
  return it == samples.end() ? std::nan("") : it->second;
}

TEST(Metrics, ScrapedValuesFollowARealJob) {
  ClusterOptions options;
  options.workers = 2;
  options.coordinator_args = {"--metrics-listen", "127.0.0.1:0"};
  options.worker_args = {"--metrics-listen", "127.0.0.1:0"};
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  auto coordinator_metrics = ReadMetricsAddress(c.coordinator());
  ASSERT_TRUE(coordinator_metrics.ok()) << coordinator_metrics.status();
  std::vector<std::string> worker_metrics;
  for (int i = 0; i < c.num_workers(); ++i) {
    auto address = ReadMetricsAddress(c.worker(i));
    ASSERT_TRUE(address.ok()) << address.status();
    worker_metrics.push_back(*address);
  }

  // Before any job: zero steps, build info, every known state present.
  auto before = Scrape(*coordinator_metrics);
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_EQ(Value(*before, "stagecoach_steps_total"), 0);
  EXPECT_EQ(Value(*before, "stagecoach_jobs{state=\"running\"}"), 0);
  EXPECT_EQ(Value(*before, "stagecoach_build_info{version=\"0.1.0\"}"), 1)
      << "the version label comes from CMake's project(VERSION)";

  const std::string spec = c.WriteFile(
      "mlp.yaml",
      absl::StrCat("name: metrics\n",
                   "model:\n  builtin: {family: mlp, sizes: [8, 16, 16, 4], seed: 1}\n",
                   "split: {stages: 2}\nschedule: {kind: 1F1B, microbatches: ", kMicrobatches,
                   "}\ntraining: {batch_size: 16, steps: ", kSteps, ", loss: mse}\n"));
  CommandResult submit = c.Stagectl({"submit", spec});
  ASSERT_EQ(submit.exit_code, 0) << submit.err;
  const std::string job_id = LastLine(submit.out);
  ASSERT_FALSE(job_id.empty()) << submit.out;
  auto done = c.WaitForJob(job_id, IsFinal, absl::Seconds(90));
  ASSERT_TRUE(done.ok()) << done.status() << c.Logs();
  ASSERT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->reason() << c.Logs();

  CommandResult status = c.Stagectl({"status", job_id, "-o", "json"});
  ASSERT_EQ(status.exit_code, 0) << status.err;
  const nlohmann::json j = nlohmann::json::parse(status.out);
  ASSERT_EQ(j["losses"].size(), static_cast<size_t>(kSteps));
  const double last_loss = j["losses"].back().get<double>();

  // The job/worker gauges are refreshed on the coordinator's tick (100 ms): poll until they are
  // (the bound is for a machine under load; the loop ends as soon as they are).
  std::map<std::string, double> coord;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  do {
    auto scraped = Scrape(*coordinator_metrics);
    ASSERT_TRUE(scraped.ok()) << scraped.status();
    coord = *std::move(scraped);
    if (Value(coord, "stagecoach_jobs{state=\"succeeded\"}") == 1 &&
        Value(coord, "stagecoach_workers{state=\"idle\"}") == 2) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(100));
  } while (absl::Now() < deadline);
  EXPECT_EQ(Value(coord, "stagecoach_jobs{state=\"succeeded\"}"), 1);
  EXPECT_EQ(Value(coord, "stagecoach_jobs{state=\"running\"}"), 0);
  EXPECT_EQ(Value(coord, "stagecoach_workers{state=\"idle\"}"), 2);
  EXPECT_EQ(Value(coord, "stagecoach_steps_total"), kSteps);
  EXPECT_EQ(Value(coord, "stagecoach_step_duration_seconds_count"), kSteps);
  EXPECT_GT(Value(coord, "stagecoach_step_duration_seconds_sum"), 0);
  const std::string job_label = absl::StrCat("{job=\"", job_id, "\"}");
  EXPECT_NEAR(Value(coord, "stagecoach_loss" + job_label), last_loss,
              1e-12 * std::max(1.0, std::abs(last_loss)));
  EXPECT_GT(Value(coord, "stagecoach_samples_per_second" + job_label), 0);
  for (int rank = 0; rank < 2; ++rank) {
    const double bubble = Value(coord, absl::StrCat("stagecoach_bubble_ratio{job=\"", job_id,
                                                    "\",rank=\"", rank, "\",replica=\"0\"}"));
    EXPECT_GE(bubble, 0) << rank;
    EXPECT_LE(bubble, 1) << rank;
  }
  const double coord_sent = Value(coord, "stagecoach_data_plane_bytes_total{direction=\"sent\"}");
  EXPECT_GT(coord_sent, 0);
  EXPECT_EQ(coord_sent, Value(coord, "stagecoach_data_plane_bytes_total{direction=\"received\"}"))
      << "every byte a rank sends another receives";
  // The process's own memory, read at the scrape: a LibTorch-free coordinator holds megabytes.
  EXPECT_GT(Value(coord, "stagecoach_process_resident_memory_bytes"), 1 << 20);
  EXPECT_GT(Value(coord, "stagecoach_process_heap_in_use_bytes"), 1 << 16);

  // Each worker ran one rank: every step, and an F and a B per microbatch and step.
  double workers_sent = 0;
  for (size_t i = 0; i < worker_metrics.size(); ++i) {
    auto scraped = Scrape(worker_metrics[i]);
    ASSERT_TRUE(scraped.ok()) << scraped.status();
    const auto& w = *scraped;
    EXPECT_EQ(Value(w, "stagecoach_worker_step_duration_seconds_count"), kSteps) << i;
    EXPECT_GT(Value(w, "stagecoach_process_heap_in_use_bytes"), 1 << 20) << i;
    EXPECT_GT(Value(w, "stagecoach_process_resident_memory_bytes"),
              Value(w, "stagecoach_process_heap_in_use_bytes") / 4)
        << i;
    EXPECT_EQ(Value(w, "stagecoach_action_duration_seconds_count{type=\"F\"}"),
              kSteps * kMicrobatches)
        << i;
    EXPECT_EQ(Value(w, "stagecoach_action_duration_seconds_count{type=\"B\"}"),
              kSteps * kMicrobatches)
        << i;
    EXPECT_GT(Value(w, "stagecoach_action_duration_seconds_sum{type=\"F\"}"), 0) << i;
    // Pre-initialised types this schedule does not use are present at zero.
    EXPECT_EQ(Value(w, "stagecoach_action_duration_seconds_count{type=\"W\"}"), 0) << i;
    EXPECT_EQ(Value(w, "stagecoach_build_info{version=\"0.1.0\"}"), 1) << i;
    workers_sent += Value(w, "stagecoach_worker_bytes_total{direction=\"sent\"}");
    // Per peer: a rank of a 2-rank pipeline talks to the other rank only, both ways.
    for (const char* direction : {"sent", "received"}) {
      double by_peer = 0;
      int peers = 0;
      for (int peer = 0; peer < 2; ++peer) {
        const double v = Value(w, absl::StrCat("stagecoach_worker_peer_bytes_total{direction=\"",
                                               direction, "\",peer_rank=\"", peer, "\"}"));
        if (std::isnan(v)) continue;
        by_peer += v;
        ++peers;
      }
      EXPECT_EQ(peers, 1) << i << " " << direction;
      EXPECT_EQ(by_peer, Value(w, absl::StrCat("stagecoach_worker_bytes_total{direction=\"",
                                               direction, "\"}")))
          << i << " " << direction;
    }
    // RPC latency by method: the coordinator started the task and told it to finish.
    EXPECT_EQ(
        Value(w,
              "stagecoach_rpc_server_duration_seconds_count{code=\"OK\",method=\"WorkerService/"
              "StartTask\"}"),
        1)
        << i;
    EXPECT_GE(
        Value(w,
              "stagecoach_rpc_server_duration_seconds_count{code=\"OK\",method=\"WorkerService/"
              "ControlTask\"}"),
        1)
        << i;
  }
  EXPECT_EQ(workers_sent, coord_sent);
  // The coordinator's RPCs: one submission, a step report per rank and step, no restart.
  EXPECT_EQ(
      Value(coord,
            "stagecoach_rpc_server_duration_seconds_count{code=\"OK\",method=\"CoordinatorService/"
            "SubmitJob\"}"),
      1);
  EXPECT_EQ(
      Value(coord,
            "stagecoach_rpc_server_duration_seconds_count{code=\"OK\",method=\"CoordinatorService/"
            "ReportStep\"}"),
      2 * kSteps);
  EXPECT_EQ(Value(coord, "stagecoach_job_restarts_total"), 0);
}

TEST(Metrics, ABadMetricsAddressIsRefusedNamingTheFlag) {
  CommandResult r =
      RunCommand({CoordinatorBinary(), "--listen", "127.0.0.1:0", "--metrics-listen", "nowhere"},
                 absl::Seconds(30));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(absl::StrContains(r.err, "--metrics-listen")) << r.err;
  r = RunCommand({WorkerBinary(), "--coordinator", "127.0.0.1:1", "--metrics-listen", "nowhere"},
                 absl::Seconds(30));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(absl::StrContains(r.err, "--metrics-listen")) << r.err;
}

}  // namespace
}  // namespace stagecoach::testing::metrics_test
