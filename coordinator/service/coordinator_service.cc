#include "coordinator/service/coordinator_service.h"

#include <algorithm>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/rpc/address.h"
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

// INVALID_ARGUMENT naming `field` when `value` is longer than `max_bytes`.
grpc::Status Bounded(const std::string& value, const char* field, size_t max_bytes) {
  if (value.size() <= max_bytes) return grpc::Status::OK;
  return grpc::Status(
      grpc::StatusCode::INVALID_ARGUMENT,
      absl::StrCat(field, ": ", value.size(), " bytes, more than the ", max_bytes, " allowed"));
}

// An identifier or name: non-empty, at most `max_bytes`, printable ASCII (no spaces or control
// characters, which would garble logs and tables).
grpc::Status RequiredId(const std::string& value, const char* field,
                        size_t max_bytes = CoordinatorServiceImpl::kMaxIdBytes) {
  if (auto s = Required(value, field); !s.ok()) return s;
  if (auto s = Bounded(value, field, max_bytes); !s.ok()) return s;
  for (char c : value) {
    if (c < 0x21 || c > 0x7e) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat(field, ": must be printable ASCII without spaces"));
    }
  }
  return grpc::Status::OK;
}

}  // namespace

grpc::Status CoordinatorServiceImpl::SubmitJob(grpc::ServerContext* ctx,
                                               const v1::SubmitJobRequest* req,
                                               v1::SubmitJobResponse* resp) {
  if (auto s = Required(req->spec_yaml(), "spec_yaml"); !s.ok()) return s;
  if (auto s = Bounded(req->spec_yaml(), "spec_yaml", kMaxSpecBytes); !s.ok()) return s;
  if (auto s = Bounded(req->spec_origin(), "spec_origin", kMaxNameBytes); !s.ok()) return s;
  auto id =
      jobs_->SubmitJob(req->spec_yaml(), req->spec_origin().empty() ? "spec" : req->spec_origin(),
                       req->start_paused(), [ctx] { return ctx->IsCancelled(); });
  if (!id.ok()) return ToGrpcStatus(id.status());
  resp->set_job_id(*id);
  return grpc::Status::OK;
}

grpc::Status CoordinatorServiceImpl::PlanSpec(grpc::ServerContext* ctx,
                                              const v1::PlanSpecRequest* req,
                                              v1::PlanSpecResponse* resp) {
  if (auto s = Required(req->spec_yaml(), "spec_yaml"); !s.ok()) return s;
  if (auto s = Bounded(req->spec_yaml(), "spec_yaml", kMaxSpecBytes); !s.ok()) return s;
  if (auto s = Bounded(req->spec_origin(), "spec_origin", kMaxNameBytes); !s.ok()) return s;
  if (req->memory_limit_bytes() < 0) {
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("memory_limit_bytes must not be negative, got ", req->memory_limit_bytes()));
  }
  auto searched =
      jobs_->SearchPlans(req->spec_yaml(), req->spec_origin().empty() ? "spec" : req->spec_origin(),
                         req->memory_limit_bytes(), [ctx] { return ctx->IsCancelled(); });
  if (!searched.ok()) return ToGrpcStatus(searched.status());
  for (v1::PlanCandidate& c : searched->result.candidates) *resp->add_candidates() = std::move(c);
  resp->set_memory_limit_bytes(searched->result.memory_limit_bytes);
  if (!searched->profiles.empty()) {
    // The profile at the largest microbatch (fewest microbatches), as measured.
    const LayerProfile* largest = &searched->profiles.front();
    for (const LayerProfile& p : searched->profiles) {
      if (p.rows > largest->rows) largest = &p;
    }
    for (const v1::LayerInfo& layer : largest->layers) *resp->add_layers() = layer;
  }
  resp->set_profiled_by(searched->profiled_by);
  return grpc::Status::OK;
}

grpc::Status CoordinatorServiceImpl::DescribeModel(grpc::ServerContext*,
                                                   const v1::DescribeModelRequest* req,
                                                   v1::DescribeModelResponse* resp) {
  if (auto s = Required(req->torchscript(), "torchscript"); !s.ok()) return s;
  if (auto s = Bounded(req->torchscript(), "torchscript", kMaxPathBytes); !s.ok()) return s;
  if (auto s = Bounded(req->device(), "device", kMaxNameBytes); !s.ok()) return s;
  auto described = jobs_->DescribeModel(req->torchscript(), req->device());
  if (!described.ok()) return ToGrpcStatus(described.status());
  *resp = std::move(*described);
  return grpc::Status::OK;
}

grpc::Status CoordinatorServiceImpl::GetJob(grpc::ServerContext* ctx, const v1::GetJobRequest* req,
                                            v1::GetJobResponse* resp) {
  if (auto s = RequiredId(req->job_id(), "job_id"); !s.ok()) return s;
  if (req->history_from() < 0 || req->history_limit() < 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("history_from and history_limit must not be negative, got ",
                                     req->history_from(), " and ", req->history_limit()));
  }
  HistoryWindow window = HistoryWindow::Summary();
  if (req->history_all()) {
    window = HistoryWindow::All();
  } else if (req->history_limit() > 0) {
    window = HistoryWindow::Page(req->history_from(), req->history_limit());
  }
  auto job = jobs_->GetJob(req->job_id(), window);
  if (!job.ok()) return ToGrpcStatus(job.status());
  *resp->mutable_job() = *std::move(job);
  return grpc::Status::OK;
}

grpc::Status CoordinatorServiceImpl::ListJobs(grpc::ServerContext* ctx,
                                              const v1::ListJobsRequest* req,
                                              v1::ListJobsResponse* resp) {
  if (auto s = Bounded(req->page_token(), "page_token", kMaxIdBytes); !s.ok()) return s;
  auto page = jobs_->ListJobs(req->page_size(), req->page_token());
  if (!page.ok()) return ToGrpcStatus(page.status());
  for (auto& job : page->jobs) *resp->add_jobs() = std::move(job);
  resp->set_next_page_token(page->next_page_token);
  return grpc::Status::OK;
}

grpc::Status CoordinatorServiceImpl::WatchJob(grpc::ServerContext* ctx,
                                              const v1::WatchJobRequest* req,
                                              grpc::ServerWriter<v1::JobEvent>* writer) {
  if (auto s = RequiredId(req->job_id(), "job_id"); !s.ok()) return s;
  int64_t next = std::max<int64_t>(req->from_sequence(), 0);
  while (!ctx->IsCancelled()) {
    auto batch = jobs_->WaitForEvents(req->job_id(), next, kWatchPoll);
    if (!batch.ok()) return ToGrpcStatus(batch.status());
    if (batch->dropped_to > batch->dropped_from) {
      v1::JobEvent dropped;
      dropped.set_job_id(req->job_id());
      dropped.set_sequence(batch->dropped_to - 1);
      dropped.mutable_events_dropped()->set_from_sequence(batch->dropped_from);
      dropped.mutable_events_dropped()->set_to_sequence(batch->dropped_to);
      if (!writer->Write(dropped)) return grpc::Status::OK;
      next = batch->dropped_to;
    }
    for (const v1::JobEvent& event : batch->events) {
      if (!writer->Write(event)) return grpc::Status::OK;  // client went away
      next = event.sequence() + 1;
    }
    if (batch->ended) return grpc::Status::OK;
  }
  return grpc::Status::OK;
}

grpc::Status CoordinatorServiceImpl::CancelJob(grpc::ServerContext* ctx,
                                               const v1::CancelJobRequest* req,
                                               v1::CancelJobResponse* resp) {
  if (auto s = Bounded(req->reason(), "reason", kMaxTextBytes); !s.ok()) return s;
  if (auto s = RequiredId(req->job_id(), "job_id"); !s.ok()) return s;
  auto job = jobs_->CancelJob(req->job_id(), req->reason());
  if (!job.ok()) return ToGrpcStatus(job.status());
  *resp->mutable_job() = *std::move(job);
  return grpc::Status::OK;
}

grpc::Status CoordinatorServiceImpl::CheckpointJob(grpc::ServerContext* ctx,
                                                   const v1::CheckpointJobRequest* req,
                                                   v1::CheckpointJobResponse* resp) {
  if (auto s = RequiredId(req->job_id(), "job_id"); !s.ok()) return s;
  auto checkpoint = jobs_->CheckpointJob(req->job_id());
  if (!checkpoint.ok()) return ToGrpcStatus(checkpoint.status());
  *resp = *std::move(checkpoint);
  return grpc::Status::OK;
}

grpc::Status CoordinatorServiceImpl::ListWorkers(grpc::ServerContext* ctx,
                                                 const v1::ListWorkersRequest*,
                                                 v1::ListWorkersResponse* resp) {
  for (auto& w : jobs_->ListWorkers()) *resp->add_workers() = std::move(w);
  return grpc::Status::OK;
}

grpc::Status CoordinatorServiceImpl::Infer(grpc::ServerContext* ctx, const v1::InferRequest* req,
                                           v1::InferResponse* resp) {
  if (auto s = Required(req->spec_yaml(), "spec_yaml"); !s.ok()) return s;
  if (auto s = Bounded(req->spec_yaml(), "spec_yaml", kMaxSpecBytes); !s.ok()) return s;
  if (auto s = Bounded(req->spec_origin(), "spec_origin", kMaxNameBytes); !s.ok()) return s;
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

grpc::Status CoordinatorServiceImpl::PauseJob(grpc::ServerContext* ctx,
                                              const v1::PauseJobRequest* req,
                                              v1::PauseJobResponse* resp) {
  if (auto s = RequiredId(req->job_id(), "job_id"); !s.ok()) return s;
  auto out = jobs_->PauseJob(req->job_id(), [ctx] { return ctx->IsCancelled(); });
  if (!out.ok()) return ToGrpcStatus(out.status());
  *resp = *std::move(out);
  return grpc::Status::OK;
}

grpc::Status CoordinatorServiceImpl::ResumeJob(grpc::ServerContext* ctx,
                                               const v1::ResumeJobRequest* req,
                                               v1::ResumeJobResponse* resp) {
  if (auto s = RequiredId(req->job_id(), "job_id"); !s.ok()) return s;
  auto job = jobs_->ResumeJob(req->job_id());
  if (!job.ok()) return ToGrpcStatus(job.status());
  *resp->mutable_job() = *std::move(job);
  return grpc::Status::OK;
}

grpc::Status CoordinatorServiceImpl::RunSteps(grpc::ServerContext* ctx,
                                              const v1::RunStepsRequest* req,
                                              v1::RunStepsResponse* resp) {
  if (auto s = RequiredId(req->job_id(), "job_id"); !s.ok()) return s;
  if (req->steps() < 1) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("steps: must be >= 1, got ", req->steps()));
  }
  auto out = jobs_->RunSteps(req->job_id(), req->steps());
  if (!out.ok()) return ToGrpcStatus(out.status());
  *resp = *std::move(out);
  return grpc::Status::OK;
}

grpc::Status CoordinatorServiceImpl::StepJob(grpc::ServerContext* ctx,
                                             const v1::StepJobRequest* req,
                                             v1::StepJobResponse* resp) {
  if (auto s = RequiredId(req->job_id(), "job_id"); !s.ok()) return s;
  absl::Duration timeout = rpc::FromProtoDuration(req->timeout());
  if (timeout < absl::ZeroDuration()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "timeout: must not be negative");
  }
  if (timeout == absl::ZeroDuration()) timeout = kDefaultStepTimeout;
  timeout = std::min(timeout, kMaxStepTimeout);
  auto out = jobs_->StepJob(*req, timeout, [ctx] { return ctx->IsCancelled(); });
  if (!out.ok()) return ToGrpcStatus(out.status());
  *resp = *std::move(out);
  return grpc::Status::OK;
}

grpc::Status CoordinatorServiceImpl::GetJobSchedule(grpc::ServerContext* ctx,
                                                    const v1::GetJobScheduleRequest* req,
                                                    v1::GetJobScheduleResponse* resp) {
  if (auto s = RequiredId(req->job_id(), "job_id"); !s.ok()) return s;
  auto out = jobs_->GetJobSchedule(req->job_id());
  if (!out.ok()) return ToGrpcStatus(out.status());
  *resp = *std::move(out);
  return grpc::Status::OK;
}

grpc::Status CoordinatorServiceImpl::GetStepTrace(grpc::ServerContext* ctx,
                                                  const v1::GetStepTraceRequest* req,
                                                  v1::GetStepTraceResponse* resp) {
  if (auto s = RequiredId(req->job_id(), "job_id"); !s.ok()) return s;
  if (req->global_step() < -1) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("global_step: must be a step number or -1 (latest), got ",
                                     req->global_step()));
  }
  auto out = jobs_->GetStepTrace(req->job_id(), req->global_step());
  if (!out.ok()) return ToGrpcStatus(out.status());
  *resp = *std::move(out);
  return grpc::Status::OK;
}

grpc::Status CoordinatorServiceImpl::DiagnoseJob(grpc::ServerContext* ctx,
                                                 const v1::DiagnoseJobRequest* req,
                                                 v1::DiagnoseJobResponse* resp) {
  if (auto s = RequiredId(req->job_id(), "job_id"); !s.ok()) return s;
  auto out = jobs_->DiagnoseJob(req->job_id());
  if (!out.ok()) return ToGrpcStatus(out.status());
  *resp = *std::move(out);
  return grpc::Status::OK;
}

grpc::Status CoordinatorServiceImpl::RegisterWorker(grpc::ServerContext* ctx,
                                                    const v1::RegisterWorkerRequest* req,
                                                    v1::RegisterWorkerResponse* resp) {
  if (auto s = Required(req->name(), "name"); !s.ok()) return s;
  if (auto s = Bounded(req->name(), "name", kMaxNameBytes); !s.ok()) return s;
  if (auto s = RequiredId(req->address(), "address", kMaxAddressBytes); !s.ok()) return s;
  if (auto address = rpc::ParseHostPort(req->address(), "address"); !address.ok()) {
    return ToGrpcStatus(absl::InvalidArgumentError(address.status().message()));
  }
  if (auto s = Bounded(req->device(), "device", kMaxNameBytes); !s.ok()) return s;
  if (req->transports_size() > 64) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("transports: ", req->transports_size(), " given, at most 64"));
  }
  for (const std::string& t : req->transports()) {
    if (auto s = RequiredId(t, "transports[]", kMaxNameBytes); !s.ok()) return s;
  }
  auto out = jobs_->RegisterWorker(*req);
  if (!out.ok()) return ToGrpcStatus(out.status());
  *resp = *std::move(out);
  return grpc::Status::OK;
}

grpc::Status CoordinatorServiceImpl::Heartbeat(grpc::ServerContext* ctx,
                                               const v1::HeartbeatRequest* req,
                                               v1::HeartbeatResponse* resp) {
  if (auto s = Bounded(req->job_id(), "job_id", kMaxIdBytes); !s.ok()) return s;
  if (auto s = RequiredId(req->worker_id(), "worker_id"); !s.ok()) return s;
  for (const std::string& job : req->snapshot_jobs()) {
    if (auto s = RequiredId(job, "snapshot_jobs[]"); !s.ok()) return s;
  }
  absl::StatusOr<v1::HeartbeatResponse> answer = jobs_->Heartbeat(*req);
  if (!answer.ok()) return ToGrpcStatus(answer.status());
  *resp = *std::move(answer);
  return grpc::Status::OK;
}

grpc::Status CoordinatorServiceImpl::ReportSnapshot(grpc::ServerContext* ctx,
                                                    const v1::ReportSnapshotRequest* req,
                                                    v1::ReportSnapshotResponse*) {
  if (auto s = RequiredId(req->job_id(), "job_id"); !s.ok()) return s;
  if (auto s = RequiredId(req->worker_id(), "worker_id"); !s.ok()) return s;
  return ToGrpcStatus(jobs_->ReportSnapshot(*req));
}

grpc::Status CoordinatorServiceImpl::ReportStep(grpc::ServerContext* ctx,
                                                const v1::ReportStepRequest* req,
                                                v1::ReportStepResponse*) {
  if (auto s = RequiredId(req->job_id(), "job_id"); !s.ok()) return s;
  return ToGrpcStatus(jobs_->ReportStep(*req));
}

grpc::Status CoordinatorServiceImpl::ReportTaskEnd(grpc::ServerContext* ctx,
                                                   const v1::ReportTaskEndRequest* req,
                                                   v1::ReportTaskEndResponse*) {
  if (auto s = RequiredId(req->job_id(), "job_id"); !s.ok()) return s;
  return ToGrpcStatus(jobs_->ReportTaskEnd(*req));
}

grpc::Status CoordinatorServiceImpl::SettleStep(grpc::ServerContext* ctx,
                                                const v1::SettleStepRequest* req,
                                                v1::SettleStepResponse* resp) {
  if (auto s = RequiredId(req->job_id(), "job_id"); !s.ok()) return s;
  absl::StatusOr<v1::SettleStepResponse> settled = jobs_->SettleStep(*req);
  if (!settled.ok()) return ToGrpcStatus(settled.status());
  *resp = *std::move(settled);
  return grpc::Status::OK;
}

grpc::Status CoordinatorServiceImpl::SetKey(grpc::ServerContext* ctx, const v1::SetKeyRequest* req,
                                            v1::SetKeyResponse*) {
  if (auto s = RequiredId(req->key(), "key", kMaxKeyBytes); !s.ok()) return s;
  return ToGrpcStatus(kv_->Set(req->key(), req->value()));
}

grpc::Status CoordinatorServiceImpl::GetKey(grpc::ServerContext* ctx, const v1::GetKeyRequest* req,
                                            v1::GetKeyResponse* resp) {
  if (auto s = RequiredId(req->key(), "key", kMaxKeyBytes); !s.ok()) return s;
  auto value = kv_->Get(req->key(), ClampWait(req->wait()));
  if (!value.ok()) return ToGrpcStatus(value.status());
  resp->set_value(*std::move(value));
  return grpc::Status::OK;
}

grpc::Status CoordinatorServiceImpl::WaitKeys(grpc::ServerContext* ctx,
                                              const v1::WaitKeysRequest* req,
                                              v1::WaitKeysResponse*) {
  for (const std::string& key : req->keys()) {
    if (auto s = RequiredId(key, "keys[]", kMaxKeyBytes); !s.ok()) return s;
  }
  return ToGrpcStatus(kv_->Wait({req->keys().begin(), req->keys().end()}, ClampWait(req->wait())));
}

grpc::Status CoordinatorServiceImpl::UploadArtifact(
    grpc::ServerContext* ctx, grpc::ServerReader<v1::UploadArtifactRequest>* reader,
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
  if (auto s = RequiredId(req->artifact_id(), "artifact_id"); !s.ok()) return s;
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
