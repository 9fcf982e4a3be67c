// The coordinator's Prometheus metrics (STYLE.md rule 13): jobs and workers by state, completed
// steps, step durations, the last step's loss, throughput and bubble ratios per job, the
// data-plane bytes the workers report, and job restarts. JobManager feeds it
// (JobManagerDeps::metrics); it only records, so tests read it through its registry without HTTP.
//
// Series per job (stagecoach_loss, stagecoach_samples_per_second, stagecoach_bubble_ratio, the
// recipe's learning rate, gradient norm, skipped steps and eval loss) are
// kept for the kMaxJobSeries jobs that completed a step most recently; older jobs' series are
// removed, which bounds the cardinality on a long-lived coordinator.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/metrics/recovery_metrics.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "stagecoach/v1/diagnosis.pb.h"
#include "stagecoach/v1/types.pb.h"

namespace stagecoach::coordinator {

// What one task (rank of a replica) reported of its memory after a completed step
// (ReportStepRequest's held_parameter_bytes, held_gradient_bytes, peak_live_bytes and, with
// placement.shard: parameters, GradientReduction.gather_hidden_ratio).
struct TaskHeldMemory {
  int64_t held_parameter_bytes = 0;
  int64_t held_gradient_bytes = 0;
  int64_t peak_live_bytes = 0;
  std::optional<double> gather_hidden_ratio;
};

// Thread-safe.
class CoordinatorMetrics {
 public:
  // How many jobs keep their per-job series.
  static constexpr int kMaxJobSeries = 64;

  // Defines the metrics on `registry`, which must outlive this object, with every known state
  // pre-initialised to 0 (stagecoach_build_info is the daemon's: metrics::AddBuildInfo).
  explicit CoordinatorMetrics(prometheus::Registry& registry);

  // stagecoach_jobs{state}: jobs per state; states missing from `counts` are set to 0.
  void SetJobCounts(const std::map<v1::JobState, int>& counts);
  // stagecoach_workers{state}: registered workers per state; missing states are set to 0.
  void SetWorkerCounts(const std::map<v1::WorkerState, int>& counts);
  // Every rank of `job_id` reported a step: counts it, observes `step_time` (the slowest
  // rank's), and sets the job's loss (when the job has one: forward-only jobs do not),
  // samples/s and per-rank bubble ratios, labelled {job, rank, replica} (index = task:
  // replica * num_ranks + rank; num_ranks 0 means one replica), and with data-parallel
  // replicas each rank's gradient reduction hidden ratio (stagecoach_grad_reduction_hidden_ratio,
  // same labels and index).
  void StepCompleted(const std::string& job_id, absl::Duration step_time,
                     std::optional<double> loss, double samples_per_second,
                     const std::vector<double>& bubble_ratios,
                     const std::vector<double>& hidden_ratios = {}, int num_ranks = 0);
  // The training recipe of a completed training step of `job_id` (after its StepCompleted):
  // stagecoach_learning_rate{job}, stagecoach_grad_norm{job} (with training.grad_clip),
  // stagecoach_skipped_steps_total{job} (steps skipped for non-finite gradients) and
  // stagecoach_eval_loss{job} (when a validation pass ran after the step).
  void RecipeStep(const std::string& job_id, double learning_rate, std::optional<double> grad_norm,
                  bool skipped, std::optional<double> eval_loss);
  // Token data (data.kind tokens) of a completed step of `job_id` (after its StepCompleted):
  // stagecoach_tokens_per_second{job} (tokens the loss counted per second of step time) and
  // stagecoach_padding_waste{job} (the share of computed positions that were padding).
  void TokenStep(const std::string& job_id, double tokens_per_second, double padding_waste);
  // The measured activation peak of each task of `job_id`'s last completed step
  // (stagecoach_activation_peak_bytes{job, rank, replica}, index = task as for StepCompleted)
  // and the plan's prediction per pipeline rank (stagecoach_predicted_activation_peak_bytes
  // {job, rank}). Call after the step's StepCompleted; an evicted job's series stay gone.
  void RankMemory(const std::string& job_id, const std::vector<int64_t>& measured,
                  const std::vector<int64_t>& predicted, int num_ranks);
  // What each task of `job_id` held after its last completed step (index = task as for
  // StepCompleted): stagecoach_held_parameter_bytes, stagecoach_held_gradient_bytes and
  // stagecoach_peak_live_bytes {job, rank, replica}, and with sharded parameters
  // stagecoach_parameter_gather_hidden_ratio (same labels). Call after the step's
  // StepCompleted; an evicted job's series stay gone.
  void HeldMemory(const std::string& job_id, const std::vector<TaskHeldMemory>& tasks,
                  int num_ranks);
  // A rank's step report: data-plane bytes it sent and received in that step.
  void AddDataPlaneBytes(int64_t sent, int64_t received);
  // A job was restarted from its latest checkpoint (restart.max_restarts allowed it): counts it
  // in stagecoach_job_restarts_total.
  void JobRestarted();
  // The replicas of `job_id` (placement.replicas > 1): stagecoach_job_healthy_replicas{job}
  // and stagecoach_job_degraded{job} (1 while a replica has left the job and the others carry
  // on, docs/recovery.md). Kept with the job's other series (after its StepCompleted: nothing
  // for a job that has none).
  void ReplicaHealth(const std::string& job_id, int healthy, int replicas);
  // The diagnosis of `job_id` (coordinator/diagnosis/): stagecoach_job_stalled{job} (1 while the
  // job is STALLED) and, for each rank with peers of the same work, stagecoach_rank_pace{job,
  // rank, replica} (its compute over its peers' median, over the straggler window) and
  // stagecoach_rank_straggling{job, rank, replica} (1 while it straggles). Kept with the job's
  // other series (nothing for a job that has none yet: before its first completed step).
  void Diagnosis(const std::string& job_id, bool stalled, const std::vector<v1::RankPace>& pace);
  // What failures cost (recovery_metrics.h).
  RecoveryMetrics& recovery() { return recovery_; }

  // The label value of a state: its enum name without the prefix, lower case ("running").
  static std::string StateLabel(v1::JobState state);
  static std::string StateLabel(v1::WorkerState state);

 private:
  struct JobSeries {
    prometheus::Gauge* loss = nullptr;  // null until the job reports a loss
    prometheus::Gauge* samples_per_second = nullptr;
    std::vector<prometheus::Gauge*> bubble_ratios;  // index = task
    std::vector<prometheus::Gauge*> hidden_ratios;  // index = task
    // The recipe's (RecipeStep); null until first set.
    prometheus::Gauge* learning_rate = nullptr;
    prometheus::Gauge* grad_norm = nullptr;
    prometheus::Counter* skipped_steps = nullptr;
    prometheus::Gauge* eval_loss = nullptr;
    // Token data's (TokenStep); null until first set.
    prometheus::Gauge* tokens_per_second = nullptr;
    prometheus::Gauge* padding_waste = nullptr;
    std::vector<prometheus::Gauge*> measured_memory;   // index = task
    std::vector<prometheus::Gauge*> predicted_memory;  // index = rank
    // HeldMemory's, index = task.
    std::vector<prometheus::Gauge*> held_parameters;
    std::vector<prometheus::Gauge*> held_gradients;
    std::vector<prometheus::Gauge*> peak_live;
    std::vector<prometheus::Gauge*> gather_hidden;
    prometheus::Gauge* degraded = nullptr;  // with replicas; null until first set
    prometheus::Gauge* healthy_replicas = nullptr;
    prometheus::Gauge* stalled = nullptr;  // null until first set (Diagnosis)
    // By (replica, rank): its pace and straggling gauges.
    std::map<std::pair<int, int>, std::pair<prometheus::Gauge*, prometheus::Gauge*>> pace;
  };

  prometheus::Family<prometheus::Gauge>& jobs_;
  prometheus::Family<prometheus::Gauge>& workers_;
  prometheus::Counter& steps_;
  prometheus::Histogram& step_duration_;
  prometheus::Family<prometheus::Gauge>& loss_;
  prometheus::Family<prometheus::Gauge>& samples_per_second_;
  prometheus::Family<prometheus::Gauge>& bubble_ratio_;
  prometheus::Family<prometheus::Gauge>& hidden_ratio_;
  prometheus::Family<prometheus::Gauge>& learning_rate_;
  prometheus::Family<prometheus::Gauge>& grad_norm_;
  prometheus::Family<prometheus::Counter>& skipped_steps_;
  prometheus::Family<prometheus::Gauge>& eval_loss_;
  prometheus::Family<prometheus::Gauge>& tokens_per_second_;
  prometheus::Family<prometheus::Gauge>& padding_waste_;
  prometheus::Family<prometheus::Gauge>& measured_memory_;
  prometheus::Family<prometheus::Gauge>& predicted_memory_;
  prometheus::Family<prometheus::Gauge>& held_parameters_;
  prometheus::Family<prometheus::Gauge>& held_gradients_;
  prometheus::Family<prometheus::Gauge>& peak_live_;
  prometheus::Family<prometheus::Gauge>& gather_hidden_;
  prometheus::Family<prometheus::Gauge>& degraded_;
  prometheus::Family<prometheus::Gauge>& healthy_replicas_;
  prometheus::Family<prometheus::Gauge>& stalled_;
  prometheus::Family<prometheus::Gauge>& pace_;
  prometheus::Family<prometheus::Gauge>& straggling_;
  prometheus::Family<prometheus::Counter>& bytes_;
  prometheus::Counter& bytes_sent_;
  prometheus::Counter& bytes_received_;
  prometheus::Counter& restarts_;

  absl::Mutex mu_;
  std::map<std::string, JobSeries> series_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> series_order_ ABSL_GUARDED_BY(mu_);  // least recently stepped first
  RecoveryMetrics recovery_;
};

}  // namespace stagecoach::coordinator
