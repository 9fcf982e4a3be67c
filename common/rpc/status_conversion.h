// Maps absl::Status <-> grpc::Status at the gRPC boundary (same code, same message).
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace stagecoach::rpc {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// A failed client call as an absl::Status with the same code and a message saying which call
// on which peer failed: "<call> on <peer>: <message>". OK stays OK.
absl::Status CallError(const grpc::Status& status, absl::string_view call, absl::string_view peer);

}  // namespace stagecoach::rpc
