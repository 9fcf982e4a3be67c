// Maps absl::Status <-> grpc::Status at the gRPC boundary (same code, same message).
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace stagecoach::rpc {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace stagecoach::rpc
