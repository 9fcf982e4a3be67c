#include "client/message_size.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/rpc/tensor_data.h"
#include "common/util/byte_size.h"

namespace stagecoach::client {

std::optional<std::string> OversizeBatchError(size_t request_bytes, const v1::TensorData& batch,
                                              const std::string& flag, const std::string& path,
                                              const v1::TensorData* targets, int64_t limit) {
  if (static_cast<int64_t>(request_bytes) <= limit) return std::nullopt;
  std::string out = absl::StrCat(flag, ": '", path, "' (", rpc::DescribeTensorData(batch),
                                 ") makes a request of ", util::FormatBytes(request_bytes),
                                 ", over the ", util::FormatBytes(limit),
                                 " one call to the coordinator may carry (gRPC's message limit)");
  const int64_t rows = batch.shape_size() > 0 ? batch.shape(0) : 0;
  const int64_t data = static_cast<int64_t>(batch.data().size()) +
                       (targets != nullptr ? static_cast<int64_t>(targets->data().size()) : 0);
  if (rows > 0 && data > 0) {
    const int64_t per_row = std::max<int64_t>(1, data / rows);
    // What the request holds besides the batch's data, plus room for the fields' framing.
    const int64_t other = static_cast<int64_t>(request_bytes) - data + 64;
    const int64_t fit = std::max<int64_t>(0, (limit - other) / per_row);
    absl::StrAppend(&out, ": split it into batches of at most ", fit, " of its ", rows,
                    " rows, one call each");
  }
  return out;
}

std::optional<std::string> MessageLimitHint(const std::string& grpc_message, int64_t limit) {
  if (!absl::StrContains(grpc_message, "message larger than max")) return std::nullopt;
  return absl::StrCat("a message of this call exceeded the ", util::FormatBytes(limit),
                      " gRPC carries between stagectl and the coordinator (", grpc_message,
                      "); send a smaller batch (its outputs come back in one message too)");
}

}  // namespace stagecoach::client
