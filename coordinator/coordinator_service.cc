#include "coordinator/coordinator_service.h"

#include <algorithm>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/rpc/status_conversion.h"
#include "common/rpc/time_conversion.h"
#include "common/util/logging.h"

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

grpc::Status CoordinatorServiceImpl::CheckpointJob(grpc::ServerContext*,
                                                   const v1::CheckpointJobRequest* req,
                                                   v1::CheckpointJobResponse* resp) {
  if (auto s = Required(req->job_id(), "job_id"); !s.ok()) return s;
  auto checkpoint = jobs_->CheckpointJob(req->job_id());
  if (!checkpoint.ok()) return ToGrpcStatus(checkpoint.status());
  *resp = *std::move(checkpoint);
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

grpc::Status CoordinatorServiceImpl::UploadArtifact(
    grpc::ServerContext*, grpc::ServerReader<v1::UploadArtifactRequest>* reader,
    v1::UploadArtifactResponse* resp) {
  if (artifacts_ == nullptr) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "this coordinator has no artifact store");
  }
  v1::UploadArtifactRequest msg;
  if (!reader->Read(&msg)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "upload: missing header (the stream carried no message)");
  }
  if (!msg.has_header()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "upload: header not first: the first message must carry the header");
  }
  const v1::ArtifactHeader& header = msg.header();
  auto upload = artifacts_->BeginUpload(header.name(), header.size_bytes(), header.sha256());
  if (!upload.ok()) return ToGrpcStatus(upload.status());
  int32_t chunks = 0;
  while (reader->Read(&msg)) {
    if (msg.part_case() != v1::UploadArtifactRequest::kChunk) {
      return grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          absl::StrCat("upload: message ", chunks + 2, " carries ",
                       msg.has_header() ? "a second header (the header comes first, once)"
                                        : "neither header nor chunk"));
    }
    ++chunks;
    if (absl::Status s = (*upload)->Append(msg.chunk()); !s.ok()) return ToGrpcStatus(s);
  }
  auto info = (*upload)->Commit();
  if (!info.ok()) return ToGrpcStatus(info.status());
  resp->set_artifact_id(info->id);
  resp->set_uri(info->uri);
  resp->set_size_bytes(info->size_bytes);
  resp->set_chunks(chunks);
  spdlog::info("stored artifact {} ({}, {} bytes in {} chunks)", info->uri, info->name,
               info->size_bytes, chunks);
  return grpc::Status::OK;
}

grpc::Status CoordinatorServiceImpl::FetchArtifact(
    grpc::ServerContext* ctx, const v1::FetchArtifactRequest* req,
    grpc::ServerWriter<v1::FetchArtifactResponse>* writer) {
  if (artifacts_ == nullptr) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "this coordinator has no artifact store");
  }
  if (auto s = Required(req->artifact_id(), "artifact_id"); !s.ok()) return s;
  auto info = artifacts_->Lookup(req->artifact_id());
  if (!info.ok()) return ToGrpcStatus(info.status());
  std::ifstream in(info->path, std::ios::binary);
  if (!in) {
    return grpc::Status(grpc::StatusCode::INTERNAL,
                        absl::StrCat("artifact ", info->id, ": cannot open ", info->path));
  }
  v1::FetchArtifactResponse msg;
  v1::ArtifactHeader* header = msg.mutable_header();
  header->set_name(info->name);
  header->set_size_bytes(info->size_bytes);
  header->set_sha256(info->id);
  if (!writer->Write(msg)) return grpc::Status::OK;  // client went away
  std::string buffer(kArtifactChunkBytes, '\0');
  int64_t sent = 0;
  while (sent < info->size_bytes) {
    if (ctx->IsCancelled()) return grpc::Status::OK;
    const int64_t want = std::min<int64_t>(kArtifactChunkBytes, info->size_bytes - sent);
    in.read(buffer.data(), want);
    if (in.gcount() != want) {
      return grpc::Status(grpc::StatusCode::INTERNAL,
                          absl::StrCat("artifact ", info->id, ": read ", sent + in.gcount(), " of ",
                                       info->size_bytes, " bytes of ", info->path));
    }
    msg.set_chunk(buffer.data(), static_cast<size_t>(want));
    if (!writer->Write(msg)) return grpc::Status::OK;
    sent += want;
  }
  return grpc::Status::OK;
}

}  // namespace stagecoach::coordinator
