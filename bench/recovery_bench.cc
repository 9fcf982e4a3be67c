// What a lost worker costs today (issue 39's baseline): a job with restart.max_restarts on real
// daemons (tests/support/local_cluster.h), a coordinator and --workers workers on loopback (one
// more than the job needs: the spare). Each round runs a 2-stage 1F1B MLP job with AdamW and a
// checkpoint every --every steps, SIGKILLs the worker of rank 1 once the job has done --kill-at
// steps, and measures, from the kill:
//   - detection: until the job leaves RUNNING or starts its next attempt (the coordinator finds
//     the rank lost: the surviving rank's report of a broken link, else the worker's lease);
//   - recovery: until the first step of the new attempt completes (placement on the spare,
//     rendezvous, restore from the latest complete checkpoint on disk, one step);
//   - catch-up: until the job is one step past where the kill found it (the lost steps run
//     again);
//   - steps lost: steps done at the kill minus the checkpoint the new attempt starts from.
// Prints each round and the medians. The cluster's lease is --lease (the coordinator's
// --lease; the default deployment's is 10 s).
//
//   build/bench/recovery_bench [--rounds 3] [--every 10] [--kill-at 17] [--lease 3s]
#include <signal.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/bench_support.h"
#include "bench/cluster_runs.h"
#include "tests/support/local_cluster.h"

namespace bench = stagecoach::bench;
namespace v1 = stagecoach::v1;
using stagecoach::testing::ClusterOptions;
using stagecoach::testing::LocalCluster;

namespace {

std::string Spec(int every) {
  return absl::StrCat(
      "name: recovery\n",
      "model:\n  builtin: {family: mlp, sizes: [256, 512, 512, 512, 512, 16], seed: 1}\n",
      "split: {stages: 2}\nschedule: {kind: 1F1B, microbatches: 4}\n", "placement: {workers: 2}\n",
      "training:\n  batch_size: 32\n  steps: 100000\n  loss: mse\n",
      "  optimizer: {kind: adamw, lr: 1.0e-3}\n", "  checkpoint: {dir: CKPT, every_steps: ", every,
      "}\n", "data: {kind: synthetic, seed: 4}\n", "restart: {max_restarts: 3}\n");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"the cost of a lost worker: full restart from a disk checkpoint"};
  int rounds = 3, every = 10, kill_at = 17, workers = 3;
  std::string lease = "3s";
  app.add_option("--rounds", rounds);
  app.add_option("--every", every, "training.checkpoint.every_steps");
  app.add_option("--kill-at", kill_at, "steps done when rank 1's worker is killed");
  app.add_option("--workers", workers);
  app.add_option("--lease", lease);
  CLI11_PARSE(app, argc, argv);

  std::vector<double> detection, recovery, catch_up, lost;
  for (int round = 0; round < rounds; ++round) {
    ClusterOptions options;
    options.workers = workers;
    options.lease = lease;
    options.log_level = "info";
    auto cluster = bench::Value("starting the cluster", LocalCluster::Start(options));
    LocalCluster& c = *cluster;
    std::string spec = Spec(every);
    spec.replace(spec.find("CKPT"), 4, c.dir() + "/ckpt");
    const std::string id = bench::Value("submitting", c.Submit(spec));
    const v1::Job running = bench::Value(
        "running", c.WaitForJob(
                       id,
                       [&](const v1::Job& j) {
                         return bench::Finished(j) || (j.state() == v1::JOB_STATE_RUNNING &&
                                                       j.global_steps_done() >= kill_at);
                       },
                       absl::Seconds(120)));
    if (running.state() != v1::JOB_STATE_RUNNING || running.ranks_size() < 2) {
      bench::Fail("running", absl::InternalError(running.reason()));
    }
    const int index = c.WorkerIndex(running.ranks(1).worker_id());
    if (index < 0) {
      bench::Fail("finding rank 1's worker",
                  absl::NotFoundError(running.ranks(1).worker_id() + " is not a worker process"));
    }
    std::fprintf(stderr, "round %d: killing worker %d (%s, rank %d)\n", round, index,
                 running.ranks(1).worker_id().c_str(), running.ranks(1).rank());
    const absl::Time killed = absl::Now();
    c.worker(index).Signal(SIGKILL);
    auto left_or = c.WaitForJob(
        id,
        [](const v1::Job& j) {
          // A restart can be over between two polls: the attempt number says it happened.
          return j.state() != v1::JOB_STATE_RUNNING || j.attempt() >= 2;
        },
        absl::Seconds(60));
    if (!left_or.ok()) {
      bench::Fail("detection",
                  absl::Status(left_or.status().code(),
                               absl::StrCat(left_or.status().message(), "\n", c.Logs())));
    }
    const v1::Job left = *left_or;
    const absl::Duration detected = absl::Now() - killed;
    // Steps done when the kill landed: the job's count just before it left RUNNING.
    const int64_t done_at_kill = std::max(running.global_steps_done(), left.global_steps_done());
    int64_t restored = -1;
    const v1::Job next =
        bench::Value("recovery", c.WaitForJob(
                                     id,
                                     [&](const v1::Job& j) {
                                       if (bench::Finished(j)) return true;
                                       if (j.attempt() < 2 || j.state() != v1::JOB_STATE_RUNNING)
                                         return false;
                                       int64_t from = 0;
                                       for (const auto& ck : j.checkpoints()) {
                                         if (ck.step() <= done_at_kill)
                                           from = std::max<int64_t>(from, ck.step());
                                       }
                                       restored = from;
                                       return j.global_steps_done() > from;
                                     },
                                     absl::Seconds(300)));
    if (bench::Finished(next)) bench::Fail("recovery", absl::InternalError(next.reason()));
    const absl::Duration recovered = absl::Now() - killed;
    // Back where it was: the steps after the checkpoint run again.
    const v1::Job caught_up = bench::Value(
        "catching up", c.WaitForJob(
                           id,
                           [&](const v1::Job& j) {
                             return bench::Finished(j) || j.global_steps_done() > done_at_kill;
                           },
                           absl::Seconds(300)));
    if (bench::Finished(caught_up)) {
      bench::Fail("catching up", absl::InternalError(caught_up.reason()));
    }
    catch_up.push_back(absl::ToDoubleSeconds(absl::Now() - killed));
    detection.push_back(absl::ToDoubleSeconds(detected));
    recovery.push_back(absl::ToDoubleSeconds(recovered));
    lost.push_back(static_cast<double>(done_at_kill - restored));
    std::printf(
        "round %d: killed at %ld steps; detected after %.2f s; next step after %.2f s; "
        "restarted from step %ld (%ld steps lost)\n",
        round, static_cast<long>(done_at_kill), absl::ToDoubleSeconds(detected),
        absl::ToDoubleSeconds(recovered), static_cast<long>(restored),
        static_cast<long>(done_at_kill - restored));
    bench::Check("cancel", c.Cancel(id));
  }
  std::printf(
      "full restart from a disk checkpoint (lease %s, checkpoint every %d steps), "
      "medians of %d rounds: detection %.2f s, SIGKILL to the new attempt's first step "
      "%.2f s, SIGKILL to the step after the kill's %.2f s, steps lost %.0f\n",
      lease.c_str(), every, rounds, bench::Median(detection), bench::Median(recovery),
      bench::Median(catch_up), bench::Median(lost));
  return 0;
}
