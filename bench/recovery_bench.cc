// What a lost worker costs (issue 39; docs/recovery.md), on real daemons
// (tests/support/local_cluster.h): a coordinator and workers on loopback running a 2-stage
// 1F1B MLP job with AdamW and a checkpoint every --every steps. Each round SIGKILLs a worker of
// rank 1 once the job has done --kill-at steps and measures, from the kill:
//   - detection: until the coordinator has decided (the job left RUNNING or started its next
//     attempt; with replicas that carry on, the replica left the job);
//   - next step: until the first step after the decision completes (a restart: placement on
//     the spare, rendezvous, restore from the latest complete checkpoint, one step; carrying
//     on: the abandoned step run again on the healthy replica with both replicas' slices);
//   - catch-up: until the job is one step past where the kill found it;
//   - steps lost: steps done at the kill that had to run again (a restart continues from the
//     latest checkpoint complete at the kill: an asynchronous write still in flight then does
//     not count, so a kill soon after a checkpoint step may lose more than --kill-at minus the
//     checkpoint's step).
// Cases (--case): `restart` (1 replica, restart.max_restarts, a spare worker: 3 workers);
// `snapshot` (the same with in-memory snapshots every --snapshot-every steps and the spare held
// by placement.spares: the restart continues from the latest snapshot); `carry_on` (2 replicas
// carrying on, no spare: 4 workers); `heal` (2 replicas and a spare: 5 workers; also measured:
// until the lost replica has rejoined from a live one); `elastic` (1 replica on 2 workers, no
// spare, restart.elastic with restart.wait --elastic-wait: the job is planned again on the one
// worker left and continues from the latest checkpoint by parameter name; `elastic_snapshot`, the
// same with snapshots every --snapshot-every steps: it continues from the latest snapshot, its
// files restored by name on the worker left). Then the price of
// carrying on when nothing fails (`settle`): the same 2-replica job's step time with its steps
// settled (carry_on: true) and without (carry_on: false); and the price of snapshots
// (`snapshot_cost`): the 1-replica job's step time with snapshots every --snapshot-every steps
// and without; rounds alternating, medians side by side.
// The cluster's lease is --lease (the coordinator's --lease; the default deployment's is 10 s).
//
//   build/bench/recovery_bench [--case all|restart|snapshot|carry_on|heal|elastic|
//                                      elastic_snapshot|settle|
//                                      snapshot_cost]
//                              [--rounds 3] [--every 10] [--snapshot-every 5] [--kill-at 17]
//                              [--lease 3s] [--elastic-wait 1s] [--settle-steps 60]
#include <signal.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "bench/bench_support.h"
#include "bench/cluster_runs.h"
#include "tests/support/local_cluster.h"

namespace bench = stagecoach::bench;
namespace v1 = stagecoach::v1;
using stagecoach::testing::ClusterOptions;
using stagecoach::testing::LocalCluster;

namespace {

struct Settings {
  int rounds = 3;
  int every = 10;
  int kill_at = 17;
  int snapshot_every = 5;
  int settle_steps = 60;
  std::string lease = "3s";
  std::string elastic_wait = "1s";
};

// `snapshot_every` > 0 adds in-memory snapshots; `spares` is placement.spares.
std::string Spec(int every, int replicas, const std::string& restart, int snapshot_every = 0,
                 int spares = 0) {
  return absl::StrCat(
      "name: recovery\n",
      "model:\n  builtin: {family: mlp, sizes: [256, 512, 512, 512, 512, 16], seed: 1}\n",
      "split: {stages: 2}\nschedule: {kind: 1F1B, microbatches: 4}\n",
      "placement: {workers: 2, replicas: ", replicas,
      spares > 0 ? absl::StrCat(", spares: ", spares) : "", "}\n",
      "training:\n  batch_size: 32\n  steps: 100000\n  loss: mse\n",
      "  optimizer: {kind: adamw, lr: 1.0e-3}\n", "  checkpoint: {dir: CKPT, every_steps: ", every,
      "}\n",
      snapshot_every > 0 ? absl::StrCat("  snapshot: {every_steps: ", snapshot_every, "}\n") : "",
      "data: {kind: synthetic, seed: 4}\n", "restart: ", restart, "\n");
}

// The step an attempt started from, from its STARTING transition ("... after step N"); -1 when
// the job has none since `attempt`.
int64_t StartedFrom(const v1::Job& job, int attempt) {
  for (int i = job.history_size() - 1; i >= 0; --i) {
    const v1::JobTransition& t = job.history(i);
    if (t.state() != v1::JOB_STATE_STARTING) continue;
    const std::string marker = absl::StrCat("starting attempt ", attempt, " ");
    if (t.reason().find(marker) == std::string::npos) continue;
    const size_t at = t.reason().find("after step ");
    return at == std::string::npos ? 0 : std::atoll(t.reason().c_str() + at + 11);
  }
  return -1;
}

std::unique_ptr<LocalCluster> Cluster(int workers, const std::string& lease) {
  ClusterOptions options;
  options.check_lock_order = false;
  options.workers = workers;
  options.lease = lease;
  options.log_level = "info";
  return bench::Value("starting the cluster", LocalCluster::Start(options));
}

std::string Submit(LocalCluster& c, std::string spec) {
  spec.replace(spec.find("CKPT"), 4, c.dir() + "/ckpt");
  return bench::Value("submitting", c.Submit(spec));
}

v1::Job WaitFor(LocalCluster& c, const std::string& id, const std::string& what,
                const std::function<bool(const v1::Job&)>& done, absl::Duration timeout) {
  const v1::Job job = bench::Value(
      what, c.WaitForJob(
                id, [&](const v1::Job& j) { return bench::Finished(j) || done(j); }, timeout));
  if (bench::Finished(job)) {
    bench::Fail(what, absl::InternalError(absl::StrCat(job.reason(), "\n", c.Logs())));
  }
  return job;
}

struct Round {
  double detection = 0, next_step = 0, catch_up = 0, lost = 0, healed = 0;
};

enum class Mode { kRestart, kSnapshot, kCarryOn, kHeal, kElastic, kElasticSnapshot };

const char* ModeName(Mode mode) {
  switch (mode) {
    case Mode::kRestart:
      return "restart";
    case Mode::kSnapshot:
      return "snapshot";
    case Mode::kCarryOn:
      return "carry_on";
    case Mode::kHeal:
      return "heal";
    case Mode::kElastic:
      return "elastic";
    case Mode::kElasticSnapshot:
      return "elastic_snapshot";
  }
  return "";
}

struct Medians {
  std::vector<double> detection, next_step, catch_up, lost, healed;
  void Add(const Round& r) {
    healed.push_back(r.healed);
    detection.push_back(r.detection);
    next_step.push_back(r.next_step);
    catch_up.push_back(r.catch_up);
    lost.push_back(r.lost);
  }
};

// One round of `mode`: a restart (1 replica and a spare; from a snapshot with kSnapshot), or 2
// replicas carrying on (and with kHeal a spare that heals the lost one), or with kElastic a
// restart on the one worker left (from the latest snapshot with kElasticSnapshot).
Round KillRound(const Settings& s, Mode mode, int round) {
  const bool carry_on = mode == Mode::kCarryOn || mode == Mode::kHeal;
  const bool elastic = mode == Mode::kElastic || mode == Mode::kElasticSnapshot;
  const bool snapshots = mode == Mode::kSnapshot || mode == Mode::kElasticSnapshot;
  auto cluster = Cluster(mode == Mode::kHeal ? 5 : (carry_on ? 4 : (elastic ? 2 : 3)), s.lease);
  LocalCluster& c = *cluster;
  const std::string restart =
      carry_on  ? "{max_restarts: 3, carry_on: true}"
      : elastic ? absl::StrCat("{max_restarts: 3, elastic: true, wait: ", s.elastic_wait, "}")
                : "{max_restarts: 3}";
  const std::string id =
      Submit(c, Spec(s.every, carry_on ? 2 : 1, restart, snapshots ? s.snapshot_every : 0,
                     mode == Mode::kSnapshot ? 1 : 0));
  const v1::Job running = WaitFor(
      c, id, "running",
      [&](const v1::Job& j) {
        return j.state() == v1::JOB_STATE_RUNNING && j.global_steps_done() >= s.kill_at;
      },
      absl::Seconds(120));
  // Rank 1 of the last replica.
  const v1::RankStatus& victim = running.ranks(running.ranks_size() - 1);
  const int index = c.WorkerIndex(victim.worker_id());
  if (index < 0) {
    bench::Fail("finding the victim",
                absl::NotFoundError(victim.worker_id() + " is not a worker process"));
  }
  std::fprintf(stderr, "round %d: killing worker %d (%s, rank %d of replica %d)\n", round, index,
               victim.worker_id().c_str(), victim.rank(), victim.replica());
  const absl::Time killed = absl::Now();
  c.worker(index).Signal(SIGKILL);
  // A restart can be over between two polls: the attempt number says it happened.
  const v1::Job decided = WaitFor(
      c, id, "detection",
      [](const v1::Job& j) {
        return j.state() != v1::JOB_STATE_RUNNING || j.attempt() >= 2 || j.lost_replicas_size() > 0;
      },
      absl::Seconds(60));
  Round out;
  out.detection = absl::ToDoubleSeconds(absl::Now() - killed);
  const int64_t done_at_kill = std::max(running.global_steps_done(), decided.global_steps_done());
  int64_t resumed_from = done_at_kill;
  WaitFor(
      c, id, "the next step",
      [&](const v1::Job& j) {
        if (carry_on) return j.global_steps_done() > decided.global_steps_done();
        if (j.attempt() < 2 || j.state() != v1::JOB_STATE_RUNNING) return false;
        const int64_t from = StartedFrom(j, 2);
        if (from < 0) return false;
        resumed_from = from;
        return j.global_steps_done() > from;
      },
      absl::Seconds(300));
  out.next_step = absl::ToDoubleSeconds(absl::Now() - killed);
  if (!carry_on) {
    // Where the new attempt started from, as its history says.
    const v1::Job restarted = bench::Value("the job", c.GetJob(id));
    for (const v1::JobTransition& t : restarted.history()) {
      if (t.state() == v1::JOB_STATE_STARTING &&
          t.reason().find("attempt 2 ") != std::string::npos) {
        std::fprintf(stderr, "round %d: %s\n", round, t.reason().c_str());
      }
    }
  }
  const v1::Job caught_up = WaitFor(
      c, id, "catching up", [&](const v1::Job& j) { return j.global_steps_done() > done_at_kill; },
      absl::Seconds(300));
  out.catch_up = absl::ToDoubleSeconds(absl::Now() - killed);
  if (carry_on && (caught_up.restarts() != 0 || caught_up.healthy_replicas() != 1)) {
    bench::Fail("carrying on", absl::InternalError(absl::StrCat(
                                   "restarts ", caught_up.restarts(), ", healthy replicas ",
                                   caught_up.healthy_replicas(), "\n", c.Logs())));
  }
  out.lost = static_cast<double>(done_at_kill - resumed_from);
  if (mode == Mode::kHeal) {
    WaitFor(
        c, id, "healing",
        [&](const v1::Job& j) { return j.lost_replicas_size() == 0 && j.healthy_replicas() == 2; },
        absl::Seconds(300));
    out.healed = absl::ToDoubleSeconds(absl::Now() - killed);
  }
  std::printf(
      "%s round %d: killed at %ld steps; decided after %.2f s; next step after %.2f s; past the "
      "kill's step after %.2f s; %.0f steps lost%s\n",
      ModeName(mode), round, static_cast<long>(done_at_kill), out.detection, out.next_step,
      out.catch_up, out.lost,
      mode == Mode::kHeal ? absl::StrFormat("; whole again after %.2f s", out.healed).c_str()
                          : "");
  bench::Check("cancel", c.Cancel(id));
  return out;
}

// Seconds per step between global steps 10 and 10 + steps of `spec` on `workers` workers.
double StepSeconds(const Settings& s, int workers, const std::string& spec) {
  auto cluster = Cluster(workers, s.lease);
  LocalCluster& c = *cluster;
  const std::string id = Submit(c, spec);
  WaitFor(
      c, id, "warming up", [](const v1::Job& j) { return j.global_steps_done() >= 10; },
      absl::Seconds(120));
  const absl::Time start = absl::Now();
  const v1::Job at = WaitFor(
      c, id, "timing",
      [&](const v1::Job& j) { return j.global_steps_done() >= 10 + s.settle_steps; },
      absl::Seconds(300));
  const double seconds =
      absl::ToDoubleSeconds(absl::Now() - start) / static_cast<double>(at.global_steps_done() - 10);
  bench::Check("cancel", c.Cancel(id));
  return seconds;
}

void PrintKills(const char* name, const Settings& s, const Medians& m) {
  std::printf(
      "%s (lease %s, checkpoint every %d steps), medians of %d rounds: decided %.2f s, SIGKILL "
      "to the next completed step %.2f s, to the step after the kill's %.2f s, steps lost %.0f",
      name, s.lease.c_str(), s.every, s.rounds, bench::Median(m.detection),
      bench::Median(m.next_step), bench::Median(m.catch_up), bench::Median(m.lost));
  if (bench::Median(m.healed) > 0) std::printf(", whole again %.2f s", bench::Median(m.healed));
  std::printf("\n");
}

// Alternating rounds of two specs' step times; prints both medians and their ratio.
void CompareStepTimes(const Settings& s, const char* what, int workers, const std::string& plain,
                      const std::string& with, const char* with_name) {
  std::vector<double> a, b;
  for (int round = 0; round < s.rounds; ++round) {
    a.push_back(StepSeconds(s, workers, plain));
    b.push_back(StepSeconds(s, workers, with));
    std::printf("%s round %d: %.2f ms a step without, %.2f ms %s\n", what, round, a.back() * 1e3,
                b.back() * 1e3, with_name);
  }
  std::printf("%s, medians of %d rounds of %d steps: %.2f ms a step without, %.2f ms %s (x%.3f)\n",
              what, s.rounds, s.settle_steps, bench::Median(a) * 1e3, bench::Median(b) * 1e3,
              with_name, bench::Median(b) / bench::Median(a));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"the cost of a lost worker: full restart against replicas carrying on"};
  Settings s;
  std::string which = "all";
  app.add_option("--case", which)
      ->check(CLI::IsMember({"all", "restart", "snapshot", "carry_on", "heal", "elastic",
                             "elastic_snapshot", "settle", "snapshot_cost"}));
  app.add_option("--elastic-wait", s.elastic_wait, "restart.wait of the elastic case");
  app.add_option("--snapshot-every", s.snapshot_every, "training.snapshot.every_steps");
  app.add_option("--rounds", s.rounds);
  app.add_option("--every", s.every, "training.checkpoint.every_steps");
  app.add_option("--kill-at", s.kill_at, "steps done when rank 1's worker is killed");
  app.add_option("--lease", s.lease);
  app.add_option("--settle-steps", s.settle_steps, "steps timed for the settling's price");
  CLI11_PARSE(app, argc, argv);

  for (const Mode mode : {Mode::kRestart, Mode::kSnapshot, Mode::kCarryOn, Mode::kHeal,
                          Mode::kElastic, Mode::kElasticSnapshot}) {
    if (which != "all" && which != ModeName(mode)) continue;
    Medians m;
    for (int round = 0; round < s.rounds; ++round) m.Add(KillRound(s, mode, round));
    const std::string snapshot_name = absl::StrCat(
        "restart from an in-memory snapshot (every ", s.snapshot_every, " steps; 1 replica, a spare)");
    const char* names[] = {"full restart from a disk checkpoint (1 replica, a spare)",
                           snapshot_name.c_str(),
                           "replicas carrying on (2 replicas)",
                           "replicas carrying on, healed by a spare (2 replicas)",
                           "elastic shrink onto the worker left (1 replica, no spare)",
                           "elastic shrink onto the worker left from the latest snapshot"};
    PrintKills(names[static_cast<int>(mode)], s, m);
  }
  if (which == "all" || which == "settle") {
    CompareStepTimes(s, "2 replicas x 2 stages, settling", 4,
                     Spec(100000, 2, "{carry_on: false}"), Spec(100000, 2, "{carry_on: true}"),
                     "with every step settled");
  }
  if (which == "all" || which == "snapshot_cost") {
    CompareStepTimes(s, "1 replica x 2 stages, snapshots", 3, Spec(100000, 1, "{max_restarts: 1}"),
                     Spec(100000, 1, "{max_restarts: 1}", s.snapshot_every, /*spares=*/1),
                     absl::StrCat("with a snapshot every ", s.snapshot_every, " steps").c_str());
  }
  return 0;
}
