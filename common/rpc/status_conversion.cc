#include "common/rpc/status_conversion.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace stagecoach::rpc {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

absl::Status CallError(const grpc::Status& status, absl::string_view call, absl::string_view peer) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat(call, " on ", peer, ": ", status.error_message()));
}

}  // namespace stagecoach::rpc
