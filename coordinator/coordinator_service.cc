#include "coordinator/coordinator_service.h"

#include <algorithm>

#include "common/rpc/status_conversion.h"
#include "common/rpc/time_conversion.h"

namespace stagecoach::coordinator {
namespace {

using rpc::ToGrpcStatus;

absl::Duration ClampWait(const google::protobuf::Duration& wait) {
  return std::clamp(rpc::FromProtoDuration(wait), absl::ZeroDuration(),
                    CoordinatorServiceImpl::kMaxKvWait);
}

grpc::Status Required(const std::string& value, const char* field) {
  if (!value.empty()) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, std::string(field) + ": required");
}

}  // namespace

grpc::Status CoordinatorServiceImpl::SubmitJob(grpc::ServerContext*,
                                               const v1::SubmitJobRequest* req,
                                               v1::SubmitJobResponse* resp) {
  if (auto s = Required(req->spec_yaml(), "spec_yaml"); !s.ok()) return s;
  auto id =
      jobs_->SubmitJob(req->spec_yaml(), req->spec_origin().empty() ? "spec" : req->spec_origin());
  if (!id.ok()) return ToGrpcStatus(id.status());
  resp->set_job_id(*id);
  return grpc::Status::OK;
}

grpc::Status CoordinatorServiceImpl::GetJob(grpc::ServerContext*, const v1::GetJobRequest* req,
                                            v1::GetJobResponse* resp) {
  if (auto s = Required(req->job_id(), "job_id"); !s.ok()) return s;
  auto job = jobs_->GetJob(req->job_id());
  if (!job.ok()) return ToGrpcStatus(job.status());
  *resp->mutable_job() = *std::move(job);
  return grpc::Status::OK;
}

grpc::Status CoordinatorServiceImpl::ListJobs(grpc::ServerContext*, const v1::ListJobsRequest*,
                                              v1::ListJobsResponse* resp) {
  for (auto& job : jobs_->ListJobs()) *resp->add_jobs() = std::move(job);
  return grpc::Status::OK;
}

grpc::Status CoordinatorServiceImpl::WatchJob(grpc::ServerContext* ctx,
                                              const v1::WatchJobRequest* req,
                                              grpc::ServerWriter<v1::JobEvent>* writer) {
  if (auto s = Required(req->job_id(), "job_id"); !s.ok()) return s;
  int64_t next = std::max<int64_t>(req->from_sequence(), 0);
  while (!ctx->IsCancelled()) {
    auto batch = jobs_->WaitForEvents(req->job_id(), next, kWatchPoll);
    if (!batch.ok()) return ToGrpcStatus(batch.status());
    for (const v1::JobEvent& event : batch->events) {
      if (!writer->Write(event)) return grpc::Status::OK;  // client went away
      next = event.sequence() + 1;
    }
    if (batch->ended) return grpc::Status::OK;
  }
  return grpc::Status::OK;
}

grpc::Status CoordinatorServiceImpl::CancelJob(grpc::ServerContext*,
                                               const v1::CancelJobRequest* req,
                                               v1::CancelJobResponse* resp) {
  if (auto s = Required(req->job_id(), "job_id"); !s.ok()) return s;
  auto job = jobs_->CancelJob(req->job_id(), req->reason());
  if (!job.ok()) return ToGrpcStatus(job.status());
  *resp->mutable_job() = *std::move(job);
  return grpc::Status::OK;
}

grpc::Status CoordinatorServiceImpl::ListWorkers(grpc::ServerContext*,
                                                 const v1::ListWorkersRequest*,
                                                 v1::ListWorkersResponse* resp) {
  for (auto& w : jobs_->ListWorkers()) *resp->add_workers() = std::move(w);
  return grpc::Status::OK;
}

grpc::Status CoordinatorServiceImpl::Infer(grpc::ServerContext* ctx, const v1::InferRequest* req,
                                           v1::InferResponse* resp) {
  if (auto s = Required(req->spec_yaml(), "spec_yaml"); !s.ok()) return s;
  absl::Duration timeout = rpc::FromProtoDuration(req->timeout());
  if (timeout < absl::ZeroDuration()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "timeout: must not be negative");
  }
  if (timeout == absl::ZeroDuration()) timeout = kDefaultInferTimeout;
  timeout = std::min(timeout, kMaxInferTimeout);
  auto result =
      jobs_->Infer(req->spec_yaml(), req->spec_origin().empty() ? "spec" : req->spec_origin(),
                   req->inputs(), timeout, [ctx] { return ctx->IsCancelled(); });
  if (!result.ok()) return ToGrpcStatus(result.status());
  resp->set_job_id(result->job_id);
  *resp->mutable_outputs() = std::move(result->outputs);
  return grpc::Status::OK;
}

grpc::Status CoordinatorServiceImpl::RegisterWorker(grpc::ServerContext*,
                                                    const v1::RegisterWorkerRequest* req,
                                                    v1::RegisterWorkerResponse* resp) {
  auto out = jobs_->RegisterWorker(*req);
  if (!out.ok()) return ToGrpcStatus(out.status());
  *resp = *std::move(out);
  return grpc::Status::OK;
}

grpc::Status CoordinatorServiceImpl::Heartbeat(grpc::ServerContext*,
                                               const v1::HeartbeatRequest* req,
                                               v1::HeartbeatResponse*) {
  if (auto s = Required(req->worker_id(), "worker_id"); !s.ok()) return s;
  return ToGrpcStatus(jobs_->Heartbeat(*req));
}

grpc::Status CoordinatorServiceImpl::ReportStep(grpc::ServerContext*,
                                                const v1::ReportStepRequest* req,
                                                v1::ReportStepResponse*) {
  if (auto s = Required(req->job_id(), "job_id"); !s.ok()) return s;
  return ToGrpcStatus(jobs_->ReportStep(*req));
}

grpc::Status CoordinatorServiceImpl::ReportTaskEnd(grpc::ServerContext*,
                                                   const v1::ReportTaskEndRequest* req,
                                                   v1::ReportTaskEndResponse*) {
  if (auto s = Required(req->job_id(), "job_id"); !s.ok()) return s;
  return ToGrpcStatus(jobs_->ReportTaskEnd(*req));
}

grpc::Status CoordinatorServiceImpl::SetKey(grpc::ServerContext*, const v1::SetKeyRequest* req,
                                            v1::SetKeyResponse*) {
  return ToGrpcStatus(kv_->Set(req->key(), req->value()));
}

grpc::Status CoordinatorServiceImpl::GetKey(grpc::ServerContext*, const v1::GetKeyRequest* req,
                                            v1::GetKeyResponse* resp) {
  if (auto s = Required(req->key(), "key"); !s.ok()) return s;
  auto value = kv_->Get(req->key(), ClampWait(req->wait()));
  if (!value.ok()) return ToGrpcStatus(value.status());
  resp->set_value(*std::move(value));
  return grpc::Status::OK;
}

grpc::Status CoordinatorServiceImpl::WaitKeys(grpc::ServerContext*, const v1::WaitKeysRequest* req,
                                              v1::WaitKeysResponse*) {
  return ToGrpcStatus(kv_->Wait({req->keys().begin(), req->keys().end()}, ClampWait(req->wait())));
}

}  // namespace stagecoach::coordinator
