// What failures cost a job, as Prometheus metrics (docs/recovery.md, STYLE.md rule 13):
//
//   stagecoach_job_degraded{job}           1 while a replica of the job has left it and the
//                                          others carry on; the series is removed when the job
//                                          is whole again (a new attempt) or ends
//   stagecoach_job_healthy_replicas{job}   replicas carrying the job meanwhile
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

  // `job_id` carries on with `healthy` of `replicas` replicas.
  void Degraded(const std::string& job_id, int healthy, int replicas);
  // `job_id` is whole again or ended: its degraded series are removed.
  void Whole(const std::string& job_id);
  // A recovery of `kind` ended with a completed step `took` after the failure was first
  // reported, having lost `steps_lost` steps.
  void Recovered(const std::string& kind, absl::Duration took, int64_t steps_lost);

 private:
  prometheus::Family<prometheus::Gauge>& degraded_;
  prometheus::Family<prometheus::Gauge>& healthy_;
  prometheus::Family<prometheus::Histogram>& recovery_;
  prometheus::Family<prometheus::Counter>& steps_lost_;
};

}  // namespace stagecoach::coordinator
