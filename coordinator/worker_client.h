// How the coordinator calls its workers. An interface so that the job manager can be tested
// with fakes and faults injected; GrpcWorkerClient (grpc_worker_client.h) is the real one.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "stagecoach/v1/worker.pb.h"

namespace stagecoach::coordinator {

// Thread-safe: the job manager calls it from several threads at once.
class WorkerClient {
 public:
  virtual ~WorkerClient() = default;

  // WorkerService.StartTask on the worker at `address`, bounded by `timeout`.
  virtual absl::Status StartTask(const std::string& address, const v1::TaskAssignment& task,
                                 absl::Duration timeout) = 0;

  // WorkerService.StopTask.
  virtual absl::Status StopTask(const std::string& address, const std::string& job_id,
                                const std::string& reason, absl::Duration timeout) = 0;

  // WorkerService.GetWorkerStatus: UNAVAILABLE / DEADLINE_EXCEEDED when it cannot be reached.
  virtual absl::StatusOr<v1::GetWorkerStatusResponse> GetStatus(const std::string& address,
                                                                absl::Duration timeout) = 0;
};

}  // namespace stagecoach::coordinator
