#include "coordinator/service/coordinator_auth.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "common/rpc/auth.h"

namespace stagecoach::coordinator {
namespace {

enum class Caller { kClient, kWorker, kEither };

Caller CallerOf(absl::string_view method) {
  static const std::set<std::string, std::less<>> kWorkerMethods = {
      "RegisterWorker", "Heartbeat", "ReportStep", "ReportTaskEnd", "SettleStep",
      "ReportSnapshot", "SetKey",    "GetKey",     "WaitKeys"};
  if (method == "FetchArtifact") return Caller::kEither;
  return kWorkerMethods.count(method) > 0 ? Caller::kWorker : Caller::kClient;
}

// OK when `token` is not required or the call carries it; `which` names it for the message.
absl::Status NeedsToken(const grpc::ServerContext& ctx, const std::string& token,
                        absl::string_view method, absl::string_view which) {
  if (token.empty()) return absl::OkStatus();
  return rpc::CheckBearer(ctx, token, absl::StrCat(method, ": needs the ", which));
}

constexpr char kClientToken[] =
    "client token (the coordinator's --client-token-file; stagectl --token-file or "
    "$STAGECOACH_TOKEN)";
constexpr char kWorkerToken[] =
    "worker token (the coordinator's --worker-token-file; the worker's "
    "--coordinator-token-file)";

}  // namespace

rpc::CallCheck CoordinatorCallCheck(CoordinatorAuth auth) {
  return [auth = std::move(auth)](const grpc::ServerContext& ctx,
                                  absl::string_view method) -> absl::Status {
    switch (CallerOf(method)) {
      case Caller::kClient:
        return NeedsToken(ctx, auth.client_token, method, kClientToken);
      case Caller::kWorker:
        return NeedsToken(ctx, auth.worker_token, method, kWorkerToken);
      case Caller::kEither:
        // A token that is not required lets anyone in; the other one then adds nothing.
        if (auth.client_token.empty() || auth.worker_token.empty()) return absl::OkStatus();
        if (NeedsToken(ctx, auth.client_token, method, kClientToken).ok() ||
            NeedsToken(ctx, auth.worker_token, method, kWorkerToken).ok()) {
          return absl::OkStatus();
        }
        return absl::UnauthenticatedError(
            absl::StrCat(method,
                         ": needs the worker token (--worker-token-file) or the client token "
                         "(--client-token-file): missing or wrong bearer token"));
    }
    return absl::InternalError("unreachable");
  };
}

}  // namespace stagecoach::coordinator
