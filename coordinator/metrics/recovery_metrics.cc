#include "coordinator/metrics/recovery_metrics.h"

#include "common/metrics/metrics.h"

namespace stagecoach::coordinator {

RecoveryMetrics::RecoveryMetrics(prometheus::Registry& registry)
    : recovery_(prometheus::BuildHistogram()
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

void RecoveryMetrics::Recovered(const std::string& kind, absl::Duration took, int64_t steps_lost) {
  recovery_.Add({{"kind", kind}}, metrics::DurationBucketsSeconds())
      .Observe(absl::ToDoubleSeconds(took));
  steps_lost_.Add({{"kind", kind}}).Increment(static_cast<double>(steps_lost));
}

}  // namespace stagecoach::coordinator
