// stagecoach-coordinator: the control plane. See DESIGN.md "Command-line contract"; the shared
// flags, serving and shutdown are common/daemon/daemon.h's.
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/daemon/daemon.h"
#include "common/process/machine_memory.h"
#include "common/process/malloc_tuning.h"
#include "common/rpc/authorized_service.h"
#include "common/util/byte_size.h"
#include "common/util/logging.h"
#include "common/util/work_queue.h"
#include "coordinator/generation/generation.h"
#include "coordinator/job_manager.h"
#include "coordinator/metrics/coordinator_metrics.h"
#include "coordinator/service/artifact_store.h"
#include "coordinator/service/coordinator_auth.h"
#include "coordinator/service/coordinator_service.h"
#include "coordinator/service/generation_service.h"
#include "coordinator/workers/grpc_worker_client.h"
#include "coordinator/workers/kv_store.h"

namespace {

namespace sc = stagecoach;
using sc::coordinator::ArtifactStore;
using sc::coordinator::CoordinatorCallCheck;
using sc::coordinator::CoordinatorServiceImpl;
using sc::coordinator::GrpcWorkerClient;
using sc::coordinator::JobManager;
using sc::coordinator::KvStore;

// Threads that call workers and write the job table for the job manager.
constexpr int kExecutorThreads = 8;

sc::daemon::DaemonInfo CoordinatorInfo() {
  sc::daemon::DaemonInfo info;
  info.name = "coordinator";
  info.description =
      "Stagecoach coordinator: plans pipeline jobs and steers the workers that run them";
  info.default_listen = "0.0.0.0:7070";
  info.listen_help = "gRPC address HOST:PORT (port 0 picks a free port)";
  info.tls_cert_help =
      "PEM certificate: serve TLS with it, and present it as client certificate to workers";
  info.tls_ca_help =
      "PEM CA that signs the peers' certificates: verifies the workers (and, with "
      "--tls-require-client-cert, the clients of this coordinator)";
  info.tls_server_name_help =
      "name every worker's certificate must carry (default: the host of its address)";
  info.tls_require_client_cert_help =
      "mutual TLS: refuse clients (stagectl, workers) without a certificate signed by --tls-ca";
  return info;
}

// The coordinator's own flags, with their destinations' defaults.
struct Config {
  sc::coordinator::JobManagerOptions jobs;
  sc::coordinator::ArtifactStoreOptions artifacts;
  std::string data_dir;
  sc::coordinator::CoordinatorAuth auth;
  // --plan-message-latency and --plan-link-bandwidth (DefaultCostAssumptions' figures).
  absl::Duration message_latency = absl::Microseconds(100);
  absl::Duration message_cpu = absl::Microseconds(500);
  std::string link_bandwidth = "2GB";
  // --max-plan-memory as given ("" : a quarter of the machine's memory).
  std::string max_plan_memory;
  // --stall-after as given ("": 5x the median step, at least 30 s).
  std::string stall_after;
};

void DeclareFlags(sc::daemon::FlagSet& flags, Config* c) {
  flags.AddDuration("lease", &c->jobs.lease,
                    "declare a worker lost after this long without a heartbeat");
  flags.AddDuration("heartbeat-interval", &c->jobs.heartbeat_interval,
                    "how often workers heartbeat");
  flags.AddDuration("comm-timeout", &c->jobs.comm_timeout,
                    "bound on every data-plane wait in a job's tasks");
  flags.AddDuration("hold-timeout", &c->jobs.hold_timeout,
                    "longest a PAUSED job's tasks hold before they give up and fail");
  flags.AddDuration("worker-rpc-timeout", &c->jobs.worker_rpc_timeout,
                    "bound on each call to a worker (start, stop and steer a task); a worker "
                    "that does not answer in time fails or restarts its job");
  flags.AddString(
      "data-dir", &c->data_dir,
      "directory for the coordinator's state: the job table in DIR/jobs (kept across restarts: "
      "running jobs continue from their latest checkpoint) and uploaded artifacts in "
      "DIR/artifacts (default: a private temporary directory for artifacts, removed at exit, "
      "and no job table)");
  flags.AddInt("max-upload-bytes", &c->artifacts.max_bytes, 1, "bytes",
               "largest artifact stagectl may upload, in bytes (default 1 GiB)");
  flags.AddInt("retain-finished-jobs", &c->jobs.retain_finished_jobs, 0, "jobs",
               "finished jobs (SUCCEEDED, FAILED, CANCELLED) kept in memory and in the job "
               "table: the most recently finished");
  flags.AddDuration("retain-finished-for", &c->jobs.retain_finished_for,
                    "forget a finished job (and its record on disk) this long after it ended");
  flags.AddString("max-plan-memory", &c->max_plan_memory,
                  "bound on the memory all live jobs' plans (their action lists) may hold, e.g. "
                  "4GiB: a job that would take them over it is refused (default: a quarter of "
                  "the machine's memory, or of the container's limit when lower)");
  flags.AddInt("max-job-events", &c->jobs.max_job_events, 1, "events",
               "events a job's log keeps for watchers; older ones are dropped");
  flags.AddDuration("plan-timeout", &c->jobs.plan_timeout,
                    "refuse a job whose planning (after the model's inspection) takes longer");
  flags.AddDuration("plan-message-latency", &c->message_latency,
                    "what the plan search (schedule.kind auto, stagectl plan) assumes a message "
                    "between two workers costs besides its bytes: posting it, the transport's "
                    "latency, waking the receiver (bench/plan_bench measures it)");
  flags.AddDuration("plan-message-cost", &c->message_cpu,
                    "what the plan search assumes each message to or from another worker takes "
                    "of a worker's own time, on both ends (bench/plan_bench measures the effect)");
  flags.AddString("plan-link-bandwidth", &c->link_bandwidth,
                  "bytes per second the plan search assumes of a link between two workers, "
                  "e.g. 2GB or 12.5GB (100 Gb/s)");
  for (const sc::spec::SpecLimitFlag& limit : sc::spec::SpecLimitFlags()) {
    flags.AddInt(limit.flag, &(c->jobs.limits.*limit.field), 1, limit.what,
                 absl::StrCat("admission limit: the most ", limit.what,
                              " a job spec may ask for (docs/spec.md, Limits)"));
  }
  flags.AddString("stall-after", &c->stall_after,
                  "a running job whose step has run this long is STALLED, and its ranks are "
                  "named with what they wait on (default: 5x the median step, at least 30s)");
  flags.AddDouble("straggler-threshold", &c->jobs.stragglers.threshold, 1.0,
                  "a rank whose compute is this many times its peers' (median over the "
                  "straggler window) is straggling");
  flags.AddInt("straggler-window", &c->jobs.stragglers.window, 1, "steps",
               "the fewest steps over which a rank's pace against its peers is taken (their "
               "median)");
  flags.AddDuration("straggler-min-window", &c->jobs.stragglers.min_window,
                    "the least time over which a rank's pace is taken: the steps completed in "
                    "it count too (CPU time-sharing slows a rank for stretches of many short "
                    "steps)");
  flags.AddTokenFile(
      "client-token-file", &c->auth.client_token,
      "require the token in this file as 'authorization: Bearer' on client RPCs (stagectl)");
  flags.AddTokenFile("worker-token-file", &c->auth.worker_token,
                     "require the token in this file as 'authorization: Bearer' on worker RPCs");
}

absl::Status Validate(Config* c) {
  if (c->jobs.heartbeat_interval * 2 > c->jobs.lease) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--heartbeat-interval (", absl::FormatDuration(c->jobs.heartbeat_interval),
        ") must be at most half of --lease (", absl::FormatDuration(c->jobs.lease), ")"));
  }
  if (!c->data_dir.empty()) c->artifacts.dir = c->data_dir + "/artifacts";
  if (!c->stall_after.empty()) {
    absl::Duration bound;
    if (!absl::ParseDuration(c->stall_after, &bound) || bound <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--stall-after: must be a positive duration like 30s or 5m, got: ", c->stall_after));
    }
    c->jobs.stall.stall_after = bound;
  }
  // A beacon rides on every heartbeat: a rank unheard for 2.5 intervals has missed two.
  c->jobs.stall.silent_after = c->jobs.heartbeat_interval * 2.5;
  if (c->max_plan_memory.empty()) {
    c->jobs.max_plan_memory_bytes = sc::MachineMemoryBytes() / 4;
  } else {
    absl::StatusOr<int64_t> bytes = sc::util::ParseBytes(c->max_plan_memory);
    if (!bytes.ok() || *bytes <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--max-plan-memory: ",
          bytes.ok() ? "must be more than 0 bytes" : std::string(bytes.status().message())));
    }
    c->jobs.max_plan_memory_bytes = *bytes;
  }
  absl::StatusOr<int64_t> bandwidth = sc::util::ParseBytes(c->link_bandwidth);
  if (!bandwidth.ok() || *bandwidth <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--plan-link-bandwidth: ",
        bandwidth.ok() ? "must be more than 0 bytes a second" : bandwidth.status().message()));
  }
  c->jobs.plan_costs.link_bytes_per_second = static_cast<double>(*bandwidth);
  c->jobs.plan_costs.message_latency_seconds = absl::ToDoubleSeconds(c->message_latency);
  c->jobs.plan_costs.message_cpu_seconds = absl::ToDoubleSeconds(c->message_cpu);
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  sc::LimitMallocArenas(1);  // first, before any thread exists: memory stays flat over time
  sc::MapLargeAllocations(256 << 10);  // job records and status replies: returned when freed
  sc::daemon::Daemon daemon(CoordinatorInfo());
  Config config;
  DeclareFlags(daemon.flags(), &config);
  if (auto exit = daemon.Configure(argc, argv, [&] { return Validate(&config); })) return *exit;

  auto artifacts = ArtifactStore::Open(config.artifacts);
  if (!artifacts.ok()) return daemon.Fail(artifacts.status());
  sc::coordinator::CoordinatorMetrics metrics(daemon.metrics_registry());

  KvStore kv;
  GrpcWorkerClient worker_client(daemon.PeerSecurity());
  // Calls to workers and job-table writes run here, off the job manager's locks.
  sc::WorkQueue executor(kExecutorThreads);
  // The job table lives with the artifacts under --data-dir; without it jobs are not kept
  // across restarts.
  std::unique_ptr<sc::coordinator::FileJobStore> job_store;
  if (!config.data_dir.empty()) {
    auto opened = sc::coordinator::FileJobStore::Open(config.data_dir + "/jobs");
    if (!opened.ok()) return daemon.Fail(opened.status());
    job_store = *std::move(opened);
  }
  JobManager jobs(config.jobs,
                  {sc::Clock::Real(), &worker_client, &kv, &metrics, job_store.get(), &executor});
  for (const std::string& problem : jobs.Recover()) spdlog::error("job table: {}", problem);
  CoordinatorServiceImpl service(&jobs, &kv, artifacts->get());
  // Client and worker tokens are checked on every call, before the service sees it.
  auto authorized = sc::rpc::AuthorizeEveryCall(&service, "stagecoach.v1.CoordinatorService",
                                                CoordinatorCallCheck(config.auth));
  if (!authorized.ok()) return daemon.Fail(authorized.status());
  sc::coordinator::Generation generation(&jobs);
  sc::coordinator::GenerationServiceImpl generation_service(&generation);
  auto generation_authorized = sc::rpc::AuthorizeEveryCall(
      &generation_service, "stagecoach.v1.GenerationService", CoordinatorCallCheck(config.auth));
  if (!generation_authorized.ok()) return daemon.Fail(generation_authorized.status());
  auto serving = daemon.Serve({authorized->get(), generation_authorized->get()});
  if (!serving.ok()) return daemon.Fail(serving.status());
  spdlog::info("coordinator listening on {} (lease {}, heartbeat {})", serving->ToString(),
               absl::FormatDuration(config.jobs.lease),
               absl::FormatDuration(config.jobs.heartbeat_interval));
  spdlog::info("artifact store {} (uploads up to {} bytes)", (*artifacts)->dir(),
               (*artifacts)->max_bytes());
  jobs.Start();

  daemon.RunUntilSignal();
  return 0;
}
