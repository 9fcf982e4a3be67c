#include "coordinator/coordinator_auth.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "common/rpc/auth.h"

namespace stagecoach::coordinator {
namespace {

enum class Caller { kClient, kWorker, kEither };

Caller CallerOf(absl::string_view method) {
  static const std::set<std::string, std::less<>> kWorkerMethods = {
      "RegisterWorker", "Heartbeat", "ReportStep", "ReportTaskEnd", "SetKey", "GetKey", "WaitKeys"};
  if (method == "FetchArtifact") return Caller::kEither;
  return kWorkerMethods.count(method) > 0 ? Caller::kWorker : Caller::kClient;
}

absl::Status NeedsClientToken(const grpc::ServerContext& ctx, const CoordinatorAuth& auth,
                              absl::string_view method) {
  if (auth.client_token.empty()) return absl::OkStatus();
  return rpc::CheckBearer(ctx, auth.client_token,
                          absl::StrCat(method,
                                       ": needs the client token (the coordinator's "
                                       "--client-token-file; stagectl --token-file or "
                                       "$STAGECOACH_TOKEN)"));
}

absl::Status NeedsWorkerToken(const grpc::ServerContext& ctx, const CoordinatorAuth& auth,
                              absl::string_view method) {
  if (auth.worker_token.empty()) return absl::OkStatus();
  return rpc::CheckBearer(ctx, auth.worker_token,
                          absl::StrCat(method,
                                       ": needs the worker token (the coordinator's "
                                       "--worker-token-file; the worker's "
                                       "--coordinator-token-file)"));
}

}  // namespace

rpc::CallCheck CoordinatorCallCheck(CoordinatorAuth auth) {
  return [auth = std::move(auth)](const grpc::ServerContext& ctx,
                                  absl::string_view method) -> absl::Status {
    switch (CallerOf(method)) {
      case Caller::kClient:
        return NeedsClientToken(ctx, auth, method);
      case Caller::kWorker:
        return NeedsWorkerToken(ctx, auth, method);
      case Caller::kEither:
        // A token that is not required lets anyone in; the other one then adds nothing.
        if (auth.client_token.empty() || auth.worker_token.empty()) return absl::OkStatus();
        if (NeedsClientToken(ctx, auth, method).ok()) return absl::OkStatus();
        if (NeedsWorkerToken(ctx, auth, method).ok()) return absl::OkStatus();
        return absl::UnauthenticatedError(
            absl::StrCat(method,
                         ": needs the worker token (--worker-token-file) or the client token "
                         "(--client-token-file): missing or wrong bearer token"));
    }
    return absl::InternalError("unreachable");
  };
}

}  // namespace stagecoach::coordinator
