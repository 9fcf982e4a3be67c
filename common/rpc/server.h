// Server-side gRPC plumbing shared by the daemons.
#pragma once

#include <grpcpp/server.h>

#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "common/rpc/address.h"
#include "common/rpc/channel.h"

namespace grpc {
class Service;
class ServerCredentials;
}  // namespace grpc

namespace prometheus {
class Registry;
}

namespace stagecoach::rpc {

struct StartedServer {
  std::unique_ptr<grpc::Server> server;
  int port = 0;  // the port actually bound (the one picked when `listen` asked for port 0)
};

// How a server is secured and observed.
struct ServerOptions {
  // Transport credentials: TLS or mutual TLS (common/rpc/tls.h builds them from certificate
  // files); null serves plaintext.
  std::shared_ptr<grpc::ServerCredentials> credentials;
  // Largest message accepted or sent, in bytes.
  int max_message_bytes = kMaxMessageBytes;
  // When set, every RPC's latency is observed on it by method and status code
  // (stagecoach_rpc_server_duration_seconds{method,code}, common/rpc/rpc_metrics.h).
  prometheus::Registry* metrics = nullptr;
};

// Builds and starts a gRPC server on `listen` serving `services`, with `options`' message size
// limit, credentials and metrics, and a keepalive policy that lets clients of long streams
// (WatchJob) detect a dead peer. Every server also answers gRPC health checks
// (grpc.health.v1.Health: SERVING while it runs) and server reflection (grpc.reflection.v1alpha),
// so grpcurl, grpc_health_probe and Kubernetes gRPC probes work against it. UNAVAILABLE naming the
// address when it cannot listen.
absl::StatusOr<StartedServer> StartServer(const HostPort& listen,
                                          const std::vector<grpc::Service*>& services,
                                          const ServerOptions& options = {});

// A plaintext server on `listen` answering only gRPC health checks (grpc.health.v1: SERVING while
// the process runs), for probes that cannot speak TLS (Kubernetes' gRPC probes) when the main
// server requires it (`--health-listen`). UNAVAILABLE naming the address when it cannot listen.
absl::StatusOr<StartedServer> StartHealthServer(const HostPort& listen);

// A daemon's --health-listen: when `listen` is set, StartHealthServer on it and print
// "health on HOST:PORT" (the bound port) to stdout; a StartedServer without a server otherwise.
absl::StatusOr<StartedServer> ServeHealthChecks(const std::optional<HostPort>& listen);

}  // namespace stagecoach::rpc
