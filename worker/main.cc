// stagecoach-worker: runs pipeline stages for the coordinator. See DESIGN.md
// "Command-line contract".
#include <CLI/CLI.hpp>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/metrics/metrics.h"
#include "common/rpc/address.h"
#include "common/rpc/server.h"
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
  bool check_config = false;
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
  app.add_flag("--check-config", flags.check_config,
               "validate the configuration and exit (0 when valid)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (!flags.config.empty()) {
    absl::Status applied = sc::ApplyConfigFile(
        flags.config, {{"coordinator", &flags.coordinator, coordinator->count() > 0},
                       {"listen", &flags.listen, listen->count() > 0},
                       {"advertise-host", &flags.advertise_host, advertise->count() > 0},
                       {"name", &flags.name, name->count() > 0},
                       {"device", &flags.device, device->count() > 0},
                       {"cache-dir", &flags.cache_dir, cache_dir->count() > 0},
                       {"log-level", &flags.log_level, level->count() > 0},
                       {"metrics-listen", &flags.metrics_listen, metrics_listen->count() > 0}});
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
  if (flags.check_config) {
    std::cout << "configuration ok\n";
    return 0;
  }

  const sigset_t signals = sc::BlockTerminationSignals();

  sc::worker::CoordinatorClient client(flags.coordinator);
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
  sc::worker::WorkerServiceImpl service(&tasks, service_options);

  auto started = sc::rpc::StartServer(*listen_addr, {&service});
  if (!started.ok()) return Fail(std::string(started.status().message()));
  grpc::Server* server = started->server.get();
  sc::rpc::HostPort advertised{flags.advertise_host, started->port};
  std::cout << "listening on " << advertised.ToString() << std::endl;
  if (metrics_server) {
    // Printed after the gRPC address, which tools read from the first line.
    std::cout << "metrics on " << metrics_server->address() << std::endl;
    spdlog::info("metrics at http://{}/metrics", metrics_server->address());
  }

  sc::worker::SessionOptions session_options;
  session_options.registration.set_name(flags.name.empty() ? advertised.ToString() : flags.name);
  session_options.registration.set_address(advertised.ToString());
  session_options.registration.set_device(flags.device);
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
