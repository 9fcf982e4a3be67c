// The gRPC adapter of WorkerService over the TaskManager.
#pragma once

#include "stagecoach/v1/worker.grpc.pb.h"
#include "worker/service/task_manager.h"

namespace stagecoach::worker {

class WorkerServiceImpl final : public v1::WorkerService::Service {
 public:
  // How long StopTask waits for the task to wind down.
  static constexpr absl::Duration kStopTimeout = absl::Seconds(8);

  explicit WorkerServiceImpl(TaskManager* tasks) : tasks_(tasks) {}

  grpc::Status StartTask(grpc::ServerContext* ctx, const v1::StartTaskRequest* req,
                         v1::StartTaskResponse* resp) override;
  grpc::Status StopTask(grpc::ServerContext* ctx, const v1::StopTaskRequest* req,
                        v1::StopTaskResponse* resp) override;
  grpc::Status GetWorkerStatus(grpc::ServerContext* ctx, const v1::GetWorkerStatusRequest* req,
                               v1::GetWorkerStatusResponse* resp) override;

 private:
  TaskManager* tasks_;
};

}  // namespace stagecoach::worker
