// What stagectl says instead of gRPC's "Sent message larger than max (76800291 vs. 67108864)":
// a call to the coordinator carries at most rpc::kMaxMessageBytes (the limit stagectl and the
// daemons set on their channels), so a batch that would make a larger request is refused before
// it is sent, naming the limit and how many rows of it fit. Pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "common/rpc/channel.h"
#include "stagecoach/v1/types.pb.h"

namespace stagecoach::client {

// nullopt when `request_bytes` (the whole request's serialised size, the batch included) is
// within `limit`; otherwise an error naming `flag` and `path` (where the batch came from), the
// batch's shape, the request's size, the limit, and the most rows of this batch one request
// can carry (by the bytes per row of shape[0] of the batch and of `targets`, when given: the
// targets of a training step come in the same request).
std::optional<std::string> OversizeBatchError(size_t request_bytes, const v1::TensorData& batch,
                                              const std::string& flag, const std::string& path,
                                              const v1::TensorData* targets = nullptr,
                                              int64_t limit = rpc::kMaxMessageBytes);

// For a call that failed because a message exceeded gRPC's limit on either side (a response
// too large for the client, a request too large for the server): what it means and what to do;
// nullopt for any other failure.
std::optional<std::string> MessageLimitHint(const std::string& grpc_message,
                                            int64_t limit = rpc::kMaxMessageBytes);

}  // namespace stagecoach::client
