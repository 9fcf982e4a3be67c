#include "worker/service/worker_service.h"

#include "common/rpc/status_conversion.h"

namespace stagecoach::worker {

grpc::Status WorkerServiceImpl::StartTask(grpc::ServerContext*, const v1::StartTaskRequest* req,
                                          v1::StartTaskResponse*) {
  return rpc::ToGrpcStatus(tasks_->Start(req->assignment()));
}

grpc::Status WorkerServiceImpl::StopTask(grpc::ServerContext*, const v1::StopTaskRequest* req,
                                         v1::StopTaskResponse*) {
  if (req->job_id().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "job_id: required");
  }
  return rpc::ToGrpcStatus(tasks_->Stop(req->job_id(), req->reason(), kStopTimeout));
}

grpc::Status WorkerServiceImpl::GetWorkerStatus(grpc::ServerContext*,
                                                const v1::GetWorkerStatusRequest*,
                                                v1::GetWorkerStatusResponse* resp) {
  *resp = tasks_->Status();
  return grpc::Status::OK;
}

}  // namespace stagecoach::worker
