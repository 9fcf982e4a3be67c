// WorkerClient over gRPC, with one cached channel per worker address.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "common/rpc/channel.h"
#include "coordinator/workers/worker_client.h"
#include "stagecoach/v1/worker.grpc.pb.h"

namespace stagecoach::coordinator {

class GrpcWorkerClient : public WorkerClient {
 public:
  // `security`: TLS credentials (and server name) for every worker channel; plaintext by
  // default. Its bearer_token must be empty: each call carries its worker's session token.
  explicit GrpcWorkerClient(rpc::ChannelSecurity security = {}) : security_(std::move(security)) {
    security_.bearer_token.clear();
  }

  absl::Status StartTask(const std::string& address, const v1::TaskAssignment& task,
                         absl::Duration timeout) override;
  absl::Status StopTask(const std::string& address, const std::string& job_id,
                        const std::string& reason, absl::Duration timeout) override;
  absl::StatusOr<v1::GetWorkerStatusResponse> GetStatus(const std::string& address,
                                                        absl::Duration timeout) override;
  absl::StatusOr<v1::InspectModelResponse> InspectModel(const std::string& address,
                                                        const v1::InspectModelRequest& request,
                                                        absl::Duration timeout) override;
  absl::Status RequestCheckpoint(const std::string& address, const std::string& job_id,
                                 int64_t step, absl::Duration timeout) override;
  absl::StatusOr<v1::ControlTaskResponse> ControlTask(const std::string& address,
                                                      const v1::ControlTaskRequest& request,
                                                      absl::Duration timeout) override;
  absl::StatusOr<v1::DecodeResponse> Decode(const std::string& address,
                                            const v1::DecodeRequest& request,
                                            absl::Duration timeout) override;
  void SetSessionToken(const std::string& address, const std::string& token) override;

 private:
  v1::WorkerService::Stub* Stub(const std::string& address);
  // Sets the deadline and the worker's session token on a call's context.
  void Prepare(grpc::ClientContext* ctx, const std::string& address, absl::Duration timeout);

  rpc::ChannelSecurity security_;
  absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<v1::WorkerService::Stub>> stubs_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> tokens_ ABSL_GUARDED_BY(mu_);  // by address
};

}  // namespace stagecoach::coordinator
