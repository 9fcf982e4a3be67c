#include "coordinator/jobs/recovery_metrics.h"

#include "common/metrics/metrics.h"

namespace stagecoach::coordinator {

RecoveryMetrics::RecoveryMetrics(prometheus::Registry& registry)
    : degraded_(prometheus::BuildGauge()
                    .Name("stagecoach_job_degraded")
                    .Help("1 while a replica of the job has left it and the others carry on")
                    .Register(registry)),
      healthy_(prometheus::BuildGauge()
                   .Name("stagecoach_job_healthy_replicas")
                   .Help("Replicas carrying a degraded job")
                   .Register(registry)),
      recovery_(prometheus::BuildHistogram()
                    .Name("stagecoach_job_recovery_seconds")
                    .Help("From the first report of a failure to the job's next completed step")
                    .Register(registry)),
      steps_lost_(prometheus::BuildCounter()
                      .Name("stagecoach_job_steps_lost_total")
                      .Help("Steps done before a failure that had to be run again")
                      .Register(registry)) {
  for (const char* kind : {kCarryOn, kRestart}) {
    recovery_.Add({{"kind", kind}}, metrics::DurationBucketsSeconds());
    steps_lost_.Add({{"kind", kind}});
  }
}

void RecoveryMetrics::Degraded(const std::string& job_id, int healthy, int replicas) {
  degraded_.Add({{"job", job_id}}).Set(healthy < replicas ? 1.0 : 0.0);
  healthy_.Add({{"job", job_id}}).Set(healthy);
}

void RecoveryMetrics::Whole(const std::string& job_id) {
  if (degraded_.Has({{"job", job_id}})) degraded_.Remove(&degraded_.Add({{"job", job_id}}));
  if (healthy_.Has({{"job", job_id}})) healthy_.Remove(&healthy_.Add({{"job", job_id}}));
}

void RecoveryMetrics::Recovered(const std::string& kind, absl::Duration took, int64_t steps_lost) {
  recovery_.Add({{"kind", kind}}, metrics::DurationBucketsSeconds())
      .Observe(absl::ToDoubleSeconds(took));
  steps_lost_.Add({{"kind", kind}}).Increment(static_cast<double>(steps_lost));
}

}  // namespace stagecoach::coordinator
