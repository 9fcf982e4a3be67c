#include "coordinator/workers/grpc_worker_client.h"

#include "absl/strings/str_cat.h"
#include "common/rpc/channel.h"
#include "common/rpc/status_conversion.h"

namespace stagecoach::coordinator {
v1::WorkerService::Stub* GrpcWorkerClient::Stub(const std::string& address) {
  absl::MutexLock lock(&mu_);
  auto& stub = stubs_[address];
  if (stub == nullptr) stub = v1::WorkerService::NewStub(rpc::MakeChannel(address, security_));
  return stub.get();
}

void GrpcWorkerClient::SetSessionToken(const std::string& address, const std::string& token) {
  absl::MutexLock lock(&mu_);
  if (token.empty()) {
    tokens_.erase(address);
  } else {
    tokens_[address] = token;
  }
}

void GrpcWorkerClient::Prepare(grpc::ClientContext* ctx, const std::string& address,
                               absl::Duration timeout) {
  rpc::SetDeadline(ctx, timeout);
  absl::MutexLock lock(&mu_);
  auto it = tokens_.find(address);
  if (it != tokens_.end()) ctx->AddMetadata("authorization", absl::StrCat("Bearer ", it->second));
}

absl::Status GrpcWorkerClient::StartTask(const std::string& address, const v1::TaskAssignment& task,
                                         absl::Duration timeout) {
  grpc::ClientContext ctx;
  Prepare(&ctx, address, timeout);
  v1::StartTaskRequest request;
  *request.mutable_assignment() = task;
  v1::StartTaskResponse response;
  return rpc::CallError(Stub(address)->StartTask(&ctx, request, &response), "StartTask",
                        absl::StrCat("worker at ", address));
}

absl::Status GrpcWorkerClient::StopTask(const std::string& address, const std::string& job_id,
                                        const std::string& reason, absl::Duration timeout) {
  grpc::ClientContext ctx;
  Prepare(&ctx, address, timeout);
  v1::StopTaskRequest request;
  request.set_job_id(job_id);
  request.set_reason(reason);
  v1::StopTaskResponse response;
  return rpc::CallError(Stub(address)->StopTask(&ctx, request, &response), "StopTask",
                        absl::StrCat("worker at ", address));
}

absl::StatusOr<v1::GetWorkerStatusResponse> GrpcWorkerClient::GetStatus(const std::string& address,
                                                                        absl::Duration timeout) {
  grpc::ClientContext ctx;
  Prepare(&ctx, address, timeout);
  v1::GetWorkerStatusResponse response;
  grpc::Status status = Stub(address)->GetWorkerStatus(&ctx, {}, &response);
  if (!status.ok())
    return rpc::CallError(status, "GetWorkerStatus", absl::StrCat("worker at ", address));
  return response;
}

absl::StatusOr<v1::InspectModelResponse> GrpcWorkerClient::InspectModel(
    const std::string& address, const v1::InspectModelRequest& request, absl::Duration timeout) {
  grpc::ClientContext ctx;
  Prepare(&ctx, address, timeout);
  v1::InspectModelResponse response;
  grpc::Status status = Stub(address)->InspectModel(&ctx, request, &response);
  // The worker's verdict on the spec (INVALID_ARGUMENT naming the field) is passed on as it
  // wrote it; other failures say which call on which worker failed.
  if (status.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
    return rpc::FromGrpcStatus(status);
  }
  if (!status.ok()) {
    return rpc::CallError(status, "InspectModel", absl::StrCat("worker at ", address));
  }
  return response;
}

absl::Status GrpcWorkerClient::RequestCheckpoint(const std::string& address,
                                                 const std::string& job_id, int64_t step,
                                                 absl::Duration timeout) {
  grpc::ClientContext ctx;
  Prepare(&ctx, address, timeout);
  v1::RequestCheckpointRequest request;
  request.set_job_id(job_id);
  request.set_step(step);
  v1::RequestCheckpointResponse response;
  return rpc::CallError(Stub(address)->RequestCheckpoint(&ctx, request, &response),
                        "RequestCheckpoint", absl::StrCat("worker at ", address));
}

absl::StatusOr<v1::ControlTaskResponse> GrpcWorkerClient::ControlTask(
    const std::string& address, const v1::ControlTaskRequest& request, absl::Duration timeout) {
  grpc::ClientContext ctx;
  Prepare(&ctx, address, timeout);
  v1::ControlTaskResponse response;
  grpc::Status status = Stub(address)->ControlTask(&ctx, request, &response);
  if (!status.ok()) {
    return rpc::CallError(status, "ControlTask", absl::StrCat("worker at ", address));
  }
  return response;
}

absl::StatusOr<v1::DecodeResponse> GrpcWorkerClient::Decode(const std::string& address,
                                                            const v1::DecodeRequest& request,
                                                            absl::Duration timeout) {
  grpc::ClientContext ctx;
  Prepare(&ctx, address, timeout);
  v1::DecodeResponse response;
  grpc::Status status = Stub(address)->Decode(&ctx, request, &response);
  if (!status.ok()) return rpc::CallError(status, "Decode", absl::StrCat("worker at ", address));
  return response;
}

}  // namespace stagecoach::coordinator
