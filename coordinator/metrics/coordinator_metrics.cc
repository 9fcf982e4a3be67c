// The coordinator's Prometheus metrics (see coordinator_metrics.h).
#include "coordinator/metrics/coordinator_metrics.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/metrics/metrics.h"
#include "google/protobuf/descriptor.h"

namespace stagecoach::coordinator {
namespace {

std::string LowerWithoutPrefix(const std::string& name, absl::string_view prefix) {
  absl::string_view rest = name;
  if (absl::StartsWith(rest, prefix)) rest.remove_prefix(prefix.size());
  return absl::AsciiStrToLower(rest);
}

template <typename Enum>
void SetPerState(prometheus::Family<prometheus::Gauge>& family,
                 const google::protobuf::EnumDescriptor* descriptor,
                 const std::map<Enum, int>& counts, absl::string_view prefix) {
  for (int i = 0; i < descriptor->value_count(); ++i) {
    const auto* value = descriptor->value(i);
    if (value->number() == 0) continue;  // *_UNSPECIFIED
    auto it = counts.find(static_cast<Enum>(value->number()));
    family.Add({{"state", LowerWithoutPrefix(value->name(), prefix)}})
        .Set(it == counts.end() ? 0 : it->second);
  }
}

// Sets one gauge of `family` per task of `job_id` to `values` (index = task, labelled by rank
// and replica: task = replica * per_replica + rank), adding the gauges `gauges` lacks.
void SetPerTask(prometheus::Family<prometheus::Gauge>& family,
                std::vector<prometheus::Gauge*>& gauges, const std::string& job_id,
                size_t per_replica, const std::vector<double>& values) {
  for (size_t task = gauges.size(); task < values.size(); ++task) {
    gauges.push_back(&family.Add({{"job", job_id},
                                  {"rank", absl::StrCat(task % per_replica)},
                                  {"replica", absl::StrCat(task / per_replica)}}));
  }
  for (size_t task = 0; task < values.size(); ++task) gauges[task]->Set(values[task]);
}

}  // namespace

std::string CoordinatorMetrics::StateLabel(v1::JobState state) {
  return LowerWithoutPrefix(v1::JobState_Name(state), "JOB_STATE_");
}

std::string CoordinatorMetrics::StateLabel(v1::WorkerState state) {
  return LowerWithoutPrefix(v1::WorkerState_Name(state), "WORKER_STATE_");
}

CoordinatorMetrics::CoordinatorMetrics(prometheus::Registry& registry)
    : jobs_(prometheus::BuildGauge()
                .Name("stagecoach_jobs")
                .Help("Jobs known to the coordinator, by state")
                .Register(registry)),
      workers_(prometheus::BuildGauge()
                   .Name("stagecoach_workers")
                   .Help("Registered workers, by state")
                   .Register(registry)),
      steps_(prometheus::BuildCounter()
                 .Name("stagecoach_steps_total")
                 .Help("Training or inference steps completed by every rank of a job")
                 .Register(registry)
                 .Add({})),
      step_duration_(prometheus::BuildHistogram()
                         .Name("stagecoach_step_duration_seconds")
                         .Help("Wall time of a completed step on its slowest rank")
                         .Register(registry)
                         .Add({}, metrics::DurationBucketsSeconds())),
      loss_(prometheus::BuildGauge()
                .Name("stagecoach_loss")
                .Help("Mean microbatch loss of the job's last completed step")
                .Register(registry)),
      samples_per_second_(prometheus::BuildGauge()
                              .Name("stagecoach_samples_per_second")
                              .Help("Samples per second of the job's last completed step "
                                    "(batch size over the slowest rank's step time)")
                              .Register(registry)),
      bubble_ratio_(prometheus::BuildGauge()
                        .Name("stagecoach_bubble_ratio")
                        .Help("Measured idle fraction (0..1) of a rank in the job's last "
                              "completed step")
                        .Register(registry)),
      hidden_ratio_(prometheus::BuildGauge()
                        .Name("stagecoach_grad_reduction_hidden_ratio")
                        .Help("Share (0..1) of a rank's gradient reduction across data-parallel "
                              "replicas hidden behind its compute in the job's last completed "
                              "step: 1 - compute's wait / (first bucket start -> last bucket end)")
                        .Register(registry)),
      learning_rate_(prometheus::BuildGauge()
                         .Name("stagecoach_learning_rate")
                         .Help("Learning rate of the job's last completed training step "
                               "(training.lr_schedule)")
                         .Register(registry)),
      grad_norm_(prometheus::BuildGauge()
                     .Name("stagecoach_grad_norm")
                     .Help("Global L2 norm of the gradients of the job's last completed step, "
                           "before clipping (training.grad_clip)")
                     .Register(registry)),
      skipped_steps_(prometheus::BuildCounter()
                         .Name("stagecoach_skipped_steps_total")
                         .Help("Training steps whose optimizer step every rank skipped because "
                               "some rank's gradients were not finite")
                         .Register(registry)),
      eval_loss_(prometheus::BuildGauge()
                     .Name("stagecoach_eval_loss")
                     .Help("Validation loss of the job's latest eval pass (the spec's eval)")
                     .Register(registry)),
      tokens_per_second_(prometheus::BuildGauge()
                             .Name("stagecoach_tokens_per_second")
                             .Help("Tokens the loss counted per second of the job's last step "
                                   "(token data)")
                             .Register(registry)),
      padding_waste_(prometheus::BuildGauge()
                         .Name("stagecoach_padding_waste")
                         .Help("Share of the positions the job's last step computed that were "
                               "padding (token data)")
                         .Register(registry)),
      measured_memory_(prometheus::BuildGauge()
                           .Name("stagecoach_activation_peak_bytes")
                           .Help("Most bytes of tensors a rank allocated above what was live at "
                                 "the start of the job's last completed step, as its worker "
                                 "measured (CPU workers)")
                           .Register(registry)),
      predicted_memory_(prometheus::BuildGauge()
                            .Name("stagecoach_predicted_activation_peak_bytes")
                            .Help("The planner's prediction of a rank's activation and buffer "
                                  "peak in a step (the schedule memory model)")
                            .Register(registry)),
      held_parameters_(prometheus::BuildGauge()
                           .Name("stagecoach_held_parameter_bytes")
                           .Help("Bytes a rank holds between steps for its stages' parameters "
                                 "(and their optimizer shards), as its worker's allocator "
                                 "counts them (CPU workers)")
                           .Register(registry)),
      held_gradients_(prometheus::BuildGauge()
                          .Name("stagecoach_held_gradient_bytes")
                          .Help("Bytes a rank holds between steps for its stages' gradients "
                                "(whole or its shard, placement.shard), as its worker's "
                                "allocator counts them (CPU workers)")
                          .Register(registry)),
      peak_live_(prometheus::BuildGauge()
                     .Name("stagecoach_peak_live_bytes")
                     .Help("Most tensor bytes a rank's worker process held at once in the "
                           "job's last completed step (CPU workers)")
                     .Register(registry)),
      gather_hidden_(prometheus::BuildGauge()
                         .Name("stagecoach_parameter_gather_hidden_ratio")
                         .Help("Share of a rank's parameter all-gathers (placement.shard: "
                               "parameters) its compute did not wait for, in the job's last "
                               "completed step")
                         .Register(registry)),
      degraded_(prometheus::BuildGauge()
                    .Name("stagecoach_job_degraded")
                    .Help("1 while a replica of the job has left it and the others carry on")
                    .Register(registry)),
      healthy_replicas_(prometheus::BuildGauge()
                            .Name("stagecoach_job_healthy_replicas")
                            .Help("Data-parallel replicas carrying the job")
                            .Register(registry)),
      stalled_(prometheus::BuildGauge()
                   .Name("stagecoach_job_stalled")
                   .Help("1 while the job's step has run past its stall bound (STALLED)")
                   .Register(registry)),
      pace_(prometheus::BuildGauge()
                .Name("stagecoach_rank_pace")
                .Help("A rank's compute per step over the median of its peers' with the same "
                      "work (median over the straggler window; 1: on pace)")
                .Register(registry)),
      straggling_(prometheus::BuildGauge()
                      .Name("stagecoach_rank_straggling")
                      .Help("1 while the rank is persistently slower than its peers")
                      .Register(registry)),
      bytes_(prometheus::BuildCounter()
                 .Name("stagecoach_data_plane_bytes_total")
                 .Help("Data-plane bytes the workers reported, by direction")
                 .Register(registry)),
      bytes_sent_(bytes_.Add({{"direction", "sent"}})),
      bytes_received_(bytes_.Add({{"direction", "received"}})),
      restarts_(prometheus::BuildCounter()
                    .Name("stagecoach_job_restarts_total")
                    .Help("Jobs restarted from their latest checkpoint after a failure")
                    .Register(registry)
                    .Add({})),
      recovery_(registry) {
  SetJobCounts({});
  SetWorkerCounts({});
}

void CoordinatorMetrics::SetJobCounts(const std::map<v1::JobState, int>& counts) {
  SetPerState(jobs_, v1::JobState_descriptor(), counts, "JOB_STATE_");
}

void CoordinatorMetrics::SetWorkerCounts(const std::map<v1::WorkerState, int>& counts) {
  SetPerState(workers_, v1::WorkerState_descriptor(), counts, "WORKER_STATE_");
}

void CoordinatorMetrics::StepCompleted(const std::string& job_id, absl::Duration step_time,
                                       std::optional<double> loss, double samples_per_second,
                                       const std::vector<double>& bubble_ratios,
                                       const std::vector<double>& hidden_ratios, int num_ranks) {
  const size_t per_replica =
      num_ranks > 0 ? static_cast<size_t>(num_ranks) : std::max<size_t>(bubble_ratios.size(), 1);
  steps_.Increment();
  step_duration_.Observe(absl::ToDoubleSeconds(step_time));

  absl::MutexLock lock(&mu_);
  auto [it, added] = series_.try_emplace(job_id);
  JobSeries& s = it->second;
  if (added) {
    s.samples_per_second = &samples_per_second_.Add({{"job", job_id}});
  } else {
    series_order_.erase(std::find(series_order_.begin(), series_order_.end(), job_id));
  }
  series_order_.push_back(job_id);
  if (loss.has_value()) {
    if (s.loss == nullptr) s.loss = &loss_.Add({{"job", job_id}});
    s.loss->Set(*loss);
  }
  s.samples_per_second->Set(samples_per_second);
  SetPerTask(bubble_ratio_, s.bubble_ratios, job_id, per_replica, bubble_ratios);
  SetPerTask(hidden_ratio_, s.hidden_ratios, job_id, per_replica, hidden_ratios);

  while (series_order_.size() > static_cast<size_t>(kMaxJobSeries)) {
    auto oldest = series_.find(series_order_.front());
    series_order_.pop_front();
    JobSeries& old = oldest->second;
    if (old.loss != nullptr) loss_.Remove(old.loss);
    samples_per_second_.Remove(old.samples_per_second);
    for (prometheus::Gauge* g : old.bubble_ratios) bubble_ratio_.Remove(g);
    for (prometheus::Gauge* g : old.hidden_ratios) hidden_ratio_.Remove(g);
    if (old.learning_rate != nullptr) learning_rate_.Remove(old.learning_rate);
    if (old.grad_norm != nullptr) grad_norm_.Remove(old.grad_norm);
    if (old.skipped_steps != nullptr) skipped_steps_.Remove(old.skipped_steps);
    if (old.eval_loss != nullptr) eval_loss_.Remove(old.eval_loss);
    if (old.tokens_per_second != nullptr) tokens_per_second_.Remove(old.tokens_per_second);
    if (old.padding_waste != nullptr) padding_waste_.Remove(old.padding_waste);
    for (prometheus::Gauge* g : old.measured_memory) measured_memory_.Remove(g);
    for (prometheus::Gauge* g : old.predicted_memory) predicted_memory_.Remove(g);
    for (prometheus::Gauge* g : old.held_parameters) held_parameters_.Remove(g);
    for (prometheus::Gauge* g : old.held_gradients) held_gradients_.Remove(g);
    for (prometheus::Gauge* g : old.peak_live) peak_live_.Remove(g);
    for (prometheus::Gauge* g : old.gather_hidden) gather_hidden_.Remove(g);
    if (old.degraded != nullptr) degraded_.Remove(old.degraded);
    if (old.healthy_replicas != nullptr) healthy_replicas_.Remove(old.healthy_replicas);
    if (old.stalled != nullptr) stalled_.Remove(old.stalled);
    for (auto& [key, gauges] : old.pace) {
      pace_.Remove(gauges.first);
      straggling_.Remove(gauges.second);
    }
    series_.erase(oldest);
  }
}

void CoordinatorMetrics::ReplicaHealth(const std::string& job_id, int healthy, int replicas) {
  absl::MutexLock lock(&mu_);
  auto it = series_.find(job_id);
  if (it == series_.end()) return;
  JobSeries& s = it->second;
  if (s.degraded == nullptr) {
    s.degraded = &degraded_.Add({{"job", job_id}});
    s.healthy_replicas = &healthy_replicas_.Add({{"job", job_id}});
  }
  s.degraded->Set(healthy < replicas ? 1.0 : 0.0);
  s.healthy_replicas->Set(healthy);
}

void CoordinatorMetrics::Diagnosis(const std::string& job_id, bool stalled,
                                   const std::vector<v1::RankPace>& pace) {
  absl::MutexLock lock(&mu_);
  auto it = series_.find(job_id);
  if (it == series_.end()) return;
  JobSeries& s = it->second;
  if (s.stalled == nullptr) s.stalled = &stalled_.Add({{"job", job_id}});
  s.stalled->Set(stalled ? 1.0 : 0.0);
  for (const v1::RankPace& p : pace) {
    auto [g, added] = s.pace.try_emplace({p.replica(), p.rank()});
    if (added) {
      const std::map<std::string, std::string> labels = {{"job", job_id},
                                                         {"rank", absl::StrCat(p.rank())},
                                                         {"replica", absl::StrCat(p.replica())}};
      g->second = {&pace_.Add(labels), &straggling_.Add(labels)};
    }
    g->second.first->Set(p.ratio());
    g->second.second->Set(p.straggling() ? 1.0 : 0.0);
  }
}

void CoordinatorMetrics::RankMemory(const std::string& job_id, const std::vector<int64_t>& measured,
                                    const std::vector<int64_t>& predicted, int num_ranks) {
  const size_t per_replica = std::max(num_ranks, 1);
  absl::MutexLock lock(&mu_);
  auto it = series_.find(job_id);
  if (it == series_.end()) return;  // evicted: its series are gone
  JobSeries& s = it->second;
  SetPerTask(measured_memory_, s.measured_memory, job_id, per_replica,
             std::vector<double>(measured.begin(), measured.end()));
  for (size_t rank = s.predicted_memory.size(); rank < predicted.size(); ++rank) {
    s.predicted_memory.push_back(
        &predicted_memory_.Add({{"job", job_id}, {"rank", absl::StrCat(rank)}}));
  }
  for (size_t rank = 0; rank < predicted.size(); ++rank) {
    s.predicted_memory[rank]->Set(static_cast<double>(predicted[rank]));
  }
}

void CoordinatorMetrics::HeldMemory(const std::string& job_id,
                                    const std::vector<TaskHeldMemory>& tasks, int num_ranks) {
  const size_t per_replica = std::max(num_ranks, 1);
  std::vector<double> parameters, gradients, peak, hidden;
  for (const TaskHeldMemory& t : tasks) {
    parameters.push_back(static_cast<double>(t.held_parameter_bytes));
    gradients.push_back(static_cast<double>(t.held_gradient_bytes));
    peak.push_back(static_cast<double>(t.peak_live_bytes));
    if (t.gather_hidden_ratio.has_value()) hidden.push_back(*t.gather_hidden_ratio);
  }
  if (hidden.size() != tasks.size()) hidden.clear();  // every task gathers, or none
  absl::MutexLock lock(&mu_);
  auto it = series_.find(job_id);
  if (it == series_.end()) return;  // evicted: its series are gone
  JobSeries& s = it->second;
  SetPerTask(held_parameters_, s.held_parameters, job_id, per_replica, parameters);
  SetPerTask(held_gradients_, s.held_gradients, job_id, per_replica, gradients);
  SetPerTask(peak_live_, s.peak_live, job_id, per_replica, peak);
  SetPerTask(gather_hidden_, s.gather_hidden, job_id, per_replica, hidden);
}

void CoordinatorMetrics::RecipeStep(const std::string& job_id, double learning_rate,
                                    std::optional<double> grad_norm, bool skipped,
                                    std::optional<double> eval_loss) {
  const std::map<std::string, std::string> labels = {{"job", job_id}};
  absl::MutexLock lock(&mu_);
  auto it = series_.find(job_id);
  if (it == series_.end()) return;  // evicted: its series are gone
  JobSeries& s = it->second;
  if (s.learning_rate == nullptr) s.learning_rate = &learning_rate_.Add(labels);
  s.learning_rate->Set(learning_rate);
  if (s.skipped_steps == nullptr) s.skipped_steps = &skipped_steps_.Add(labels);
  if (skipped) s.skipped_steps->Increment();
  if (grad_norm.has_value()) {
    if (s.grad_norm == nullptr) s.grad_norm = &grad_norm_.Add(labels);
    s.grad_norm->Set(*grad_norm);
  }
  if (eval_loss.has_value()) {
    if (s.eval_loss == nullptr) s.eval_loss = &eval_loss_.Add(labels);
    s.eval_loss->Set(*eval_loss);
  }
}

void CoordinatorMetrics::TokenStep(const std::string& job_id, double tokens_per_second,
                                   double padding_waste) {
  const std::map<std::string, std::string> labels = {{"job", job_id}};
  absl::MutexLock lock(&mu_);
  auto it = series_.find(job_id);
  if (it == series_.end()) return;  // evicted: its series are gone
  JobSeries& s = it->second;
  if (s.tokens_per_second == nullptr) s.tokens_per_second = &tokens_per_second_.Add(labels);
  s.tokens_per_second->Set(tokens_per_second);
  if (s.padding_waste == nullptr) s.padding_waste = &padding_waste_.Add(labels);
  s.padding_waste->Set(padding_waste);
}

void CoordinatorMetrics::JobRestarted() { restarts_.Increment(); }

void CoordinatorMetrics::AddDataPlaneBytes(int64_t sent, int64_t received) {
  if (sent > 0) bytes_sent_.Increment(static_cast<double>(sent));
  if (received > 0) bytes_received_.Increment(static_cast<double>(received));
}

}  // namespace stagecoach::coordinator
