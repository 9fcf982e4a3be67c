// How the coordinator calls its workers. An interface so that the job manager can be tested
// with fakes and faults injected; GrpcWorkerClient (grpc_worker_client.h) is the real one.
#pragma once

#include <cstdint>
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

  // WorkerService.InspectModel: the model's ordered layers (with their measured forward and
  // backward times when `request.profile`), bounded by `timeout`. The worker's own errors come
  // back with their code (INVALID_ARGUMENT naming the spec field for a model it cannot load);
  // UNAVAILABLE / DEADLINE_EXCEEDED when it cannot be reached in time.
  virtual absl::StatusOr<v1::InspectModelResponse> InspectModel(
      const std::string& address, const v1::InspectModelRequest& request,
      absl::Duration timeout) = 0;

  // WorkerService.RequestCheckpoint: asks the worker's task of `job_id` to write a checkpoint
  // after the step that brings the job's timeline to `step` steps, bounded by `timeout`.
  // FAILED_PRECONDITION when the task has already passed that step or runs another job.
  virtual absl::Status RequestCheckpoint(const std::string& address, const std::string& job_id,
                                         int64_t step, absl::Duration timeout) = 0;

  // WorkerService.ControlTask: steers the worker's task at step boundaries (step limit, finish,
  // checkpoint steps, a client batch step), bounded by `timeout`. FAILED_PRECONDITION when the
  // task has already passed the step limit, holds at another step than a client step's, or runs
  // another job or attempt.
  virtual absl::StatusOr<v1::ControlTaskResponse> ControlTask(
      const std::string& address, const v1::ControlTaskRequest& request,
      absl::Duration timeout) = 0;

  // WorkerService.Decode: a generation session's decoding step on one stage of the worker's
  // held task (or the session's end there), bounded by `timeout`. Fakes that run no tasks
  // inherit UNIMPLEMENTED.
  virtual absl::StatusOr<v1::DecodeResponse> Decode(const std::string& address,
                                                    const v1::DecodeRequest& request,
                                                    absl::Duration timeout) {
    (void)address;
    (void)request;
    (void)timeout;
    return absl::UnimplementedError("this worker client cannot decode");
  }

  // The secret of the worker registered at `address` (RegisterWorkerResponse.session_token):
  // sent with every later call to it. Empty forgets it.
  virtual void SetSessionToken(const std::string& address, const std::string& token) = 0;
};

}  // namespace stagecoach::coordinator
