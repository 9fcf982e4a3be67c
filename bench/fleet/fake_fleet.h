// Simulated workers for bench/fleet_bench: thousands of fakes in one process that speak the
// worker gRPC API to a real coordinator without computing anything.
//
// Each fake registers over CoordinatorService.RegisterWorker with an address of its own,
// 127.10.X.Y:PORT (Linux routes all of 127/8 to loopback), and all of them are served by one
// grpc::Server listening on PORT on every interface: a call is routed to its fake by the
// :authority the coordinator dialled (its advertised address), and refused unless it carries
// that fake's session token, as a real worker refuses it. Heartbeats run on a few threads over
// a few channels, each thread walking its fakes at evenly spread offsets of the interval (a
// timer wheel, not a thread per worker), as asynchronous calls with a deadline.
//
// A fake accepts StartTask when idle and then holds its task (as a job held at its first step)
// until StopTask, or until the bench ends it with EndTasks (ReportTaskEnd SUCCEEDED for every
// rank of the job); while it holds one, its heartbeats carry the job and a progress beacon in
// RANK_PHASE_SETUP, as a real worker's do. InspectModel and Decode are refused.
//
// Thread-safe. Every call to the coordinator has a deadline (Options::rpc_timeout).
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "bench/fleet/latencies.h"
#include "stagecoach/v1/coordinator.grpc.pb.h"
#include "stagecoach/v1/worker.grpc.pb.h"

namespace stagecoach::bench {

struct FakeFleetOptions {
  int workers = 1000;
  std::string coordinator;  // host:port
  // Channels to the coordinator (each its own TCP connection), shared by all fakes.
  int channels = 4;
  // Threads that register the fakes, each with one call in flight.
  int register_threads = 8;
  // Threads that send heartbeats (each walks its share of the fakes once per interval).
  int heartbeat_threads = 2;
  // Deadline of every call to the coordinator.
  absl::Duration rpc_timeout = absl::Seconds(10);
  // A fake holding a task sends a progress beacon with each heartbeat, as a real worker does.
  bool send_progress = true;
};

// What the fakes saw, for the bench's checks.
struct FleetCounters {
  int64_t heartbeats_ok = 0;
  int64_t heartbeats_failed = 0;
  int64_t start_tasks = 0;
  int64_t stop_tasks = 0;
  int64_t refused_calls = 0;  // unknown authority or wrong token
  int busy = 0;               // fakes holding a task now
};

class FakeFleet {
 public:
  // Starts the WorkerService server (no fake registered yet). INTERNAL when it cannot listen.
  static absl::StatusOr<std::unique_ptr<FakeFleet>> Start(const FakeFleetOptions& options);
  ~FakeFleet();  // stops heartbeats, waits for calls in flight (bounded), shuts the server down

  // Registers every fake (each starts heartbeating once registered); returns each
  // registration's latency. The first error stops it.
  absl::StatusOr<Latencies> RegisterAll();

  // Ends the task of every fake holding one of `job_id`: ReportTaskEnd SUCCEEDED, rank by rank.
  absl::Status EndTasks(const std::string& job_id);

  // Heartbeat round trips are recorded while on (the coordinator's answer time under load).
  void RecordHeartbeats(bool on);
  Latencies TakeHeartbeatLatencies();

  FleetCounters Counters() const;
  int port() const { return port_; }
  v1::CoordinatorService::Stub* stub(int i) const { return stubs_[i % stubs_.size()].get(); }
  // A channel of its own for the bench's client calls (submit, status, list), as stagectl would
  // have: a stalled client call then cannot hold up the fakes' heartbeats, nor they it.
  v1::CoordinatorService::Stub* client() const { return client_.get(); }

 private:
  struct Fake;
  class Service;

  explicit FakeFleet(const FakeFleetOptions& options);
  // The fake a call to `authority` (host:port) is for; -1 when none.
  int FakeIndex(absl::string_view authority) const;
  std::string Address(int i) const;
  absl::Status RegisterOne(int i, Latencies& latencies);
  // Waits until `due`; true when the fleet stops meanwhile.
  bool SleepUntil(absl::Time due);
  void HeartbeatLoop(int thread);
  void SendHeartbeat(int i);

  const FakeFleetOptions options_;
  int port_ = 0;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  std::vector<std::unique_ptr<v1::CoordinatorService::Stub>> stubs_;
  std::unique_ptr<v1::CoordinatorService::Stub> client_;

  mutable absl::Mutex mu_;
  std::vector<Fake> fakes_ ABSL_GUARDED_BY(mu_);
  FleetCounters counters_ ABSL_GUARDED_BY(mu_);
  bool recording_ ABSL_GUARDED_BY(mu_) = false;
  Latencies heartbeat_latencies_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Duration interval_ ABSL_GUARDED_BY(mu_) = absl::Seconds(1);

  std::vector<std::thread> heartbeaters_;
};

}  // namespace stagecoach::bench
