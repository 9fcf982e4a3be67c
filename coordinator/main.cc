// stagecoach-coordinator: the control plane. See DESIGN.md "Command-line contract".
#include <CLI/CLI.hpp>
#include <iostream>
#include <optional>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/metrics/metrics.h"
#include "common/rpc/address.h"
#include "common/rpc/auth.h"
#include "common/rpc/authorized_service.h"
#include "common/rpc/server.h"
#include "common/rpc/tls.h"
#include "common/util/config_file.h"
#include "common/util/logging.h"
#include "common/util/signals.h"
#include "common/util/work_queue.h"
#include "coordinator/artifact_store.h"
#include "coordinator/coordinator_metrics.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/grpc_worker_client.h"
#include "coordinator/job_manager.h"
#include "coordinator/kv_store.h"

namespace {

using stagecoach::coordinator::ArtifactStore;
using stagecoach::coordinator::ArtifactStoreOptions;
using stagecoach::coordinator::CoordinatorServiceImpl;
using stagecoach::coordinator::GrpcWorkerClient;
using stagecoach::coordinator::JobManager;
using stagecoach::coordinator::JobManagerOptions;
using stagecoach::coordinator::KvStore;

struct Flags {
  std::string listen = "0.0.0.0:7070";
  std::string config;
  std::string lease = "10s";
  std::string heartbeat_interval = "2s";
  std::string comm_timeout = "60s";
  std::string hold_timeout = "24h";
  std::string log_level = "info";
  std::string data_dir;
  std::string max_upload_bytes = "1073741824";
  std::string metrics_listen;  // empty: no /metrics endpoint
  std::string health_listen;   // empty: health checks on the main server only
  bool check_config = false;
  // Security (docs/security.md).
  std::string tls_cert, tls_key, tls_ca, tls_server_name;
  bool tls_require_client_cert = false;
  std::string client_token_file, worker_token_file;
  std::string max_message_bytes = std::to_string(stagecoach::rpc::kMaxMessageBytes);
};

// Threads that run the job manager's calls to workers and disk writes.
constexpr int kBackgroundThreads = 8;

int Fail(const std::string& message) {
  std::cerr << "stagecoach-coordinator: " << message << "\n";
  return 2;
}

absl::StatusOr<absl::Duration> ParsePositiveDuration(const std::string& text,
                                                     const std::string& flag) {
  absl::Duration d;
  if (!absl::ParseDuration(text, &d) || d <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", flag, ": must be a positive duration like 500ms, 10s or 1m, got '", text, "'"));
  }
  return d;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Stagecoach coordinator: plans pipeline jobs and steers the workers that run them"};
  Flags flags;
  auto* listen =
      app.add_option("--listen", flags.listen, "gRPC address HOST:PORT (port 0 picks a free port)");
  app.add_option("--config", flags.config, "YAML file with any of these options as keys");
  auto* lease = app.add_option("--lease", flags.lease,
                               "declare a worker lost after this long without a heartbeat");
  auto* heartbeat = app.add_option("--heartbeat-interval", flags.heartbeat_interval,
                                   "how often workers heartbeat");
  auto* comm = app.add_option("--comm-timeout", flags.comm_timeout,
                              "bound on every data-plane wait in a job's tasks");
  auto* hold = app.add_option("--hold-timeout", flags.hold_timeout,
                              "longest a PAUSED job's tasks hold before they give up and fail");
  auto* level =
      app.add_option("--log-level", flags.log_level, "trace, debug, info, warn, error or off");
  auto* data_dir = app.add_option(
      "--data-dir", flags.data_dir,
      "directory for the coordinator's state: the job table in DIR/jobs (kept across restarts: "
      "running jobs continue from their latest checkpoint) and uploaded artifacts in "
      "DIR/artifacts (default: a private temporary directory for artifacts, removed at exit, "
      "and no job table)");
  auto* max_upload =
      app.add_option("--max-upload-bytes", flags.max_upload_bytes,
                     "largest artifact stagectl may upload, in bytes (default 1 GiB)");
  auto* metrics_listen = app.add_option(
      "--metrics-listen", flags.metrics_listen,
      "serve Prometheus metrics at http://HOST:PORT/metrics (port 0 picks a free port; "
      "default: no metrics endpoint)");
  auto* health_listen = app.add_option(
      "--health-listen", flags.health_listen,
      "also answer gRPC health checks in plaintext on HOST:PORT, for probes that cannot speak "
      "TLS (Kubernetes gRPC probes; default: health checks on --listen only)");
  app.add_flag("--check-config", flags.check_config,
               "validate the configuration and exit (0 when valid)");
  auto* tls_cert = app.add_option(
      "--tls-cert", flags.tls_cert,
      "PEM certificate: serve TLS with it, and present it as client certificate to workers");
  auto* tls_key = app.add_option("--tls-key", flags.tls_key, "PEM private key of --tls-cert");
  auto* tls_ca =
      app.add_option("--tls-ca", flags.tls_ca,
                     "PEM CA that signs the peers' certificates: verifies the workers (and, with "
                     "--tls-require-client-cert, the clients of this coordinator)");
  auto* tls_server_name = app.add_option(
      "--tls-server-name", flags.tls_server_name,
      "name every worker's certificate must carry (default: the host of its address)");
  app.add_flag("--tls-require-client-cert", flags.tls_require_client_cert,
               "mutual TLS: refuse clients (stagectl, workers) without a certificate signed by "
               "--tls-ca");
  auto* client_token = app.add_option(
      "--client-token-file", flags.client_token_file,
      "require the token in this file as 'authorization: Bearer' on client RPCs (stagectl)");
  auto* worker_token =
      app.add_option("--worker-token-file", flags.worker_token_file,
                     "require the token in this file as 'authorization: Bearer' on worker RPCs");
  auto* max_message = app.add_option("--max-message-bytes", flags.max_message_bytes,
                                     "largest gRPC message sent or accepted, in bytes");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  if (!flags.config.empty()) {
    absl::Status applied = stagecoach::ApplyConfigFile(
        flags.config, {{"listen", &flags.listen, listen->count() > 0},
                       {"lease", &flags.lease, lease->count() > 0},
                       {"heartbeat-interval", &flags.heartbeat_interval, heartbeat->count() > 0},
                       {"comm-timeout", &flags.comm_timeout, comm->count() > 0},
                       {"hold-timeout", &flags.hold_timeout, hold->count() > 0},
                       {"log-level", &flags.log_level, level->count() > 0},
                       {"data-dir", &flags.data_dir, data_dir->count() > 0},
                       {"max-upload-bytes", &flags.max_upload_bytes, max_upload->count() > 0},
                       {"metrics-listen", &flags.metrics_listen, metrics_listen->count() > 0},
                       {"health-listen", &flags.health_listen, health_listen->count() > 0},
                       {"tls-cert", &flags.tls_cert, tls_cert->count() > 0},
                       {"tls-key", &flags.tls_key, tls_key->count() > 0},
                       {"tls-ca", &flags.tls_ca, tls_ca->count() > 0},
                       {"tls-server-name", &flags.tls_server_name, tls_server_name->count() > 0},
                       {"client-token-file", &flags.client_token_file, client_token->count() > 0},
                       {"worker-token-file", &flags.worker_token_file, worker_token->count() > 0},
                       {"max-message-bytes", &flags.max_message_bytes, max_message->count() > 0}});
    if (!applied.ok()) return Fail(std::string(applied.message()));
  }

  JobManagerOptions options;
  auto listen_addr = stagecoach::rpc::ParseHostPort(flags.listen, "--listen");
  if (!listen_addr.ok()) return Fail(std::string(listen_addr.status().message()));
  for (auto [text, flag, into] :
       {std::tuple{&flags.lease, "lease", &options.lease},
        std::tuple{&flags.heartbeat_interval, "heartbeat-interval", &options.heartbeat_interval},
        std::tuple{&flags.comm_timeout, "comm-timeout", &options.comm_timeout},
        std::tuple{&flags.hold_timeout, "hold-timeout", &options.hold_timeout}}) {
    auto d = ParsePositiveDuration(*text, flag);
    if (!d.ok()) return Fail(std::string(d.status().message()));
    *into = *d;
  }
  if (options.heartbeat_interval * 2 > options.lease) {
    return Fail(absl::StrCat("--heartbeat-interval (", flags.heartbeat_interval,
                             ") must be at most half of --lease (", flags.lease, ")"));
  }
  ArtifactStoreOptions artifact_options;
  if (!absl::SimpleAtoi(flags.max_upload_bytes, &artifact_options.max_bytes) ||
      artifact_options.max_bytes < 1) {
    return Fail(absl::StrCat("--max-upload-bytes: must be a positive number of bytes, got '",
                             flags.max_upload_bytes, "'"));
  }
  if (!flags.metrics_listen.empty()) {
    if (auto m = stagecoach::rpc::ParseHostPort(flags.metrics_listen, "--metrics-listen");
        !m.ok()) {
      return Fail(std::string(m.status().message()));
    }
  }
  std::optional<stagecoach::rpc::HostPort> health_addr;
  if (!flags.health_listen.empty()) {
    auto h = stagecoach::rpc::ParseHostPort(flags.health_listen, "--health-listen");
    if (!h.ok()) return Fail(std::string(h.status().message()));
    health_addr = *h;
  }

  if (!flags.data_dir.empty()) artifact_options.dir = flags.data_dir + "/artifacts";
  if (auto s = stagecoach::InitLogging("coordinator", flags.log_level); !s.ok()) {
    return Fail(std::string(s.message()));
  }
  // Security: TLS on the server and on the channels to workers, the tokens required.
  stagecoach::rpc::TlsFiles tls{flags.tls_cert, flags.tls_key, flags.tls_ca,
                                flags.tls_require_client_cert};
  auto server_credentials = stagecoach::rpc::MakeServerCredentials(tls);
  if (!server_credentials.ok()) return Fail(std::string(server_credentials.status().message()));
  auto channel_credentials = stagecoach::rpc::MakeChannelCredentials(tls);
  if (!channel_credentials.ok()) return Fail(std::string(channel_credentials.status().message()));
  stagecoach::rpc::ChannelSecurity worker_security;
  worker_security.credentials = *channel_credentials;
  worker_security.server_name = flags.tls_server_name;
  stagecoach::coordinator::CoordinatorAuth auth;
  for (auto [path, flag, into] :
       {std::tuple{&flags.client_token_file, "--client-token-file", &auth.client_token},
        std::tuple{&flags.worker_token_file, "--worker-token-file", &auth.worker_token}}) {
    if (path->empty()) continue;
    auto token = stagecoach::rpc::ReadTokenFile(*path, flag);
    if (!token.ok()) return Fail(std::string(token.status().message()));
    *into = *token;
  }
  stagecoach::rpc::ServerOptions server_options;
  server_options.credentials = *server_credentials;
  if (!absl::SimpleAtoi(flags.max_message_bytes, &server_options.max_message_bytes) ||
      server_options.max_message_bytes < 4096) {
    return Fail(absl::StrCat("--max-message-bytes: must be a number of bytes >= 4096, got '",
                             flags.max_message_bytes, "'"));
  }
  if (flags.check_config) {
    std::cout << "configuration ok\n";
    return 0;
  }

  const sigset_t signals = stagecoach::BlockTerminationSignals();

  auto artifacts = ArtifactStore::Open(artifact_options);
  if (!artifacts.ok()) return Fail(std::string(artifacts.status().message()));
  KvStore kv;
  GrpcWorkerClient worker_client(worker_security);
  auto registry = std::make_shared<prometheus::Registry>();
  stagecoach::metrics::AddBuildInfo(*registry);
  stagecoach::coordinator::CoordinatorMetrics metrics(*registry);
  std::unique_ptr<stagecoach::metrics::MetricsServer> metrics_server;
  if (!flags.metrics_listen.empty()) {
    auto served = stagecoach::metrics::MetricsServer::Start(flags.metrics_listen, registry);
    if (!served.ok()) return Fail(std::string(served.status().message()));
    metrics_server = *std::move(served);
  }
  // The job table lives with the artifacts under --data-dir; without it jobs are not kept
  // across restarts.
  std::unique_ptr<stagecoach::coordinator::FileJobStore> job_store;
  if (!flags.data_dir.empty()) {
    auto opened = stagecoach::coordinator::FileJobStore::Open(flags.data_dir + "/jobs");
    if (!opened.ok()) return Fail(std::string(opened.status().message()));
    job_store = *std::move(opened);
  }
  // Calls to workers and disk writes of the job manager run here, off its locks.
  stagecoach::WorkQueue background(kBackgroundThreads);
  JobManager jobs(options, {stagecoach::Clock::Real(), &worker_client, &kv, &metrics,
                            job_store.get(), &background});
  for (const std::string& problem : jobs.Recover()) spdlog::error("job table: {}", problem);
  CoordinatorServiceImpl service(&jobs, &kv, artifacts->get());
  // Every call passes the token check of its method (coordinator_auth.h) before the service.
  auto authorized = stagecoach::rpc::AuthorizeEveryCall(
      &service, stagecoach::v1::CoordinatorService::service_full_name(),
      stagecoach::coordinator::CoordinatorCallCheck(auth));
  if (!authorized.ok()) return Fail(std::string(authorized.status().message()));

  server_options.metrics = registry.get();
  auto started =
      stagecoach::rpc::StartServer(*listen_addr, {authorized->get()}, server_options);
  if (!started.ok()) return Fail(std::string(started.status().message()));
  grpc::Server* server = started->server.get();
  stagecoach::rpc::HostPort actual = *listen_addr;
  actual.port = started->port;
  std::cout << "listening on " << actual.ToString() << std::endl;
  if (metrics_server) {
    // Printed after the gRPC address, which tools read from the first line.
    std::cout << "metrics on " << metrics_server->address() << std::endl;
    spdlog::info("metrics at http://{}/metrics", metrics_server->address());
  }
  auto health = stagecoach::rpc::ServeHealthChecks(health_addr);
  if (!health.ok()) return Fail(std::string(health.status().message()));
  spdlog::info("coordinator listening on {} (lease {}, heartbeat {})", actual.ToString(),
               flags.lease, flags.heartbeat_interval);
  spdlog::info("artifact store {} (uploads up to {} bytes)", (*artifacts)->dir(),
               (*artifacts)->max_bytes());
  jobs.Start();

  std::thread signal_thread([&] {
    const int sig = stagecoach::WaitForTerminationSignal(signals);
    spdlog::info("signal {}: shutting down", sig);
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  });
  server->Wait();
  signal_thread.join();
  return 0;
}
