// Bearer tokens on gRPC calls: reading a token file, and checking a call's
// "authorization: Bearer <token>" metadata in constant time.
#pragma once

#include <grpcpp/server_context.h>

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace stagecoach::rpc {

// Longest token accepted from a file, in bytes.
inline constexpr size_t kMaxTokenBytes = 4096;

// The token in the file `path` named by `flag`, surrounding whitespace trimmed.
// INVALID_ARGUMENT naming the flag and the file when it cannot be read, is empty after trimming,
// is longer than kMaxTokenBytes or holds characters other than printable ASCII.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path, absl::string_view flag);

// Checks `token` as ReadTokenFile checks a file's (for tokens from the environment).
absl::Status ValidateToken(absl::string_view token, absl::string_view where);

// True when `a` equals `b`; the time taken depends on the lengths only, not on where they differ.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

// OK when `ctx` carries "authorization: Bearer <expected>". UNAUTHENTICATED otherwise, with the
// message `what` followed by whether the metadata was missing or wrong (the tokens are never
// echoed). An empty `expected` (no token known yet) refuses every call.
absl::Status CheckBearer(const grpc::ServerContext& ctx, const std::string& expected,
                         absl::string_view what);

}  // namespace stagecoach::rpc
