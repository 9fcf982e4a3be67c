// The coordinator's view of its workers: who is registered, alive (holding a lease renewed by
// heartbeats), idle or busy with which job and rank.
//
//   RegisterWorker --> IDLE <--(1)--> BUSY        (1) Assign / Release
//                        \             /
//                         (2)-> LOST <-(2)        (2) lease expired, or found unreachable
//
// A LOST worker stays listed (with the reason) until a worker registers again at its address;
// its heartbeats are refused with NOT_FOUND so that it registers again under a new id.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "stagecoach/v1/types.pb.h"

namespace stagecoach::coordinator {

struct WorkerRecord {
  std::string id;       // "w-<n>", assigned at registration
  std::string name;     // as the worker calls itself
  std::string address;  // its WorkerService, host:port
  std::string device;   // "cpu", "cuda:0", ...
  std::vector<std::string> transports;
  v1::WorkerState state = v1::WORKER_STATE_IDLE;
  std::string job_id;  // set while BUSY
  int rank = -1;       // set while BUSY
  absl::Time last_heartbeat;
  std::string reason;  // why LOST
  // An IDLE worker held as a spare for this job (placement.spares): Idle leaves it out for
  // other jobs. Cleared when it is assigned, lost, or the job lets it go.
  std::string reserved_for;
  // Secret of the registration (RegisterWorkerResponse.session_token); heartbeats must carry it.
  std::string session_token;

  void ToProto(v1::WorkerInfo* out) const;
};

// True when a worker on `worker_device` ("cpu", "cuda:1") can run a job placed on
// `placement_device` ("cpu" or "cuda").
bool DeviceMatches(const std::string& placement_device, const std::string& worker_device);

// Thread-safe, with a lock of its own that nothing else is taken under: heartbeats take only this
// lock, so no job work, disk write or remote call ever delays a worker's lease. Callers holding
// the job table's lock may call it (lock order: job table, then registry). Records are returned
// as copies.
//
// Cost: a call on one worker (Register, Heartbeat, Find, LastHeartbeat, Assign, Release,
// MarkLost, Reserve, SetSessionToken) takes constant time whatever the fleet's size; those on
// every worker (Idle, All, Counts, ExpireLeases, Unreserve, AnyBusyWith) are linear.
class WorkerRegistry {
 public:
  explicit WorkerRegistry(absl::Duration lease) : lease_(lease) {}

  absl::Duration lease() const { return lease_; }

  // Adds a worker as IDLE with a fresh lease and returns its id. A LOST entry with the same
  // address is dropped (the worker came back). A live entry with the same address is an
  // ALREADY_EXISTS error: two daemons cannot serve one address.
  absl::StatusOr<std::string> Register(const std::string& name, const std::string& address,
                                       const std::string& device,
                                       const std::vector<std::string>& transports, absl::Time now);

  // Renews the lease. NOT_FOUND for an unknown or LOST worker.
  // NOT_FOUND as well when the worker has a session token and `session_token` differs: the
  // heartbeat comes from another process than the registered one.
  absl::Status Heartbeat(const std::string& id, absl::Time now,
                         const std::string& session_token = "");
  // Records the secret of `id`'s registration (no-op for an unknown id).
  void SetSessionToken(const std::string& id, const std::string& token);

  // Marks every live worker whose lease ran out by `now` as LOST and returns their ids.
  std::vector<std::string> ExpireLeases(absl::Time now);

  // Marks a worker LOST with `reason`; false (no-op) if unknown or already LOST.
  bool MarkLost(const std::string& id, const std::string& reason);

  // IDLE -> BUSY on (job_id, rank). FAILED_PRECONDITION unless IDLE.
  absl::Status Assign(const std::string& id, const std::string& job_id, int rank);

  // BUSY on `job_id` -> IDLE. No-op when the worker is not busy on that job (e.g. LOST).
  void Release(const std::string& id, const std::string& job_id);

  // Idle workers whose device matches and that offer `transport` ("gloo", "nccl"; a worker
  // that registered no transports offers gloo), in registration order, but those held as
  // spares for a job other than `for_job`; `for_job`'s own spares come first.
  std::vector<WorkerRecord> Idle(const std::string& placement_device, const std::string& transport,
                                 const std::string& for_job = "") const;

  // Holds the IDLE worker `id` as a spare for `job_id` (placement.spares). FAILED_PRECONDITION
  // when it is not idle or is held for another job.
  absl::Status Reserve(const std::string& id, const std::string& job_id);
  // Lets every spare held for `job_id` go.
  void Unreserve(const std::string& job_id);

  // Whether a worker is BUSY on `job_id` (a restarting job waits until none is).
  bool AnyBusyWith(const std::string& job_id) const;

  // nullopt when unknown.
  std::optional<WorkerRecord> Find(const std::string& id) const;
  // When the worker's latest heartbeat (or registration) arrived; InfinitePast for an unknown id.
  absl::Time LastHeartbeat(const std::string& id) const;

  // Every worker, in registration order.
  std::vector<WorkerRecord> All() const;
  // How many workers are in each state (states with none are left out), without copying them.
  std::map<v1::WorkerState, int> Counts() const;

 private:
  WorkerRecord* MutableLocked(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const WorkerRecord* FindLocked(const std::string& id) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const absl::Duration lease_;
  mutable absl::Mutex mu_;
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  // Keyed by registration number so that iteration is in registration order.
  std::map<int64_t, WorkerRecord> workers_ ABSL_GUARDED_BY(mu_);
  // The registration number of each entry of workers_ by its id and by its address (an address
  // has at most one entry: a live one refuses another, a LOST one is dropped by it).
  absl::flat_hash_map<std::string, int64_t> by_id_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int64_t> by_address_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stagecoach::coordinator
