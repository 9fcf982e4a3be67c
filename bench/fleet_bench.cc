// Fleet scale (issue 43): the real coordinator daemon against --workers simulated workers
// (bench/fleet/fake_fleet.h: fakes in this process that register, heartbeat at the coordinator's
// interval and answer task calls without computing). It measures
//   - registration of all of them (total, and each RegisterWorker's p50/p99),
//   - the coordinator's CPU seconds per second of wall time under steady heartbeats, idle and
//     with the jobs placed, and each heartbeat's round trip,
//   - placement of --jobs jobs of --ranks workers (--pipeline ranks x replicas, a small MLP):
//     SubmitJob to RUNNING (all StartTask calls answered) per job and in all. When the jobs do
//     not all fit at once, the oldest RUNNING job is ended (its fakes report success) to make
//     room before the next is submitted, so each job's time is its placement, never a queue,
//   - GetJob ("status"), ListJobs ("list", first page) and ListWorkers latency p50/p99 with the
//     jobs placed,
//   - the coordinator's resident memory after registration and after placement.
// The coordinator's log is --log (default: a temporary file, printed on failure).
//
//   build/bench/fleet_bench [--workers N] [--jobs 100] [--ranks 32] [--pipeline 4]
//                           [--heartbeat-interval 1s] [--lease 10s] [--window 10s]
//                           [--calls 300] [--coordinator PATH] [--log FILE]
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "bench/bench_support.h"
#include "bench/fleet/fake_fleet.h"
#include "bench/fleet/latencies.h"
#include "tests/support/process.h"
#include "tests/support/temp_dir.h"

namespace sc = stagecoach;
namespace bench = stagecoach::bench;
using bench::Latencies;

namespace {

struct Flags {
  int workers = 1000;
  int jobs = 100;
  int ranks = 32;
  int pipeline = 4;
  std::string heartbeat_interval = "1s";
  std::string lease = "10s";
  double window_s = 10;
  int calls = 300;
  int channels = 4;
  int register_threads = 8;
  int heartbeat_threads = 2;
  bool no_progress = false;
  std::string coordinator =
      std::string(STAGECOACH_BINARY_DIR) + "/coordinator/stagecoach-coordinator";
  std::string log;
};

// A coordinator daemon started for the bench, and a stub to it.
struct Coordinator {
  std::unique_ptr<sc::testing::ChildProcess> process;
  std::string address;
  std::vector<std::string> flags;  // those passed besides --listen
};

Coordinator StartCoordinator(const Flags& f) {
  Coordinator c;
  c.flags = {
      "--heartbeat-interval", f.heartbeat_interval, "--lease", f.lease, "--log-level", "info"};
  std::vector<std::string> argv = {f.coordinator, "--listen", "127.0.0.1:0"};
  argv.insert(argv.end(), c.flags.begin(), c.flags.end());
  c.process =
      bench::Value("starting " + f.coordinator, sc::testing::ChildProcess::Start(argv, f.log));
  const std::string line =
      bench::Value("the coordinator's first line", c.process->ReadLine(absl::Seconds(30)));
  absl::string_view rest = line;
  if (!absl::ConsumePrefix(&rest, "listening on ")) {
    bench::Fail("the coordinator's first line",
                absl::InternalError(absl::StrCat("'", line, "'\n", c.process->StderrTail())));
  }
  c.address = std::string(rest);
  return c;
}

// A small MLP in --pipeline stages, --ranks / --pipeline data-parallel replicas.
std::string JobSpec(const Flags& f) {
  const int replicas = f.ranks / f.pipeline;
  std::vector<int> sizes(2 * f.pipeline + 1, 8);
  return absl::StrCat("name: fleet\nmodel: {builtin: {family: mlp, sizes: [",
                      absl::StrJoin(sizes, ", "), "]}}\nsplit: {stages: ", f.pipeline,
                      ", policy: equal-params}\nplacement: {workers: ", f.pipeline,
                      ", replicas: ", replicas,
                      "}\nschedule: {kind: 1F1B, microbatches: ", f.pipeline,
                      "}\ntraining: {batch_size: ", f.pipeline * replicas, ", steps: 5}\n");
}

// CPU seconds the coordinator (and this bench) used per second of wall time over `window`.
struct CpuShare {
  double coordinator = 0;
  double bench = 0;
  Latencies heartbeats;
};

CpuShare MeasureCpu(const Coordinator& c, bench::FakeFleet& fleet, absl::Duration window) {
  fleet.RecordHeartbeats(true);
  const double c0 = bench::ProcessCpuSeconds(c.process->pid());
  const double b0 = bench::ProcessCpuSeconds(getpid());
  const absl::Time t0 = absl::Now();
  absl::SleepFor(window);
  const double wall = absl::ToDoubleSeconds(absl::Now() - t0);
  CpuShare out;
  out.coordinator = (bench::ProcessCpuSeconds(c.process->pid()) - c0) / wall;
  out.bench = (bench::ProcessCpuSeconds(getpid()) - b0) / wall;
  fleet.RecordHeartbeats(false);
  out.heartbeats = fleet.TakeHeartbeatLatencies();
  return out;
}

sc::v1::JobState JobState(sc::v1::CoordinatorService::Stub* stub, const std::string& id,
                          std::string* reason = nullptr) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  sc::v1::GetJobRequest req;
  req.set_job_id(id);
  sc::v1::GetJobResponse resp;
  const grpc::Status s = stub->GetJob(&ctx, req, &resp);
  if (!s.ok()) bench::Fail("GetJob " + id, absl::UnavailableError(s.error_message()));
  if (reason != nullptr) *reason = resp.job().reason();
  return resp.job().state();
}

std::string Submit(sc::v1::CoordinatorService::Stub* stub, const std::string& spec) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  sc::v1::SubmitJobRequest req;
  req.set_spec_yaml(spec);
  sc::v1::SubmitJobResponse resp;
  const grpc::Status s = stub->SubmitJob(&ctx, req, &resp);
  if (!s.ok()) bench::Fail("SubmitJob", absl::InvalidArgumentError(s.error_message()));
  return resp.job_id();
}

struct Placed {
  Latencies submit;                  // the SubmitJob call itself
  Latencies to_running;              // SubmitJob called -> RUNNING seen
  absl::Duration total;              // first submit -> last RUNNING
  std::vector<std::string> running;  // RUNNING at the end
  int ended = 0;                     // jobs ended to make room
};

// Ends the oldest running job (its fakes report success) and waits until it is SUCCEEDED.
void EndOldest(bench::FakeFleet& fleet, std::deque<std::string>& running, absl::Time deadline) {
  const std::string id = running.front();
  running.pop_front();
  bench::Check("ending " + id, fleet.EndTasks(id));
  std::string reason;
  while (JobState(fleet.client(), id, &reason) != sc::v1::JOB_STATE_SUCCEEDED) {
    if (absl::Now() > deadline) {
      bench::Fail("ending " + id, absl::DeadlineExceededError(reason));
    }
    absl::SleepFor(absl::Milliseconds(2));
  }
}

Placed PlaceJobs(const Flags& f, bench::FakeFleet& fleet, absl::Duration timeout) {
  const std::string spec = JobSpec(f);
  const int capacity = f.workers / f.ranks;
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + timeout;
  std::vector<std::pair<std::string, absl::Time>> in_flight;  // submitted, not yet RUNNING
  std::deque<std::string> running;
  Placed out;
  for (int next = 0, done = 0; done < f.jobs;) {
    // One submission per pass, so that each job's RUNNING is seen as it happens rather than
    // after every submission (a job's time would include the later ones' SubmitJob calls).
    if (next < f.jobs && static_cast<int>(in_flight.size() + running.size()) < capacity) {
      const absl::Time submitted = absl::Now();
      in_flight.emplace_back(Submit(fleet.client(), spec), submitted);
      out.submit.Add(absl::Now() - submitted);
      ++next;
    }
    for (auto it = in_flight.begin(); it != in_flight.end();) {
      std::string reason;
      const sc::v1::JobState state = JobState(fleet.client(), it->first, &reason);
      if (state == sc::v1::JOB_STATE_RUNNING) {
        out.to_running.Add(absl::Now() - it->second);
        running.push_back(it->first);
        it = in_flight.erase(it);
        ++done;
      } else if (state != sc::v1::JOB_STATE_PENDING && state != sc::v1::JOB_STATE_STARTING) {
        bench::Fail(it->first,
                    absl::InternalError(absl::StrCat(sc::v1::JobState_Name(state), ": ", reason)));
      } else if (absl::Now() > deadline) {
        bench::Fail(it->first, absl::DeadlineExceededError("not RUNNING in time: " + reason));
      } else {
        ++it;
      }
    }
    if (next < f.jobs && in_flight.empty() && static_cast<int>(running.size()) == capacity) {
      EndOldest(fleet, running, deadline);
      ++out.ended;
    }
    absl::SleepFor(absl::Milliseconds(2));
  }
  out.total = absl::Now() - start;
  out.running.assign(running.begin(), running.end());
  return out;
}

// Latency of `calls` calls of one kind.
template <typename Call>
Latencies Time(int calls, Call call) {
  Latencies out;
  for (int i = 0; i < calls; ++i) {
    const absl::Time start = absl::Now();
    call(i);
    out.Add(absl::Now() - start);
  }
  return out;
}

struct ReadLatencies {
  Latencies get_job, list_jobs, list_workers;
};

ReadLatencies MeasureReads(const Flags& f, bench::FakeFleet& fleet,
                           const std::vector<std::string>& jobs) {
  auto check = [](const char* what, const grpc::Status& s) {
    if (!s.ok()) bench::Fail(what, absl::UnavailableError(s.error_message()));
  };
  auto context = [](grpc::ClientContext& ctx) {
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  };
  ReadLatencies out;
  out.get_job = Time(f.calls, [&](int i) {
    grpc::ClientContext ctx;
    context(ctx);
    sc::v1::GetJobRequest req;
    req.set_job_id(jobs[i % jobs.size()]);
    sc::v1::GetJobResponse resp;
    check("GetJob", fleet.client()->GetJob(&ctx, req, &resp));
  });
  out.list_jobs = Time(f.calls, [&](int i) {
    grpc::ClientContext ctx;
    context(ctx);
    sc::v1::ListJobsResponse resp;
    check("ListJobs", fleet.client()->ListJobs(&ctx, {}, &resp));
  });
  out.list_workers = Time(std::max(1, f.calls / 10), [&](int i) {
    grpc::ClientContext ctx;
    context(ctx);
    sc::v1::ListWorkersResponse resp;
    check("ListWorkers", fleet.client()->ListWorkers(&ctx, {}, &resp));
    if (resp.workers_size() != f.workers) {
      bench::Fail("ListWorkers",
                  absl::InternalError(absl::StrCat(resp.workers_size(), " workers")));
    }
  });
  return out;
}

void Row(const std::string& what, const std::string& value) {
  std::printf("  %-46s %s\n", what.c_str(), value.c_str());
}

std::string Spread(const Latencies& l) {
  return absl::StrFormat("p50 %8.2f ms  p99 %8.2f ms  (%zu)", l.Percentile(50), l.Percentile(99),
                         l.size());
}

std::string Cpu(const CpuShare& c) {
  return absl::StrFormat("%.3f CPU-s/s  (bench itself %.2f)", c.coordinator, c.bench);
}

void PrintResults(const Flags& f, const Latencies& registration, absl::Duration registered_in,
                  double rss_registered, const CpuShare& idle, const Placed& placed,
                  const CpuShare& busy, const ReadLatencies& reads, double rss_placed) {
  std::printf("\n%d simulated workers; jobs of %d workers (%d ranks x %d replicas)\n", f.workers,
              f.ranks, f.pipeline, f.ranks / f.pipeline);
  Row("registration of all",
      absl::StrFormat("%.2f s  (%.0f /s)", absl::ToDoubleSeconds(registered_in),
                      f.workers / absl::ToDoubleSeconds(registered_in)));
  Row("  RegisterWorker", Spread(registration));
  Row("coordinator RSS after registration", absl::StrFormat("%.1f MiB", rss_registered));
  Row("coordinator CPU, heartbeats only", Cpu(idle));
  Row("  heartbeat round trip", Spread(idle.heartbeats));
  Row(absl::StrCat("placement of ", f.jobs, " jobs (all)"),
      absl::StrFormat("%.2f s  (%d ended to make room)", absl::ToDoubleSeconds(placed.total),
                      placed.ended));
  Row("  SubmitJob call", Spread(placed.submit));
  Row("  SubmitJob -> RUNNING, per job", Spread(placed.to_running));
  Row(absl::StrCat("coordinator CPU, ", placed.running.size(), " jobs running"), Cpu(busy));
  Row("  heartbeat round trip", Spread(busy.heartbeats));
  Row("GetJob (status)", Spread(reads.get_job));
  Row("ListJobs (list, first page)", Spread(reads.list_jobs));
  Row("ListWorkers", Spread(reads.list_workers));
  Row("coordinator RSS after placement", absl::StrFormat("%.1f MiB", rss_placed));
}

int RunBench(const Flags& f) {
  Coordinator c = StartCoordinator(f);
  std::printf("fleet_bench: coordinator %s (pid %d) at %s\n", f.coordinator.c_str(),
              c.process->pid(), c.address.c_str());
  std::printf("  coordinator flags: %s\n  machine: %ld CPUs online; log: %s\n",
              absl::StrJoin(c.flags, " ").c_str(), sysconf(_SC_NPROCESSORS_ONLN), f.log.c_str());
  bench::FakeFleetOptions options;
  options.workers = f.workers;
  options.coordinator = c.address;
  options.channels = f.channels;
  options.register_threads = f.register_threads;
  options.heartbeat_threads = f.heartbeat_threads;
  options.send_progress = !f.no_progress;
  auto fleet = bench::Value("fakes", bench::FakeFleet::Start(options));
  const absl::Time start = absl::Now();
  const Latencies registration = bench::Value("registration", fleet->RegisterAll());
  const absl::Duration registered_in = absl::Now() - start;
  const double rss_registered = bench::ResidentMiB(c.process->pid());
  std::printf("  registered %d fakes in %.2f s; measuring...\n", f.workers,
              absl::ToDoubleSeconds(registered_in));
  std::fflush(stdout);
  const absl::Duration settle = absl::Seconds(2);
  const absl::Duration window = absl::Seconds(f.window_s);
  absl::SleepFor(settle);
  const CpuShare idle = MeasureCpu(c, *fleet, window);
  const Placed placed = PlaceJobs(f, *fleet, absl::Minutes(5));
  absl::SleepFor(settle);
  const CpuShare busy = MeasureCpu(c, *fleet, window);
  const ReadLatencies reads = MeasureReads(f, *fleet, placed.running);
  const double rss_placed = bench::ResidentMiB(c.process->pid());
  const bench::FleetCounters counters = fleet->Counters();
  PrintResults(f, registration, registered_in, rss_registered, idle, placed, busy, reads,
               rss_placed);
  std::printf(
      "  checks: %d fakes busy (want %zu); heartbeats %lld ok, %lld failed; %lld "
      "StartTask, %lld StopTask, %lld calls refused\n",
      counters.busy, placed.running.size() * f.ranks,
      static_cast<long long>(counters.heartbeats_ok),
      static_cast<long long>(counters.heartbeats_failed),
      static_cast<long long>(counters.start_tasks), static_cast<long long>(counters.stop_tasks),
      static_cast<long long>(counters.refused_calls));
  const bool ok = counters.busy == static_cast<int>(placed.running.size()) * f.ranks &&
                  counters.heartbeats_failed == 0 && counters.refused_calls == 0 &&
                  c.process->running();
  fleet.reset();
  c.process->Stop();
  if (!ok) std::fprintf(stderr, "fleet_bench: a check failed; see %s\n", f.log.c_str());
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  // The fakes stand for workers, which run without Abseil's lock-order checks (the daemons'
  // --debug-lock-order): they take the two cores from the coordinator as little as they can.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  Flags f;
  CLI::App app("fleet_bench: the coordinator against thousands of simulated workers");
  app.add_option("--workers", f.workers, "simulated workers")->check(CLI::Range(1, 51200));
  app.add_option("--jobs", f.jobs, "jobs to place")->check(CLI::Range(1, 100000));
  app.add_option("--ranks", f.ranks, "workers per job")->check(CLI::Range(1, 4096));
  app.add_option("--pipeline", f.pipeline, "pipeline ranks of a job (the rest are replicas)")
      ->check(CLI::Range(1, 64));
  app.add_option("--heartbeat-interval", f.heartbeat_interval, "the coordinator's flag");
  app.add_option("--lease", f.lease, "the coordinator's flag");
  app.add_option("--window", f.window_s, "seconds of each CPU measurement")
      ->check(CLI::Range(1.0, 600.0));
  app.add_option("--calls", f.calls, "GetJob and ListJobs calls timed (ListWorkers: a tenth)")
      ->check(CLI::Range(1, 100000));
  app.add_option("--channels", f.channels, "channels to the coordinator")->check(CLI::Range(1, 64));
  app.add_option("--heartbeat-threads", f.heartbeat_threads)->check(CLI::Range(1, 64));
  app.add_option("--register-threads", f.register_threads)->check(CLI::Range(1, 256));
  app.add_option("--coordinator", f.coordinator, "stagecoach-coordinator binary");
  app.add_flag("--no-progress", f.no_progress,
               "busy fakes send no progress beacon (what the beacons cost the coordinator)");
  app.add_option("--log", f.log, "the coordinator's log (stderr)");
  CLI11_PARSE(app, argc, argv);
  if (f.ranks % f.pipeline != 0) {
    bench::Fail("--ranks", absl::InvalidArgumentError("must be a multiple of --pipeline"));
  }
  if (f.workers < f.ranks) {
    bench::Fail("--workers", absl::InvalidArgumentError("fewer than --ranks: no job fits"));
  }
  sc::testing::TempDir dir("fleet-bench");
  if (f.log.empty()) f.log = dir.path() + "/coordinator.log";
  return RunBench(f);
}
