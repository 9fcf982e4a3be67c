#include "coordinator/service/generation_service.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/rpc/status_conversion.h"
#include "common/rpc/time_conversion.h"
#include "coordinator/service/coordinator_service.h"

namespace stagecoach::coordinator {

grpc::Status GenerationServiceImpl::Generate(grpc::ServerContext* ctx,
                                             const v1::GenerateRequest* req,
                                             grpc::ServerWriter<v1::GenerateResponse>* writer) {
  if (req->job_id().empty() || req->job_id().size() > CoordinatorServiceImpl::kMaxIdBytes) {
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("job_id: required, at most ", CoordinatorServiceImpl::kMaxIdBytes, " bytes"));
  }
  absl::Duration timeout = rpc::FromProtoDuration(req->timeout());
  if (timeout < absl::ZeroDuration()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "timeout: must not be negative");
  }
  if (timeout == absl::ZeroDuration()) timeout = kDefaultTimeout;
  timeout = std::min(timeout, kMaxTimeout);
  const absl::Status done = generation_->Generate(
      *req, timeout, [ctx] { return ctx->IsCancelled(); },
      [writer](const v1::GenerateResponse& message) { return writer->Write(message); });
  return rpc::ToGrpcStatus(done);
}

}  // namespace stagecoach::coordinator
