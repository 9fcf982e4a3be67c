#include "common/rpc/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>

#include <iostream>

#include "absl/strings/str_cat.h"
#include "common/rpc/channel.h"
#include "common/rpc/rpc_metrics.h"

namespace stagecoach::rpc {

absl::StatusOr<StartedServer> StartServer(const HostPort& listen,
                                          const std::vector<grpc::Service*>& services,
                                          const ServerOptions& options) {
  // grpc.health.v1 and server reflection on every server; both are process-wide settings that
  // servers built afterwards pick up.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  StartedServer out;
  builder.AddListeningPort(
      listen.ToString(),
      options.credentials != nullptr ? options.credentials : grpc::InsecureServerCredentials(),
      &out.port);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  // Accept the keepalive pings MakeChannel's clients send on idle streams.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             static_cast<int>(absl::ToInt64Milliseconds(kKeepaliveTime / 2)));
  if (options.metrics != nullptr) {
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> creators;
    creators.push_back(MakeRpcMetricsFactory(*options.metrics));
    builder.experimental().SetInterceptorCreators(std::move(creators));
  }
  for (grpc::Service* service : services) builder.RegisterService(service);
  out.server = builder.BuildAndStart();
  if (out.server == nullptr || out.port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", listen.ToString()));
  }
  return out;
}

absl::StatusOr<StartedServer> StartHealthServer(const HostPort& listen) {
  ServerOptions options;
  options.max_message_bytes = 64 << 10;  // health requests name a service, nothing more
  auto started = StartServer(listen, {}, options);
  if (!started.ok()) {
    return absl::UnavailableError(
        absl::StrCat("--health-listen: cannot listen on ", listen.ToString()));
  }
  return started;
}

absl::StatusOr<StartedServer> ServeHealthChecks(const std::optional<HostPort>& listen) {
  if (!listen.has_value()) return StartedServer{};
  auto started = StartHealthServer(*listen);
  if (!started.ok()) return started.status();
  HostPort bound = *listen;
  bound.port = started->port;
  std::cout << "health on " << bound.ToString() << std::endl;
  return started;
}

}  // namespace stagecoach::rpc
