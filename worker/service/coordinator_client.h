// The worker's side of CoordinatorService: registration and heartbeats, progress reports, and
// the rendezvous store the data plane bootstraps through. Every call has a deadline.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/rpc/channel.h"
#include "stagecoach/v1/coordinator.grpc.pb.h"
#include "worker/runtime/task/task_runner.h"
#include "worker/service/artifact_cache.h"
#include "worker/transport/rendezvous_store.h"

namespace stagecoach::worker {

// Thread-safe.
class CoordinatorClient : public runtime::TaskReporter,
                          public transport::RendezvousStore,
                          public ArtifactSource {
 public:
  // Bound on calls that do not wait on purpose.
  static constexpr absl::Duration kCallTimeout = absl::Seconds(10);

  // `security`: TLS credentials for the coordinator and the worker's token for it
  // (--coordinator-token-file), sent on every call; plaintext without a token by default.
  explicit CoordinatorClient(const std::string& address, const rpc::ChannelSecurity& security = {});

  const std::string& address() const { return address_; }

  absl::StatusOr<v1::RegisterWorkerResponse> Register(const v1::RegisterWorkerRequest& req);
  // `request.session_token` is the registration's (RegisterWorkerResponse.session_token).
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request);

  // runtime::TaskReporter
  absl::Status ReportStep(const v1::ReportStepRequest& report) override;
  absl::Status ReportTaskEnd(const v1::ReportTaskEndRequest& report) override;
  // CoordinatorService.SettleStep, bounded by the request's wait plus kCallTimeout.
  absl::StatusOr<v1::SettleStepResponse> SettleStep(const v1::SettleStepRequest& request);
  // CoordinatorService.ReportSnapshot, bounded by kCallTimeout.
  absl::Status ReportSnapshot(const v1::ReportSnapshotRequest& request);

  // transport::RendezvousStore, backed by the coordinator's key-value store.
  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override;
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;

  // ArtifactSource: CoordinatorService.FetchArtifact, bounded by `timeout` as a whole.
  // INVALID_ARGUMENT for a malformed stream (no header first, a second header).
  absl::StatusOr<v1::ArtifactHeader> FetchArtifact(
      const std::string& id, absl::Duration timeout,
      const std::function<absl::Status(absl::string_view chunk)>& on_chunk) override;

 private:
  const std::string address_;
  const std::string peer_;  // "coordinator HOST:PORT", for error messages
  std::unique_ptr<v1::CoordinatorService::Stub> stub_;
};

}  // namespace stagecoach::worker
