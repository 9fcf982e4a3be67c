// Server-side gRPC plumbing shared by the daemons.
#pragma once

#include <grpcpp/server.h>

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/rpc/address.h"

namespace grpc {
class Service;
}

namespace stagecoach::rpc {

struct StartedServer {
  std::unique_ptr<grpc::Server> server;
  int port = 0;  // the port actually bound (the one picked when `listen` asked for port 0)
};

// Builds and starts a gRPC server on `listen` serving `services`, with our message size
// limits and a keepalive policy that lets clients of long streams (WatchJob) detect a dead
// peer. Every server also answers gRPC health checks (grpc.health.v1.Health: SERVING while it
// runs) and server reflection (grpc.reflection.v1alpha), so grpcurl, grpc_health_probe and
// Kubernetes gRPC probes work against it. UNAVAILABLE naming the address when it cannot listen.
absl::StatusOr<StartedServer> StartServer(const HostPort& listen,
                                          const std::vector<grpc::Service*>& services);

}  // namespace stagecoach::rpc
