// The daemons' shared bootstrap (see daemon.h).
#include "common/daemon/daemon.h"

#include <chrono>
#include <iostream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics/metrics.h"
#include "common/metrics/process_metrics.h"
#include "common/process/crash_report.h"
#include "common/util/logging.h"
#include "common/process/signals.h"
#include "prometheus/registry.h"

namespace stagecoach::daemon {
namespace {

// How long calls in flight may take to finish once a daemon shuts down.
constexpr std::chrono::seconds kShutdownGrace(2);

}  // namespace

Daemon::Daemon(DaemonInfo info)
    : info_(std::move(info)),
      flags_(info_.description),
      registry_(std::make_shared<prometheus::Registry>()) {
  metrics::AddBuildInfo(*registry_);
  process_metrics_ = std::make_unique<metrics::ProcessMetrics>(*registry_);
  auto listen = rpc::ParseHostPort(info_.default_listen, "--listen");
  if (listen.ok()) shared_.listen = *listen;
  flags_.AddHostPort("listen", &shared_.listen, info_.listen_help);
  flags_.AddString("log-level", &shared_.log_level, "trace, debug, info, warn, error or off");
  flags_.AddHostPort("metrics-listen", &shared_.metrics_listen,
                     "serve Prometheus metrics at http://HOST:PORT/metrics (port 0 picks a free "
                     "port; default: no metrics endpoint)");
  flags_.AddHostPort("health-listen", &shared_.health_listen,
                     "also answer gRPC health checks in plaintext on HOST:PORT, for probes that "
                     "cannot speak TLS (Kubernetes gRPC probes; default: health checks on "
                     "--listen only)");
  flags_
      .AddBool("check-config", &shared_.check_config,
               "validate the configuration and exit (0 when valid)")
      .CommandLineOnly();
  flags_.AddString("tls-cert", &shared_.tls.cert, info_.tls_cert_help);
  flags_.AddString("tls-key", &shared_.tls.key, "PEM private key of --tls-cert");
  flags_.AddString("tls-ca", &shared_.tls.ca, info_.tls_ca_help);
  flags_.AddString("tls-server-name", &shared_.tls_server_name, info_.tls_server_name_help);
  flags_.AddBool("tls-require-client-cert", &shared_.tls.require_client_cert,
                 info_.tls_require_client_cert_help);
  flags_.AddInt("max-message-bytes", &shared_.max_message_bytes, 4096, "bytes",
                "largest gRPC message sent or accepted, in bytes");
  flags_.AddBool("debug-lock-order", &shared_.debug_lock_order,
                 "check the order in which every lock (the daemon's and gRPC's) is taken and "
                 "abort, naming both, when two are ever taken in opposite orders (Abseil's "
                 "deadlock detection: one process-wide graph of locks, several percent of the "
                 "daemon's CPU; the tests turn it on)");
}

Daemon::~Daemon() { StopServing(); }

int Daemon::Fail(const absl::Status& status) const {
  std::cerr << "stagecoach-" << info_.name << ": " << status.message() << "\n";
  return 2;
}

std::optional<int> Daemon::Configure(int argc, char** argv,
                                     const std::function<absl::Status()>& validate) {
  // A fault leaves its stack in the daemon's log (the name is kept for the process's life).
  InstallCrashReport((new std::string(absl::StrCat("stagecoach-", info_.name)))->c_str());
  signals_ = BlockTerminationSignals();
  auto parsed = flags_.Parse(argc, argv);
  if (!parsed.ok()) return Fail(parsed.status());
  if (*parsed == FlagSet::Outcome::kHelpShown) return 0;
  if (validate) {
    if (absl::Status valid = validate(); !valid.ok()) return Fail(valid);
  }
  if (absl::Status prepared = Prepare(); !prepared.ok()) return Fail(prepared);
  if (shared_.check_config) {
    std::cout << "configuration ok\n";
    return 0;
  }
  return std::nullopt;
}

absl::Status Daemon::Prepare() {
  if (absl::Status s = InitLogging(info_.name, shared_.log_level); !s.ok()) return s;
  // Debian builds Abseil without NDEBUG, which leaves its deadlock detection on: every lock
  // taken while another is held updates a graph of locks under one process-wide lock. The
  // top entry of the coordinator's profile at 4,096 workers (docs/fleet.md); kept for tests.
  absl::SetMutexDeadlockDetectionMode(shared_.debug_lock_order ? absl::OnDeadlockCycle::kAbort
                                                               : absl::OnDeadlockCycle::kIgnore);
  auto server_credentials = rpc::MakeServerCredentials(shared_.tls);
  if (!server_credentials.ok()) return server_credentials.status();
  auto channel_credentials = rpc::MakeChannelCredentials(shared_.tls);
  if (!channel_credentials.ok()) return channel_credentials.status();
  server_options_.credentials = *server_credentials;
  server_options_.max_message_bytes = shared_.max_message_bytes;
  server_options_.metrics = registry_.get();
  channel_credentials_ = *channel_credentials;
  return absl::OkStatus();
}

rpc::ChannelSecurity Daemon::PeerSecurity() const {
  rpc::ChannelSecurity security;
  security.credentials = channel_credentials_;
  security.server_name = shared_.tls_server_name;
  return security;
}

absl::StatusOr<rpc::HostPort> Daemon::Serve(const std::vector<grpc::Service*>& services,
                                            const std::string& advertise_host) {
  if (shared_.metrics_listen.has_value()) {
    auto served = metrics::MetricsServer::Start(shared_.metrics_listen->ToString(), registry_,
                                                "--metrics-listen",
                                                [this] { process_metrics_->Refresh(); });
    if (!served.ok()) return served.status();
    metrics_server_ = *std::move(served);
  }
  auto started = rpc::StartServer(shared_.listen, services, server_options_);
  if (!started.ok()) {
    StopServing();
    return started.status();
  }
  server_ = *std::move(started);
  rpc::HostPort advertised{advertise_host.empty() ? shared_.listen.host : advertise_host,
                           server_.port};
  std::cout << "listening on " << advertised.ToString() << std::endl;
  if (metrics_server_ != nullptr) {
    // After the gRPC address, which tools read from the first line.
    std::cout << "metrics on " << metrics_server_->address() << std::endl;
    spdlog::info("metrics at http://{}/metrics", metrics_server_->address());
  }
  auto health = rpc::ServeHealthChecks(shared_.health_listen);
  if (!health.ok()) {
    StopServing();
    return health.status();
  }
  health_server_ = *std::move(health);
  return advertised;
}

void Daemon::RunUntilSignal(const std::function<void()>& on_signal) {
  const int sig = WaitForTerminationSignal(signals_);
  spdlog::info("signal {}: shutting down", sig);
  if (on_signal) on_signal();
  StopServing();
}

void Daemon::StopServing() {
  const auto deadline = std::chrono::system_clock::now() + kShutdownGrace;
  for (rpc::StartedServer* s : {&server_, &health_server_}) {
    if (s->server == nullptr) continue;
    s->server->Shutdown(deadline);
    s->server->Wait();
    s->server.reset();
  }
  metrics_server_.reset();
}

}  // namespace stagecoach::daemon
