#include "coordinator/elastic/elastic_resize.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "common/rpc/time_conversion.h"
#include "common/spec/hf_model_spec.h"
#include "common/util/logging.h"
#include "coordinator/checkpoints/checkpoint_collection.h"

namespace stagecoach::coordinator {
namespace {

JobLayout LayoutOfPlan(const Plan& plan) {
  std::vector<int> firsts;
  for (const StagePlan& stage : plan.stages) firsts.push_back(stage.first_layer);
  return JobLayoutOf(plan.layers, std::move(firsts));
}

// The checkpoint a restart of `job` starts from (as Placement picks it: the latest the recorded
// losses cover), else the one it resumed from; nullopt for its initial parameters.
std::optional<v1::JobCheckpoint> StartingPoint(const Job& job, bool* is_resume) {
  *is_resume = false;
  const int64_t covered =
      job.forward_only() ? INT64_MAX : job.base_step + static_cast<int64_t>(job.losses.size());
  for (auto c = job.checkpoints.rbegin(); c != job.checkpoints.rend(); ++c) {
    if (c->step() <= covered) return *c;
  }
  *is_resume = job.resumed_from.has_value();
  return job.resumed_from;
}

const Plan& OwnPlan(const Job& job) {
  return job.elastic.shrunk() ? job.elastic.own->plan : job.plan;
}

// What the job holds that belongs to one layout: snapshots (unless the next attempt restores the
// latest by name), traces, measured peaks.
void ForgetLayoutLocked(Job& job, bool keep_latest_snapshot) {
  if (!keep_latest_snapshot) job.snapshots = SnapshotCopies();
  job.elastic.relayout_snapshot_step = -1;
  job.elastic.relayout_snapshot_files.clear();
  job.restored_snapshot = -1;
  job.traces.DropAfter(-1);
  job.balance = MeasuredBalance{};
  job.measured_peak_bytes.clear();
  job.measured_max_bytes.clear();
}

std::string From(int64_t step) { return absl::StrCat("the checkpoint after step ", step); }

std::string FromSnapshot(int64_t step) {
  return absl::StrCat("the in-memory snapshot after step ", step);
}

// The latest complete snapshot of `job` when a re-plan may start from it: newer than `start`
// (else the job's base), covered by the losses on record, and taken on the job's plan (not
// itself the old layout's, restored by name).
std::optional<v1::JobSnapshot> SnapshotToStartFrom(const Job& job,
                                                   const std::optional<v1::JobCheckpoint>& start) {
  const std::optional<v1::JobSnapshot>& latest = job.snapshots.latest();
  if (!latest.has_value() || job.plan.replicas > 1 || job.forward_only() ||
      latest->step() == job.elastic.relayout_snapshot_step) {
    return std::nullopt;
  }
  const int64_t from = start.has_value() ? start->step() : job.base_step;
  const int64_t covered = job.base_step + static_cast<int64_t>(job.losses.size());
  if (latest->step() <= from || latest->step() > covered) return std::nullopt;
  return latest;
}

// A snapshot of `plan`'s stages as a checkpoint manifest, for MatchResumeLayout: each stage's
// layers and its training-state files (from whichever rank's copy holds them).
CheckpointManifest SnapshotManifest(const v1::JobSnapshot& snapshot, const Plan& plan) {
  std::map<int, std::vector<v1::StageCheckpointFile>> files;
  for (const v1::SnapshotCopy& copy : snapshot.ranks()) {
    for (const v1::StageCheckpointFile& f : copy.files()) files[f.stage()].push_back(f);
  }
  return ManifestOfPlan(plan, snapshot.step(), files);
}

}  // namespace

std::vector<ResizeOrder> PlanResizesLocked(JobTable& table, const WorkerRegistry& registry,
                                           absl::Time now) {
  std::vector<ResizeOrder> orders;
  for (Job* job : table.AllLocked()) {
    const spec::RestartSpec& restart = job->spec.restart;
    if (!restart.elastic || job->state != v1::JOB_STATE_RESTARTING || job->recovering ||
        job->elastic.replanning || job->starting || job->manifests_in_flight > 0 ||
        job->history.empty() || registry.AnyBusyWith(job->id)) {
      continue;
    }
    const int free = static_cast<int>(
        registry.Idle(job->spec.placement.device, job->plan.transport, job->id).size());
    const Plan& own = OwnPlan(*job);
    const bool back = job->elastic.shrunk() && free >= own.num_tasks();
    const absl::Duration waited = now - rpc::FromProtoTimestamp(job->history.back().time());
    const bool shrink = free < job->plan.num_tasks() && waited >= restart.wait &&
                        free >= restart.min_workers && free != job->elastic.refused_workers;
    if (!back && !shrink) continue;
    ResizeOrder& order = orders.emplace_back();
    order.job_id = job->id;
    order.attempt = job->attempt;
    order.own_yaml = job->elastic.shrunk() ? job->elastic.own->spec_yaml : job->spec_yaml;
    order.own_plan = own;
    order.workers = back ? own.num_tasks() : free;
    order.min_workers = restart.min_workers;
    order.start = StartingPoint(*job, &order.start_is_resume);
    const spec::JobSpec& own_spec = job->elastic.shrunk() ? job->elastic.own->spec : job->spec;
    order.tied = TiedAcrossStages(own_spec, own.num_stages);
    order.snapshot = SnapshotToStartFrom(*job, order.start);
    if (order.snapshot.has_value()) order.snapshot_plan = job->plan;
    job->elastic.replanning = true;
    job->reason = back ? absl::StrCat("enough free workers for its own plan again (", free,
                                      "); planning it back")
                       : absl::StrCat("no replacement within restart.wait (",
                                      absl::FormatDuration(restart.wait), "); planning it on the ",
                                      free, " free workers");
    spdlog::info("{}: {}", job->id, job->reason);
  }
  return orders;
}

ResizeResult PrepareResize(const ResizeOrder& order) {
  ResizeResult out;
  if (order.workers >= order.own_plan.num_tasks()) {
    absl::StatusOr<spec::JobSpec> spec = spec::ReadJobSpec(order.own_yaml, order.job_id);
    if (!spec.ok()) {
      out.plan = spec.status();
    } else {
      out.plan = ElasticPlan{order.own_yaml, *std::move(spec), order.own_plan,
                             DescribeLayout(order.own_plan)};
    }
  } else {
    out.plan = PlanOnWorkers(order.job_id, order.own_yaml, order.own_plan, order.workers,
                             order.min_workers);
  }
  if (!out.plan.ok()) return out;
  if (order.snapshot.has_value()) {
    out.snapshot_layout =
        MatchResumeLayout(SnapshotManifest(*order.snapshot, order.snapshot_plan),
                          FromSnapshot(order.snapshot->step()), LayoutOfPlan(out.plan->plan),
                          TiedAcrossStages(out.plan->spec, out.plan->plan.num_stages));
  }
  if (!order.start.has_value()) return out;
  const std::string& dir = order.start->directory();
  absl::StatusOr<CheckpointManifest> manifest = ReadManifest(dir);
  if (!manifest.ok()) {
    out.layout = manifest.status();
    return out;
  }
  const bool tied = TiedAcrossStages(out.plan->spec, out.plan->plan.num_stages);
  out.layout = MatchResumeLayout(*manifest, dir, LayoutOfPlan(out.plan->plan), tied);
  return out;
}

bool ApplyResizeLocked(Job& job, const ResizeOrder& order, ResizeResult result) {
  job.elastic.replanning = false;
  if (job.attempt != order.attempt || job.state != v1::JOB_STATE_RESTARTING) return false;
  absl::Status refused = result.plan.status();
  if (refused.ok() && result.layout.has_value() && !result.layout->ok()) {
    refused = result.layout->status();
  }
  if (!refused.ok()) {
    job.elastic.refused_workers = order.workers;
    job.reason =
        absl::StrCat("waiting for ", job.plan.num_tasks(), " workers: ", refused.message());
    spdlog::warn("{}: {}", job.id, job.reason);
    return false;
  }
  ElasticPlan& planned = *result.plan;
  const bool back = order.workers >= order.own_plan.num_tasks();
  const int was = job.plan.num_tasks();
  if (back) {
    job.elastic.own.reset();
  } else if (!job.elastic.shrunk()) {
    job.elastic.own = Job::Elastic::Own{job.spec_yaml, job.spec, job.plan};
  }
  job.spec = std::move(planned.spec);
  job.spec_yaml = std::move(planned.spec_yaml);
  job.plan = std::move(planned.plan);
  job.elastic.refused_workers = -1;
  job.elastic.relayout_step = -1;
  // The snapshot, where it can be restored by name; else the checkpoint.
  std::optional<ResumeLayout> by_snapshot;
  if (result.snapshot_layout.has_value() && result.snapshot_layout->ok()) {
    by_snapshot = **std::move(result.snapshot_layout);
  } else if (result.snapshot_layout.has_value()) {
    spdlog::warn("{}: not continuing from {}: {}", job.id, FromSnapshot(order.snapshot->step()),
                 result.snapshot_layout->status().message());
  }
  ForgetLayoutLocked(job, by_snapshot.has_value());
  const bool restored = result.layout.has_value() || by_snapshot.has_value();
  std::string from = "its initial parameters";
  if (result.layout.has_value()) {
    ResumeLayout& layout = **result.layout;
    if (order.start_is_resume) {
      job.resume_files = std::move(layout.stage_files);
      job.resume_by_name = layout.by_name;
      from = "the checkpoint it resumed from";
    } else {
      job.elastic.relayout_step = order.start->step();
      job.elastic.relayout_files = std::move(layout.stage_files);
      job.elastic.relayout_by_name = layout.by_name;
      from = From(order.start->step());
    }
  }
  if (by_snapshot.has_value() && by_snapshot->by_name) {
    job.elastic.relayout_snapshot_step = order.snapshot->step();
    job.elastic.relayout_snapshot_files = std::move(by_snapshot->stage_files);
    from = absl::StrCat(FromSnapshot(order.snapshot->step()), " (else ", from, ")");
  }
  job.reason = absl::StrCat(
      back ? "back on its own plan, " : "re-planned from ", was,
      back ? " workers: " : absl::StrCat(" to ", job.plan.num_tasks(), " workers: "),
      planned.summary, "; continuing from ", from, restored ? " (restored by parameter name)" : "");
  spdlog::info("{}: {}", job.id, job.reason);
  return true;
}

std::optional<std::string> GrowAtCheckpointLocked(Job& job, const WorkerRegistry& registry,
                                                  const CheckpointManifest& manifest,
                                                  const std::string& step_dir) {
  if (!job.elastic.shrunk() || job.elastic.replanning) return std::nullopt;
  const Job::Elastic::Own& own = *job.elastic.own;
  const bool running = job.state == v1::JOB_STATE_RUNNING || job.state == v1::JOB_STATE_PAUSED;
  if (!own.spec.restart.grow || !running || job.pausing || job.finishing ||
      job.client_step.has_value() || job.checkpoints.empty() ||
      job.checkpoints.back().step() != manifest.step || manifest.step >= job.finish_step) {
    return std::nullopt;
  }
  // A restart starts from a checkpoint whose steps all have their loss on record.
  if (!job.forward_only() &&
      job.base_step + static_cast<int64_t>(job.losses.size()) < manifest.step) {
    return std::nullopt;
  }
  const int free =
      static_cast<int>(registry.Idle(job.spec.placement.device, job.plan.transport, job.id).size());
  const int holding = static_cast<int>(job.ranks.size());
  if (free + holding < own.plan.num_tasks()) return std::nullopt;
  absl::StatusOr<ResumeLayout> layout = MatchResumeLayout(
      manifest, step_dir, LayoutOfPlan(own.plan), TiedAcrossStages(own.spec, own.plan.num_stages));
  if (!layout.ok()) {
    spdlog::error("{}: cannot grow back at {}: {}", job.id, From(manifest.step),
                  layout.status().message());
    return std::nullopt;
  }
  const std::string why =
      absl::StrCat("growing back from ", job.plan.num_tasks(), " to ", own.plan.num_tasks(),
                   " workers (", free, " free): its own plan, ", DescribeLayout(own.plan),
                   ", from ", From(manifest.step), " (restored by parameter name)");
  job.spec = own.spec;
  job.spec_yaml = own.spec_yaml;
  job.plan = own.plan;
  job.elastic.own.reset();
  job.elastic.refused_workers = -1;
  job.elastic.relayout_step = manifest.step;
  job.elastic.relayout_files = std::move(layout->stage_files);
  job.elastic.relayout_by_name = layout->by_name;
  ForgetLayoutLocked(job, /*keep_latest_snapshot=*/false);
  return why;
}

}  // namespace stagecoach::coordinator
