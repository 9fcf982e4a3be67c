// What both daemons' main() share, so that each main only declares its own flags, builds its
// objects and runs (DESIGN.md "Command-line contract"):
//   - the shared flags, declared once: --listen, --config, --check-config, --log-level,
//     --metrics-listen, --health-listen, --tls-cert, --tls-key, --tls-ca, --tls-server-name,
//     --tls-require-client-cert, --max-message-bytes, --debug-lock-order (FlagSet: command line
//     and YAML file);
//   - logging, TLS server and channel credentials, the Prometheus registry with build info;
//   - serving: the gRPC server, "listening on HOST:PORT" as the first line of stdout, then
//     "metrics on HOST:PORT" (/metrics), then "health on HOST:PORT" (plaintext health checks);
//   - shutdown on SIGINT / SIGTERM.
// Exit codes: 0 after --help or --check-config ("configuration ok"), 2 for a bad flag, config
// file, credential or address, with "<program>: <message>" on stderr.
//
// Lifecycle, all from main's thread: construct, declare the daemon's flags on flags(),
// Configure, build the services, Serve, RunUntilSignal. Not thread-safe; construct it before
// the objects whose services it serves, so that it outlives them.
#pragma once

#include <signal.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/daemon/flag_set.h"
#include "common/metrics/process_metrics.h"
#include "common/rpc/address.h"
#include "common/rpc/channel.h"
#include "common/rpc/server.h"
#include "common/rpc/tls.h"

namespace grpc {
class Service;
}  // namespace grpc

namespace prometheus {
class Registry;
}  // namespace prometheus

namespace stagecoach::metrics {
class MetricsServer;
}  // namespace stagecoach::metrics

namespace stagecoach::daemon {

// What differs between the daemons in the shared flags.
struct DaemonInfo {
  std::string name;         // "coordinator": the logger's name; the program is "stagecoach-<name>"
  std::string description;  // the first line of --help
  std::string default_listen;  // --listen's default, HOST:PORT
  std::string listen_help;
  // Help of the TLS flags, which name this daemon's peers and clients.
  std::string tls_cert_help;
  std::string tls_ca_help;
  std::string tls_server_name_help;
  std::string tls_require_client_cert_help;
};

// The shared flags' values, set by Configure.
struct SharedFlags {
  rpc::HostPort listen;
  std::string log_level = "info";
  std::optional<rpc::HostPort> metrics_listen;  // none: no /metrics endpoint
  std::optional<rpc::HostPort> health_listen;   // none: health checks on --listen only
  bool check_config = false;
  // Abseil's lock-order checking (absl::SetMutexDeadlockDetectionMode): off unless asked for.
  bool debug_lock_order = false;
  rpc::TlsFiles tls;
  std::string tls_server_name;
  int max_message_bytes = rpc::kMaxMessageBytes;
};

class Daemon {
 public:
  // Declares the shared flags.
  explicit Daemon(DaemonInfo info);
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Where the daemon declares its own flags, before Configure.
  FlagSet& flags() { return flags_; }

  // Installs the crash report (common/process/crash_report.h: a fault prints its stack to
  // stderr), blocks SIGINT and SIGTERM in this thread and the threads created afterwards (call
  // it before any thread exists), parses the command line and --config into every flag, runs
  // `validate` (the daemon's own checks across flags), sets up logging and builds the TLS
  // credentials from their files. With --check-config, prints "configuration ok" then.
  // Returns the exit code when main should return now: 0 after --help or --check-config, 2
  // (having printed "<program>: <message>") when anything is wrong; nullopt to go on.
  std::optional<int> Configure(int argc, char** argv,
                               const std::function<absl::Status()>& validate = {});

  // After Configure.
  const SharedFlags& shared() const { return shared_; }
  // TLS credentials and --tls-server-name for this daemon's calls to its peers (no token).
  rpc::ChannelSecurity PeerSecurity() const;
  // The process's registry (stagecoach_build_info on it); served at /metrics by Serve.
  prometheus::Registry& metrics_registry() { return *registry_; }

  // Serves: the /metrics endpoint on --metrics-listen, the gRPC server on --listen with
  // `services` (TLS, --max-message-bytes, RPC latency metrics, health and reflection), then
  // prints "listening on HOST:PORT" (HOST: `advertise_host`, else --listen's host; PORT: the
  // bound one), "metrics on HOST:PORT" and starts the plaintext health server on
  // --health-listen ("health on HOST:PORT"). Returns the advertised address. UNAVAILABLE (or
  // INVALID_ARGUMENT) naming the address that cannot be served; nothing is left running then.
  // Call once, after Configure.
  absl::StatusOr<rpc::HostPort> Serve(const std::vector<grpc::Service*>& services,
                                      const std::string& advertise_host = "");

  // Waits for SIGINT or SIGTERM, runs `on_signal` (the daemon's own bounded shutdown work),
  // then shuts the servers down (calls in flight get 2 s) and waits until they have stopped.
  // Call after a successful Serve.
  void RunUntilSignal(const std::function<void()>& on_signal = {});

  // Prints "<program>: <message>" to stderr; returns 2.
  int Fail(const absl::Status& status) const;

 private:
  // Logging and credentials, after the flags are parsed.
  absl::Status Prepare();
  void StopServing();

  const DaemonInfo info_;
  FlagSet flags_;
  SharedFlags shared_;
  sigset_t signals_{};
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<metrics::ProcessMetrics> process_metrics_;  // refreshed by metrics_server_
  rpc::ServerOptions server_options_;
  std::shared_ptr<grpc::ChannelCredentials> channel_credentials_;
  std::unique_ptr<metrics::MetricsServer> metrics_server_;
  rpc::StartedServer server_;
  rpc::StartedServer health_server_;
};

}  // namespace stagecoach::daemon
