// stagecoach-worker: runs pipeline stages for the coordinator. See DESIGN.md "Command-line
// contract"; the shared flags, serving and shutdown are common/daemon/daemon.h's.
#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/daemon/daemon.h"
#include "common/rpc/authorized_service.h"
#include "common/util/logging.h"
#include "common/process/malloc_tuning.h"
#include "worker/runtime/device/counting_allocator.h"
#include "worker/runtime/device/device.h"
#include "worker/service/artifact_cache.h"
#include "worker/service/async_task_reporter.h"
#include "worker/service/coordinator_client.h"
#include "worker/service/coordinator_session.h"
#include "worker/service/task_manager.h"
#include "worker/service/transports.h"
#include "worker/service/worker_metrics.h"
#include "worker/service/worker_service.h"

namespace {

namespace sc = stagecoach;

sc::daemon::DaemonInfo WorkerInfo() {
  sc::daemon::DaemonInfo info;
  info.name = "worker";
  info.description = "Stagecoach worker: runs pipeline stages assigned by a coordinator";
  info.default_listen = "0.0.0.0:0";
  info.listen_help = "gRPC address HOST:PORT of this worker (port 0 picks a free one)";
  info.tls_cert_help =
      "PEM certificate: serve TLS with it, and present it as client certificate to the "
      "coordinator";
  info.tls_ca_help =
      "PEM CA that signs the peers' certificates: verifies the coordinator (and, with "
      "--tls-require-client-cert, the clients of this worker)";
  info.tls_server_name_help =
      "name the coordinator's certificate must carry (default: the --coordinator host)";
  info.tls_require_client_cert_help =
      "mutual TLS: refuse clients without a certificate signed by --tls-ca";
  return info;
}

// The worker's own flags.
struct Config {
  std::optional<sc::rpc::HostPort> coordinator;
  std::string advertise_host;
  std::string name;
  std::string device = "cpu";
  sc::worker::ArtifactCacheOptions cache;
  std::string coordinator_token;
  int threads = 0;  // 0: the CPUs this process may use, shared by the job's ranks on this host
  bool no_pin_threads = false;
  double debug_slow_actions = 1.0;
};

void DeclareFlags(sc::daemon::FlagSet& flags, Config* c) {
  flags
      .AddHostPort("coordinator", &c->coordinator,
                   "coordinator address HOST:PORT (default: $STAGECOACH_COORDINATOR)")
      .DefaultFromEnv("STAGECOACH_COORDINATOR")
      .Required();
  flags.AddString("advertise-host", &c->advertise_host,
                  "host the coordinator and peers reach this worker at (default: the --listen "
                  "host, or this machine's host name when listening on every interface)");
  flags.AddString("name", &c->name, "name shown by 'stagectl workers'");
  flags.AddString("device", &c->device, "compute device: cpu, cuda or cuda:N");
  flags.AddString("cache-dir", &c->cache.dir,
                  "where artifacts fetched from the coordinator (uploaded models and data) are "
                  "kept (default: a private directory under $TMPDIR or /tmp, removed at exit)");
  flags
      .AddInt("threads", &c->threads, 0, "threads",
              "LibTorch compute threads of a task; 0: the CPUs this process may use (affinity "
              "mask, cgroup quota) divided among the task's job's ranks on this host (default: "
              "$STAGECOACH_THREADS, else 0)")
      .DefaultFromEnv("STAGECOACH_THREADS");
  flags.AddBool("no-pin-threads", &c->no_pin_threads,
                "leave a task's compute threads unpinned (by default they are pinned to CPUs of "
                "their own when several of the job's ranks share this machine and no cgroup quota "
                "applies; docs/runtime.md, Threads)");
  flags.AddDouble("debug-slow-actions", &c->debug_slow_actions, 1.0,
                  "for tests of straggler detection: make each compute action (F, B, I, W) take "
                  "this many times as long by sleeping after it (1: off)");
  flags.AddTokenFile("coordinator-token-file", &c->coordinator_token,
                     "file holding the token sent to the coordinator (its --worker-token-file)");
}

absl::Status Validate(Config* c, const sc::rpc::HostPort& listen) {
  auto device = sc::runtime::CheckDevice(c->device, "--device");
  if (!device.ok()) return device.status();
  c->device = *device;
  if (c->advertise_host.empty()) {
    c->advertise_host =
        sc::rpc::IsWildcardHost(listen.host) ? sc::rpc::LocalHostName() : listen.host;
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  sc::TuneMallocForTensors();  // first, before any thread exists
  sc::daemon::Daemon daemon(WorkerInfo());
  Config config;
  DeclareFlags(daemon.flags(), &config);
  if (auto exit =
          daemon.Configure(argc, argv, [&] { return Validate(&config, daemon.shared().listen); })) {
    return *exit;
  }
  const std::string coordinator = config.coordinator->ToString();

  sc::rpc::ChannelSecurity coordinator_security = daemon.PeerSecurity();
  coordinator_security.bearer_token = config.coordinator_token;
  sc::worker::CoordinatorClient client(coordinator, coordinator_security);
  auto artifact_cache = sc::worker::ArtifactCache::Open(config.cache, &client);
  if (!artifact_cache.ok()) return daemon.Fail(artifact_cache.status());
  std::unique_ptr<sc::worker::CoordinatorSession> session;
  sc::worker::WorkerMetrics metrics(daemon.metrics_registry());
  sc::worker::MetricsTaskReporter reporter(&client, &metrics);
  // Step reports (and their metrics) go from a thread of their own, off the pipeline.
  sc::worker::AsyncTaskReporter async_reporter(&reporter);
  sc::worker::TaskManagerDeps task_deps;
  task_deps.reporter = &async_reporter;
  task_deps.store = &client;
  task_deps.worker_id = [&session] { return session ? session->worker_id() : std::string(); };
  sc::worker::TransportConfig transport_config;
  transport_config.data_host = config.advertise_host;
  transport_config.cuda_device = sc::runtime::CudaIndex(config.device);
  task_deps.make_transport = sc::worker::MakeTransportFactory(transport_config);
  task_deps.make_collectives = sc::worker::MakeCollectivesFactory(transport_config);
  task_deps.transports = sc::worker::AvailableTransports(transport_config);
  task_deps.device = config.device;
  task_deps.resolve_file = (*artifact_cache)->Resolver();
  // One task per worker process, so the process's tensor bytes are the task's.
  task_deps.memory_counter = &sc::runtime::CountingCpuAllocator::Install();
  task_deps.settle_step = [&client](const stagecoach::v1::SettleStepRequest& request) {
    return client.SettleStep(request);
  };
  // In-memory snapshots outlive the tasks that take them: a restart's new attempt reads them.
  sc::runtime::SnapshotStore snapshots;
  task_deps.snapshot_store = &snapshots;
  task_deps.report_snapshot = [&client](const stagecoach::v1::ReportSnapshotRequest& request) {
    return client.ReportSnapshot(request);
  };
  task_deps.compute_threads = config.threads;
  task_deps.pin_threads = !config.no_pin_threads;
  task_deps.debug_slow_factor = config.debug_slow_actions;
  if (config.debug_slow_actions > 1.0) {
    spdlog::warn("--debug-slow-actions {}: every compute action is slowed down",
                 config.debug_slow_actions);
  }
  sc::worker::TaskManager tasks(task_deps);
  sc::worker::WorkerServiceOptions service_options;
  service_options.resolve_file = task_deps.resolve_file;
  service_options.device = config.device;
  service_options.compute_threads = config.threads;
  sc::worker::WorkerServiceImpl service(&tasks, service_options);
  // Only the coordinator this worker registered with may call it (its session token): checked
  // on every call, before the service sees it.
  sc::worker::SessionToken session_token;
  auto authorized = sc::rpc::AuthorizeEveryCall(
      &service, "stagecoach.v1.WorkerService",
      [&session_token](const grpc::ServerContext& ctx, absl::string_view) {
        return session_token.Check(ctx);
      });
  if (!authorized.ok()) return daemon.Fail(authorized.status());

  auto advertised = daemon.Serve({authorized->get()}, config.advertise_host);
  if (!advertised.ok()) return daemon.Fail(advertised.status());
  sc::worker::SessionOptions session_options;
  session_options.registration.set_name(config.name.empty() ? advertised->ToString() : config.name);
  session_options.registration.set_address(advertised->ToString());
  session_options.registration.set_device(config.device);
  session_options.token = &session_token;
  session_options.snapshots = &snapshots;
  session_options.progress = [&tasks] { return tasks.Progress(); };
  for (const std::string& t : task_deps.transports) session_options.registration.add_transports(t);
  session = std::make_unique<sc::worker::CoordinatorSession>(
      session_options, &client, [&tasks] { return tasks.Status().job_id(); },
      [&tasks](const std::string& why) {
        tasks.StopAll(absl::StrCat("coordinator forgot this worker: ", why), absl::Seconds(10));
      });
  session->Start();
  spdlog::info("worker listening on {}, coordinator {}", advertised->ToString(), coordinator);

  daemon.RunUntilSignal([&tasks] { tasks.StopAll("worker shutting down", absl::Seconds(10)); });
  session.reset();
  return 0;
}
