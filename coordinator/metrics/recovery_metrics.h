// What failures cost, as Prometheus metrics over the coordinator's jobs (docs/recovery.md,
// STYLE.md rule 13; a job's degraded state is CoordinatorMetrics::ReplicaHealth's):
//
//   stagecoach_job_recovery_seconds{kind}  from the first report of a failure to the job's next
//                                          completed step; kind: carry_on (replicas carried
//                                          on), restart (a new attempt from a checkpoint)
//   stagecoach_job_steps_lost_total{kind}  steps done before a failure that had to be run again
//                                          (0 when replicas carry on)
//
// Both kinds are pre-initialised. Thread-safe (prometheus-cpp's own locking).
#pragma once

#include <string>

#include "absl/time/time.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace stagecoach::coordinator {

class RecoveryMetrics {
 public:
  static constexpr const char* kCarryOn = "carry_on";
  static constexpr const char* kRestart = "restart";

  // Defines the metrics on `registry`, which must outlive this object.
  explicit RecoveryMetrics(prometheus::Registry& registry);

  // A recovery of `kind` ended with a completed step `took` after the failure was first
  // reported, having lost `steps_lost` steps.
  void Recovered(const std::string& kind, absl::Duration took, int64_t steps_lost);

 private:
  prometheus::Family<prometheus::Histogram>& recovery_;
  prometheus::Family<prometheus::Counter>& steps_lost_;
};

}  // namespace stagecoach::coordinator
