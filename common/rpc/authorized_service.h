// Authorisation applied to every method of a gRPC service in one place: the server serves a
// decorator (AuthorizeEveryCall) whose handlers run the check before the service's own handler.
// A refused call gets the check's status (UNAUTHENTICATED, PERMISSION_DENIED, ...) and never
// reaches the service, so no handler can forget the check and none writes it.
//
// Works with the synchronous API (the services' generated Service classes); every method of the
// service is wrapped, unary and streaming alike.
#pragma once

#include <grpcpp/server_context.h>

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace grpc {
class Service;
}  // namespace grpc

namespace stagecoach::rpc {

// The verdict on one call: OK to let it through. `method` is the RPC's short name ("SubmitJob").
// Called on the call's thread, concurrently for concurrent calls.
using CallCheck =
    std::function<absl::Status(const grpc::ServerContext& ctx, absl::string_view method)>;

// A service to register with the server in place of `service`, serving the same methods with
// `check` run before each. `service` (a generated synchronous Service implementation of the
// proto service `service_full_name`, e.g. "stagecoach.v1.CoordinatorService") must outlive the
// decorator and must not be registered itself. NOT_FOUND when the proto service is unknown;
// INVALID_ARGUMENT when `service` does not serve its methods synchronously.
absl::StatusOr<std::unique_ptr<grpc::Service>> AuthorizeEveryCall(
    grpc::Service* service, const std::string& service_full_name, CallCheck check);

}  // namespace stagecoach::rpc
