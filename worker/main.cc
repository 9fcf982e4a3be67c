// stagecoach-worker: runs pipeline stages for the coordinator. See DESIGN.md
// "Command-line contract".
#include <CLI/CLI.hpp>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/metrics/metrics.h"
#include "common/rpc/address.h"
#include "common/rpc/auth.h"
#include "common/rpc/server.h"
#include "common/rpc/tls.h"
#include "common/util/config_file.h"
#include "common/util/logging.h"
#include "common/util/malloc_tuning.h"
#include "common/util/signals.h"
#include "worker/runtime/device.h"
#include "worker/service/artifact_cache.h"
#include "worker/service/coordinator_client.h"
#include "worker/service/coordinator_session.h"
#include "worker/service/task_manager.h"
#include "worker/service/transports.h"
#include "worker/service/worker_metrics.h"
#include "worker/service/worker_service.h"

namespace {

namespace sc = stagecoach;

struct Flags {
  std::string coordinator;
  std::string listen = "0.0.0.0:0";
  std::string advertise_host;
  std::string name;
  std::string device = "cpu";
  std::string config;
  std::string log_level = "info";
  std::string cache_dir;
  std::string metrics_listen;  // empty: no /metrics endpoint
  std::string health_listen;   // empty: health checks on the main server only
  bool check_config = false;
  // Security (docs/security.md).
  std::string tls_cert, tls_key, tls_ca, tls_server_name;
  bool tls_require_client_cert = false;
  std::string coordinator_token_file;
  std::string max_message_bytes = std::to_string(sc::rpc::kMaxMessageBytes);
};

int Fail(const std::string& message) {
  std::cerr << "stagecoach-worker: " << message << "\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  sc::TuneMallocForTensors();  // first, before any thread exists
  CLI::App app{"Stagecoach worker: runs pipeline stages assigned by a coordinator"};
  Flags flags;
  if (const char* env = std::getenv("STAGECOACH_COORDINATOR")) flags.coordinator = env;
  auto* coordinator = app.add_option("--coordinator", flags.coordinator,
                                     "coordinator address HOST:PORT (default: "
                                     "$STAGECOACH_COORDINATOR)");
  auto* listen = app.add_option("--listen", flags.listen,
                                "gRPC address HOST:PORT of this worker (port 0 picks a free one)");
  auto* advertise = app.add_option(
      "--advertise-host", flags.advertise_host,
      "host the coordinator and peers reach this worker at (default: the --listen host, or "
      "this machine's host name when listening on every interface)");
  auto* name = app.add_option("--name", flags.name, "name shown by 'stagectl workers'");
  auto* device = app.add_option("--device", flags.device, "compute device: cpu, cuda or cuda:N");
  app.add_option("--config", flags.config, "YAML file with any of these options as keys");
  auto* cache_dir = app.add_option(
      "--cache-dir", flags.cache_dir,
      "where artifacts fetched from the coordinator (uploaded models and data) are kept "
      "(default: a private directory under $TMPDIR or /tmp, removed at exit)");
  auto* level =
      app.add_option("--log-level", flags.log_level, "trace, debug, info, warn, error or off");
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
      "PEM certificate: serve TLS with it, and present it as client certificate to the "
      "coordinator");
  auto* tls_key = app.add_option("--tls-key", flags.tls_key, "PEM private key of --tls-cert");
  auto* tls_ca = app.add_option(
      "--tls-ca", flags.tls_ca,
      "PEM CA that signs the peers' certificates: verifies the coordinator (and, with "
      "--tls-require-client-cert, the clients of this worker)");
  auto* tls_server_name = app.add_option(
      "--tls-server-name", flags.tls_server_name,
      "name the coordinator's certificate must carry (default: the --coordinator host)");
  app.add_flag("--tls-require-client-cert", flags.tls_require_client_cert,
               "mutual TLS: refuse clients without a certificate signed by --tls-ca");
  auto* coordinator_token =
      app.add_option("--coordinator-token-file", flags.coordinator_token_file,
                     "file holding the token sent to the coordinator (its --worker-token-file)");
  auto* max_message = app.add_option("--max-message-bytes", flags.max_message_bytes,
                                     "largest gRPC message sent or accepted, in bytes");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (!flags.config.empty()) {
    absl::Status applied = sc::ApplyConfigFile(
        flags.config,
        {{"coordinator", &flags.coordinator, coordinator->count() > 0},
         {"listen", &flags.listen, listen->count() > 0},
         {"advertise-host", &flags.advertise_host, advertise->count() > 0},
         {"name", &flags.name, name->count() > 0},
         {"device", &flags.device, device->count() > 0},
         {"cache-dir", &flags.cache_dir, cache_dir->count() > 0},
         {"log-level", &flags.log_level, level->count() > 0},
         {"metrics-listen", &flags.metrics_listen, metrics_listen->count() > 0},
         {"health-listen", &flags.health_listen, health_listen->count() > 0},
         {"tls-cert", &flags.tls_cert, tls_cert->count() > 0},
         {"tls-key", &flags.tls_key, tls_key->count() > 0},
         {"tls-ca", &flags.tls_ca, tls_ca->count() > 0},
         {"tls-server-name", &flags.tls_server_name, tls_server_name->count() > 0},
         {"coordinator-token-file", &flags.coordinator_token_file, coordinator_token->count() > 0},
         {"max-message-bytes", &flags.max_message_bytes, max_message->count() > 0}});
    if (!applied.ok()) return Fail(std::string(applied.message()));
  }
  if (flags.coordinator.empty()) {
    return Fail("--coordinator: required (or set STAGECOACH_COORDINATOR)");
  }
  if (auto c = sc::rpc::ParseHostPort(flags.coordinator, "--coordinator"); !c.ok()) {
    return Fail(std::string(c.status().message()));
  }
  auto listen_addr = sc::rpc::ParseHostPort(flags.listen, "--listen");
  if (!listen_addr.ok()) return Fail(std::string(listen_addr.status().message()));
  if (!flags.metrics_listen.empty()) {
    if (auto m = sc::rpc::ParseHostPort(flags.metrics_listen, "--metrics-listen"); !m.ok()) {
      return Fail(std::string(m.status().message()));
    }
  }
  std::optional<sc::rpc::HostPort> health_addr;
  if (!flags.health_listen.empty()) {
    auto h = sc::rpc::ParseHostPort(flags.health_listen, "--health-listen");
    if (!h.ok()) return Fail(std::string(h.status().message()));
    health_addr = *h;
  }

  auto checked_device = sc::runtime::CheckDevice(flags.device, "--device");
  if (!checked_device.ok()) return Fail(std::string(checked_device.status().message()));
  flags.device = *checked_device;
  if (flags.advertise_host.empty()) {
    flags.advertise_host =
        sc::rpc::IsWildcardHost(listen_addr->host) ? sc::rpc::LocalHostName() : listen_addr->host;
  }
  if (auto s = sc::InitLogging("worker", flags.log_level); !s.ok()) {
    return Fail(std::string(s.message()));
  }
  // Security: TLS on the server and on the channel to the coordinator, the token for it.
  sc::rpc::TlsFiles tls{flags.tls_cert, flags.tls_key, flags.tls_ca, flags.tls_require_client_cert};
  auto server_credentials = sc::rpc::MakeServerCredentials(tls);
  if (!server_credentials.ok()) return Fail(std::string(server_credentials.status().message()));
  sc::rpc::ChannelSecurity coordinator_security;
  auto channel_credentials = sc::rpc::MakeChannelCredentials(tls);
  if (!channel_credentials.ok()) return Fail(std::string(channel_credentials.status().message()));
  coordinator_security.credentials = *channel_credentials;
  coordinator_security.server_name = flags.tls_server_name;
  if (!flags.coordinator_token_file.empty()) {
    auto token = sc::rpc::ReadTokenFile(flags.coordinator_token_file, "--coordinator-token-file");
    if (!token.ok()) return Fail(std::string(token.status().message()));
    coordinator_security.bearer_token = *token;
  }
  sc::rpc::ServerOptions server_options;
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

  const sigset_t signals = sc::BlockTerminationSignals();

  sc::worker::CoordinatorClient client(flags.coordinator, coordinator_security);
  sc::worker::ArtifactCacheOptions cache_options;
  cache_options.dir = flags.cache_dir;
  auto artifact_cache = sc::worker::ArtifactCache::Open(cache_options, &client);
  if (!artifact_cache.ok()) return Fail(std::string(artifact_cache.status().message()));
  std::unique_ptr<sc::worker::CoordinatorSession> session;
  const std::string data_host = flags.advertise_host;
  auto registry = std::make_shared<prometheus::Registry>();
  sc::metrics::AddBuildInfo(*registry);
  sc::worker::WorkerMetrics metrics(*registry);
  sc::worker::MetricsTaskReporter reporter(&client, &metrics);
  std::unique_ptr<sc::metrics::MetricsServer> metrics_server;
  if (!flags.metrics_listen.empty()) {
    auto served = sc::metrics::MetricsServer::Start(flags.metrics_listen, registry);
    if (!served.ok()) return Fail(std::string(served.status().message()));
    metrics_server = *std::move(served);
  }
  sc::worker::TaskManagerDeps task_deps;
  task_deps.reporter = &reporter;
  task_deps.store = &client;
  task_deps.worker_id = [&session] { return session ? session->worker_id() : std::string(); };
  sc::worker::TransportConfig transport_config;
  transport_config.data_host = data_host;
  transport_config.cuda_device = sc::runtime::CudaIndex(flags.device);
  task_deps.make_transport = sc::worker::MakeTransportFactory(transport_config);
  task_deps.transports = sc::worker::AvailableTransports(transport_config);
  task_deps.device = flags.device;
  task_deps.resolve_file = (*artifact_cache)->Resolver();
  sc::worker::TaskManager tasks(task_deps);
  sc::worker::WorkerServiceOptions service_options;
  service_options.resolve_file = task_deps.resolve_file;
  service_options.device = flags.device;
  // Only the coordinator this worker registered with may call it (its session token).
  sc::worker::SessionToken session_token;
  service_options.authorize = [&session_token](const grpc::ServerContext& ctx) {
    return session_token.Check(ctx);
  };
  sc::worker::WorkerServiceImpl service(&tasks, service_options);

  server_options.metrics = registry.get();
  auto started = sc::rpc::StartServer(*listen_addr, {&service}, server_options);
  if (!started.ok()) return Fail(std::string(started.status().message()));
  grpc::Server* server = started->server.get();
  sc::rpc::HostPort advertised{flags.advertise_host, started->port};
  std::cout << "listening on " << advertised.ToString() << std::endl;
  if (metrics_server) {
    // Printed after the gRPC address, which tools read from the first line.
    std::cout << "metrics on " << metrics_server->address() << std::endl;
    spdlog::info("metrics at http://{}/metrics", metrics_server->address());
  }
  auto health = sc::rpc::ServeHealthChecks(health_addr);
  if (!health.ok()) return Fail(std::string(health.status().message()));

  sc::worker::SessionOptions session_options;
  session_options.registration.set_name(flags.name.empty() ? advertised.ToString() : flags.name);
  session_options.registration.set_address(advertised.ToString());
  session_options.registration.set_device(flags.device);
  session_options.token = &session_token;
  for (const std::string& t : task_deps.transports) session_options.registration.add_transports(t);
  session = std::make_unique<sc::worker::CoordinatorSession>(
      session_options, &client, [&tasks] { return tasks.Status().job_id(); },
      [&tasks](const std::string& why) {
        tasks.StopAll(absl::StrCat("coordinator forgot this worker: ", why), absl::Seconds(10));
      });
  session->Start();
  spdlog::info("worker listening on {}, coordinator {}", advertised.ToString(), flags.coordinator);

  std::thread signal_thread([&] {
    const int sig = sc::WaitForTerminationSignal(signals);
    spdlog::info("signal {}: shutting down", sig);
    tasks.StopAll("worker shutting down", absl::Seconds(10));
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  });
  server->Wait();
  signal_thread.join();
  session.reset();
  return 0;
}
