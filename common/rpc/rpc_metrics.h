// RPC latency metrics of a gRPC server: a server interceptor that observes every call's duration,
// from the receipt of its initial metadata to the sending of its status, as
// stagecoach_rpc_server_duration_seconds{method="<Service>/<Method>", code="<status code>"}
// (a histogram, buckets metrics::DurationBucketsSeconds()). StartServer installs it when
// ServerOptions::metrics is set. For streaming RPCs (WatchJob) the duration is the stream's
// lifetime.
#pragma once

#include <grpcpp/support/server_interceptor.h>

#include <memory>
#include <string>

#include "absl/strings/string_view.h"

namespace prometheus {
class Registry;
}

namespace stagecoach::rpc {

// The metric's name.
inline constexpr char kRpcServerDurationMetric[] = "stagecoach_rpc_server_duration_seconds";

// A factory of interceptors that observe every call of the server on `registry` (which must
// outlive the server). The histogram family is registered on `registry` at once; several
// servers may share a registry (with prometheus-cpp's default InsertBehavior::Merge they share
// the family). Thread-safe: the server calls it from its threads.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> MakeRpcMetricsFactory(
    prometheus::Registry& registry);

// The method label of a gRPC method path: "/stagecoach.v1.CoordinatorService/SubmitJob" ->
// "CoordinatorService/SubmitJob" (the service without its package); a path not of that form
// is returned unchanged (without its leading "/").
std::string RpcMethodLabel(absl::string_view path);

// The code label of a status code: its name as gRPC spells it ("OK", "INVALID_ARGUMENT", ...).
std::string RpcCodeLabel(int code);

}  // namespace stagecoach::rpc
