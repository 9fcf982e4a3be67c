// Maps absl::Status <-> grpc::Status at the gRPC boundary (same code, same message, except
// that a message too long for a gRPC trailer is summarised: see SummarizeErrorMessage).
#pragma once

#include <grpcpp/support/status.h>

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace stagecoach::rpc {

// The size a status message may take in its trailer (grpc-message, where bytes other than
// printable ASCII are percent-encoded in three): well under gRPC's default 8 KiB metadata limit,
// which a longer message would exceed, leaving the client with only "received initial metadata
// size exceeds limit".
inline constexpr size_t kMaxEncodedErrorBytes = 6000;

// `message` if its encoded size fits `max_encoded`, else its first lines (errors are one per
// line; a line too long is cut at a UTF-8 boundary and marked "...") followed by
// "... and K more errors (N bytes in all)" within that size.
std::string SummarizeErrorMessage(absl::string_view message,
                                  size_t max_encoded = kMaxEncodedErrorBytes);

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// A failed client call as an absl::Status with the same code and a message saying which call
// on which peer failed: "<call> on <peer>: <message>". OK stays OK.
absl::Status CallError(const grpc::Status& status, absl::string_view call, absl::string_view peer);

}  // namespace stagecoach::rpc
