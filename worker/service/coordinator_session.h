// Keeps the worker registered with its coordinator: registers (retrying with backoff until the
// coordinator answers), heartbeats at the interval the coordinator asked for, and registers
// again when the coordinator no longer knows the worker (it declared it lost, or restarted) —
// after stopping any task, since the coordinator has failed that task's job by then. Keeps the
// session token of the current registration, which WorkerService requires on every call.
#pragma once

#include <grpcpp/server_context.h>

#include <functional>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/runtime/snapshot/snapshot_store.h"
#include "worker/service/coordinator_client.h"

namespace stagecoach::worker {

// The secret of the current registration (RegisterWorkerResponse.session_token), written by
// the session and checked by WorkerService on every call. Thread-safe.
class SessionToken {
 public:
  // A coordinator may call this worker (StartTask) as soon as it has answered RegisterWorker,
  // before the worker has read the answer: a call that finds no token waits up to
  // `registration_grace` for one.
  explicit SessionToken(absl::Duration registration_grace = absl::Seconds(2))
      : registration_grace_(registration_grace) {}

  // Replaces the token; an empty one refuses every call (not registered).
  void Set(const std::string& token);

  // OK when `ctx` carries "authorization: Bearer <token>" of the current registration;
  // UNAUTHENTICATED "call not from this worker's coordinator (...)" otherwise, and for every
  // call while the worker is not registered (after the registration grace).
  absl::Status Check(const grpc::ServerContext& ctx);

 private:
  const absl::Duration registration_grace_;
  absl::Mutex mu_;
  std::string token_ ABSL_GUARDED_BY(mu_);
};

struct SessionOptions {
  v1::RegisterWorkerRequest registration;
  // Longest pause between registration attempts.
  absl::Duration max_backoff = absl::Seconds(5);
  // Receives each registration's session token (and is cleared when the coordinator forgets
  // the worker). May be null.
  SessionToken* token = nullptr;
  // The worker's in-memory snapshots: each heartbeat says which jobs' it holds, and the answer
  // says which steps to keep (HeartbeatResponse.snapshot_keep_from). May be null.
  runtime::SnapshotStore* snapshots = nullptr;
  // The running task's progress beacon, sent with each heartbeat (HeartbeatRequest.progress);
  // unset (or returning nullopt): none is sent.
  std::function<std::optional<v1::RankProgress>()> progress;
};

// Thread-safe.
class CoordinatorSession {
 public:
  // `current_job` says which job's task runs (empty when idle); `forgotten` is called when the
  // coordinator no longer knows this worker.
  CoordinatorSession(SessionOptions options, CoordinatorClient* client,
                     std::function<std::string()> current_job,
                     std::function<void(const std::string& why)> forgotten);
  // Stops the session thread.
  ~CoordinatorSession();

  void Start();

  // The id of the current registration; empty until registered.
  std::string worker_id();

  // Waits up to `timeout` for the first registration. True when registered.
  bool WaitRegistered(absl::Duration timeout);

 private:
  void Loop();

  const SessionOptions options_;
  CoordinatorClient* client_;
  std::function<std::string()> current_job_;
  std::function<void(const std::string&)> forgotten_;

  absl::Mutex mu_;
  std::string worker_id_ ABSL_GUARDED_BY(mu_);
  // The registration's session token, sent with every heartbeat.
  std::string session_token_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace stagecoach::worker
