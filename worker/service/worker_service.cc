#include "worker/service/worker_service.h"

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/rpc/status_conversion.h"
#include "common/spec/hf_model_spec.h"
#include "common/spec/spec_parser.h"
#include "worker/runtime/device/compute_threads.h"
#include "worker/runtime/inspect/inspect.h"

namespace stagecoach::worker {
namespace {

// How often a waiting InspectModel call checks whether its caller went away, and the longest it
// waits whatever the caller's deadline.
constexpr absl::Duration kInspectPoll = absl::Milliseconds(100);
constexpr absl::Duration kInspectLimit = absl::Minutes(30);

// `ref` (the value of `field`) resolved to a local path through `resolve`; INVALID_ARGUMENT
// naming the field when it cannot be.
absl::StatusOr<std::string> ResolveRef(const runtime::FileResolver& resolve,
                                       const std::string& field, const std::string& ref) {
  if (!resolve) return ref;
  auto path = resolve(ref);
  if (!path.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": cannot fetch '", ref, "': ", path.status().message()));
  }
  return path;
}

}  // namespace

// One inspection's result, shared by its thread and the call waiting for it.
struct WorkerServiceImpl::Inspection {
  absl::Notification done;
  absl::StatusOr<v1::InspectModelResponse> result;
};

WorkerServiceImpl::~WorkerServiceImpl() {
  absl::MutexLock lock(&inspections_mu_);
  for (auto& [inspection, thread] : inspections_) thread.join();
}

grpc::Status WorkerServiceImpl::InspectModel(grpc::ServerContext* ctx,
                                             const v1::InspectModelRequest* req,
                                             v1::InspectModelResponse* resp) {
  auto parsed = spec::ReadJobSpec(req->spec_yaml(), "spec_yaml");
  if (!parsed.ok()) return rpc::ToGrpcStatus(parsed.status());
  spec::JobSpec spec = *std::move(parsed);
  std::string model_path;
  if (spec.model.torchscript.has_value()) {
    auto path = ResolveRef(options_.resolve_file, "model.torchscript", *spec.model.torchscript);
    if (!path.ok()) return rpc::ToGrpcStatus(path.status());
    model_path = *path;
  }
  if (req->profile() && !spec.data.path.empty()) {
    auto path = ResolveRef(options_.resolve_file, "data.path", spec.data.path);
    if (!path.ok()) return rpc::ToGrpcStatus(path.status());
    spec.data.path = *path;
  }
  const bool on_gpu = spec.placement.device == "cuda" && options_.device.rfind("cuda", 0) == 0;
  const std::string device = on_gpu ? options_.device : "cpu";

  auto inspection = std::make_shared<Inspection>();
  {
    absl::MutexLock lock(&inspections_mu_);
    // Join the threads of inspections that have finished.
    for (auto it = inspections_.begin(); it != inspections_.end();) {
      if (it->first->done.HasBeenNotified()) {
        it->second.join();
        it = inspections_.erase(it);
      } else {
        ++it;
      }
    }
    inspections_.emplace_back(
        inspection,
        std::thread([inspection, spec, model_path, device, profile = req->profile(),
                     iterations = req->profile_iterations(), threads = options_.compute_threads] {
          if (threads > 0) runtime::UseComputeThreads(threads);
          inspection->result = model::InspectModel(spec, profile, iterations, model_path, device);
          inspection->done.Notify();
        }));
  }
  const absl::Time give_up = absl::Now() + kInspectLimit;
  while (!inspection->done.WaitForNotificationWithTimeout(kInspectPoll)) {
    if (ctx->IsCancelled()) {
      return grpc::Status(grpc::StatusCode::CANCELLED,
                          "InspectModel: the caller went away (deadline or cancellation) before "
                          "the inspection finished");
    }
    if (absl::Now() > give_up) {
      return grpc::Status(
          grpc::StatusCode::DEADLINE_EXCEEDED,
          absl::StrCat("InspectModel: no result within ", absl::FormatDuration(kInspectLimit)));
    }
  }
  if (!inspection->result.ok()) return rpc::ToGrpcStatus(inspection->result.status());
  *resp = *std::move(inspection->result);
  return grpc::Status::OK;
}

grpc::Status WorkerServiceImpl::StartTask(grpc::ServerContext* ctx, const v1::StartTaskRequest* req,
                                          v1::StartTaskResponse*) {
  return rpc::ToGrpcStatus(tasks_->Start(req->assignment()));
}

grpc::Status WorkerServiceImpl::StopTask(grpc::ServerContext* ctx, const v1::StopTaskRequest* req,
                                         v1::StopTaskResponse*) {
  if (req->job_id().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "job_id: required");
  }
  return rpc::ToGrpcStatus(tasks_->Stop(req->job_id(), req->reason(), kStopTimeout));
}

grpc::Status WorkerServiceImpl::GetWorkerStatus(grpc::ServerContext* ctx,
                                                const v1::GetWorkerStatusRequest*,
                                                v1::GetWorkerStatusResponse* resp) {
  *resp = tasks_->Status();
  return grpc::Status::OK;
}

grpc::Status WorkerServiceImpl::RequestCheckpoint(grpc::ServerContext* ctx,
                                                  const v1::RequestCheckpointRequest* req,
                                                  v1::RequestCheckpointResponse*) {
  if (req->job_id().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "job_id: required");
  }
  if (req->step() < 1) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "step: must be >= 1 (steps of the job's timeline)");
  }
  return rpc::ToGrpcStatus(tasks_->RequestCheckpoint(req->job_id(), req->step()));
}

grpc::Status WorkerServiceImpl::ControlTask(grpc::ServerContext* ctx,
                                            const v1::ControlTaskRequest* req,
                                            v1::ControlTaskResponse* resp) {
  if (req->job_id().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "job_id: required");
  }
  if (req->attempt() < 1) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("attempt: must be >= 1, got ", req->attempt()));
  }
  auto controlled = tasks_->Control(*req);
  if (!controlled.ok()) return rpc::ToGrpcStatus(controlled.status());
  *resp = *std::move(controlled);
  return grpc::Status::OK;
}

grpc::Status WorkerServiceImpl::Decode(grpc::ServerContext* ctx, const v1::DecodeRequest* req,
                                       v1::DecodeResponse* resp) {
  (void)ctx;
  if (req->job_id().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "job_id: required");
  }
  if (req->attempt() < 1) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("attempt: must be >= 1, got ", req->attempt()));
  }
  if (req->session().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "session: required");
  }
  auto decoded = tasks_->Decode(*req);
  if (!decoded.ok()) return rpc::ToGrpcStatus(decoded.status());
  *resp = *std::move(decoded);
  return grpc::Status::OK;
}

}  // namespace stagecoach::worker
