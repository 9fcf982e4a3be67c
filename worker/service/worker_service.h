// The gRPC adapter of WorkerService over the TaskManager, and of InspectModel over
// model::InspectModel (worker/runtime/inspect/inspect.h). Who may call it is not its concern: the
// worker serves it behind rpc::AuthorizeEveryCall with its coordinator's session token
// (SessionToken::Check), so every call is checked before it reaches a handler.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "stagecoach/v1/worker.grpc.pb.h"
#include "worker/runtime/task/task_runner.h"
#include "worker/service/task_manager.h"

namespace stagecoach::worker {

struct WorkerServiceOptions {
  // Resolves the spec's model.torchscript (and data.path when profiling) for InspectModel, as
  // TaskManagerDeps::resolve_file does for tasks; unset: references are paths.
  runtime::FileResolver resolve_file;
  // The worker's device, "cpu" or "cuda:N": InspectModel profiles a job placed on cuda there
  // (on the CPU when the worker has no GPU, and for cpu jobs).
  std::string device = "cpu";
  // The worker's --threads: an inspection's profiling computes with that many threads (0:
  // LibTorch's own default, left alone).
  int compute_threads = 0;
};

class WorkerServiceImpl final : public v1::WorkerService::Service {
 public:
  // How long StopTask waits for the task to wind down.
  static constexpr absl::Duration kStopTimeout = absl::Seconds(8);

  explicit WorkerServiceImpl(TaskManager* tasks, WorkerServiceOptions options = {})
      : tasks_(tasks), options_(std::move(options)) {}
  // Waits for inspections still running (their callers may have gone).
  ~WorkerServiceImpl() override;

  grpc::Status StartTask(grpc::ServerContext* ctx, const v1::StartTaskRequest* req,
                         v1::StartTaskResponse* resp) override;
  grpc::Status StopTask(grpc::ServerContext* ctx, const v1::StopTaskRequest* req,
                        v1::StopTaskResponse* resp) override;
  grpc::Status GetWorkerStatus(grpc::ServerContext* ctx, const v1::GetWorkerStatusRequest* req,
                               v1::GetWorkerStatusResponse* resp) override;
  grpc::Status RequestCheckpoint(grpc::ServerContext* ctx, const v1::RequestCheckpointRequest* req,
                                 v1::RequestCheckpointResponse* resp) override;
  // TaskManager::Control: steers the running task of the job at step boundaries.
  // INVALID_ARGUMENT for a missing job_id or attempt.
  grpc::Status ControlTask(grpc::ServerContext* ctx, const v1::ControlTaskRequest* req,
                           v1::ControlTaskResponse* resp) override;
  // TaskManager::Decode: a generation session's decoding step on the running task of the job.
  // INVALID_ARGUMENT for a missing job_id, attempt or session.
  grpc::Status Decode(grpc::ServerContext* ctx, const v1::DecodeRequest* req,
                      v1::DecodeResponse* resp) override;
  // Parses the spec, resolves its files and runs model::InspectModel on a thread of its own
  // (no lock held; a running task is not disturbed), while the call waits for it or for the
  // caller to go away (deadline, cancellation). INVALID_ARGUMENT naming the field for a spec,
  // model or data that cannot be inspected.
  grpc::Status InspectModel(grpc::ServerContext* ctx, const v1::InspectModelRequest* req,
                            v1::InspectModelResponse* resp) override;

 private:
  struct Inspection;

  TaskManager* tasks_;
  const WorkerServiceOptions options_;
  absl::Mutex inspections_mu_;
  // Inspections started and not yet joined; finished ones are joined by the next call.
  std::vector<std::pair<std::shared_ptr<Inspection>, std::thread>> inspections_
      ABSL_GUARDED_BY(inspections_mu_);
};

}  // namespace stagecoach::worker
