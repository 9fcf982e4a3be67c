// Where heartbeats leave their ranks' progress beacons, so that a heartbeat never waits for the
// job table's lock. At 4,096 workers with 100 jobs placed, 3,200 beacons a second each took that
// lock, queued behind status calls and placement, and gRPC started a thread for every call that
// waited (bench/fleet_bench.cc, docs/fleet.md).
//
// Post keeps the latest beacon of each (worker, job) with the time it arrived; Take hands over
// every beacon posted since the last Take. The coordinator's tick and DiagnoseJob take them under
// the job table's lock and record those that match the job's current placement, so what
// diagnosis sees is at most one tick old. Thread-safe; Post and Take cost O(1) per beacon.
#pragma once

#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "stagecoach/v1/diagnosis.pb.h"

namespace stagecoach::coordinator {

class ProgressInbox {
 public:
  struct Posted {
    std::string worker_id;
    v1::RankProgress progress;
    absl::Time received;
  };

  void Post(const std::string& worker_id, const v1::RankProgress& progress, absl::Time received);
  // Every beacon posted since the last call (the latest of each worker and job), in no order.
  std::vector<Posted> Take();

 private:
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, Posted> latest_ ABSL_GUARDED_BY(mu_);  // "worker job" keys
};

}  // namespace stagecoach::coordinator
