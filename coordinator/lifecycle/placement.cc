#include "coordinator/lifecycle/placement.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/rpc/address.h"
#include "common/util/logging.h"
#include "coordinator/checkpoints/resume_layout.h"
#include "coordinator/snapshots/snapshot_placement.h"

namespace stagecoach::coordinator {

Placement::Placement(TaskSettings settings, WorkerRegistry* registry)
    : settings_(settings), registry_(registry) {}

std::vector<StartOrder> Placement::PlaceLocked(JobTable& table, absl::Time now) {
  std::vector<StartOrder> orders;
  bool blocked = false;  // an older job is waiting: later ones queue behind it
  std::string blocker;
  for (Job* job : table.AllLocked()) {
    const bool restarting = job->state == v1::JOB_STATE_RESTARTING;
    if ((job->state != v1::JOB_STATE_PENDING && !restarting) || job->starting) continue;
    // A restarting job's previous workers must be free of it first (StopTask returned), and
    // the checkpoints it completed listed (it continues from the latest).
    if (restarting && (registry_->AnyBusyWith(job->id) || job->manifests_in_flight > 0)) continue;
    // Re-planned in the background first (JobManager::Recover, an elastic re-plan).
    if (job->recovering || job->elastic.replanning) {
      blocked = true;
      blocker = job->id;
      continue;
    }
    const int needed = job->plan.num_tasks();
    // A first placement waits for its spares too; a restart takes the workers it needs and
    // holds spares again as it can.
    const int spares = job->spec.placement.spares;
    const int wanted = restarting ? needed : needed + spares;
    const std::string& device = job->spec.placement.device;
    // A restarting job keeps its cause in view while it waits.
    const std::string waiting =
        restarting && !job->history.empty() ? absl::StrCat(job->history.back().reason(), "; ") : "";
    if (blocked) {
      job->reason = absl::StrCat(waiting, "queued behind ", blocker, "; needs ", needed, " ",
                                 device, " workers");
      continue;
    }
    std::vector<WorkerRecord> idle = registry_->Idle(device, job->plan.transport, job->id);
    if (static_cast<int>(idle.size()) < wanted) {
      job->reason =
          absl::StrCat(waiting, "waiting for ", wanted, " workers",
                       wanted > needed ? absl::StrCat(" (", spares, " of them spares)") : "", ", ",
                       idle.size(), " free");
      if (device != "cpu") {
        absl::StrAppend(&job->reason, " (device ", device, ", transport ", job->plan.transport,
                        ")");
      }
      blocked = true;
      blocker = job->id;
      continue;
    }
    std::vector<WorkerRecord> workers;
    const AttemptStart start = PrepareAttemptLocked(*job, restarting, idle, workers);
    StartOrder order = AssignRanksLocked(*job, workers, start);
    HoldSparesLocked(*job, idle);
    if (restarting && !job->spec.training.checkpoint.dir.empty()) {
      order.set_aside_dir = job->spec.training.checkpoint.dir;
      // Partial directories after the latest complete checkpoint (a restart from a newer
      // snapshot writes none of those up to its step again).
      order.set_aside_after =
          start.snapshot.has_value()
              ? (job->checkpoints.empty() ? job->base_step : job->checkpoints.back().step())
              : job->attempt_base;
      order.set_aside_tag = absl::StrCat("attempt-", job->attempt - 1);
    }
    std::vector<std::string> names;
    for (const WorkerRecord& w : workers) names.push_back(w.id);
    std::string from;
    if (start.snapshot.has_value()) {
      from = absl::StrCat(" from the in-memory snapshot after step ", start.checkpoint->step(),
                          start.by_name ? " (restored by parameter name)" : "");
    } else if (start.checkpoint.has_value()) {
      from = absl::StrCat(" from the checkpoint after step ", start.checkpoint->step(),
                          start.by_name ? " (restored by parameter name)" : "");
    }
    if (job->elastic.shrunk()) {
      absl::StrAppend(&from, " (elastic: ", job->plan.num_tasks(), " of its ",
                      job->elastic.own->plan.num_tasks(), " workers; ", job->plan.schedule_name,
                      " on ", job->plan.num_ranks, " ranks x ", job->plan.replicas, " replicas, ",
                      job->plan.num_stages, " stages, ", job->plan.num_microbatches,
                      " microbatches)");
    }
    const std::string placed =
        absl::StrCat("starting attempt ", job->attempt, " on ", absl::StrJoin(names, ", "), from,
                     job->spare_workers.empty()
                         ? ""
                         : absl::StrCat(" (spares ", absl::StrJoin(job->spare_workers, ", "), ")"));
    absl::Status moved = job->TransitionTo(v1::JOB_STATE_STARTING, placed, now);
    if (!moved.ok()) spdlog::error("{}: {}", job->id, moved.message());
    spdlog::info("{} {}", job->id, placed);
    table.PersistLocked(*job);
    orders.push_back(std::move(order));
  }
  return orders;
}

AttemptStart Placement::PrepareAttemptLocked(Job& job, bool restarting,
                                             const std::vector<WorkerRecord>& idle,
                                             std::vector<WorkerRecord>& workers) {
  // A restart continues from the latest complete checkpoint; a first attempt from the
  // checkpoint the job resumes from, if any.
  AttemptStart start{job.resumed_from, job.resume_files, job.resume_by_name, std::nullopt};
  job.restored.reset();
  const int64_t failed_snapshot = job.restored_snapshot;
  // An attempt that started from a snapshot and completed no step failed to restore it, unless
  // it was held at its start.
  const bool snapshot_failed =
      failed_snapshot >= 0 && job.steps_completed == 0 && job.hold_step != failed_snapshot;
  job.restored_snapshot = -1;
  if (restarting) {
    // A checkpoint past the losses on record (the coordinator stopped after writing its
    // manifest but before its step's loss was saved) is not restarted from: the steps before
    // it would have no loss. An earlier one is, and the steps after it run again.
    const int64_t covered =
        job.forward_only() ? INT64_MAX : job.base_step + static_cast<int64_t>(job.losses.size());
    while (!job.checkpoints.empty() && job.checkpoints.back().step() > covered) {
      spdlog::warn(
          "{}: not restarting from the checkpoint after step {}: the losses on record "
          "end at step {}; an earlier starting point runs them again",
          job.id, job.checkpoints.back().step(), covered);
      job.checkpoint_stage_files.erase(job.checkpoints.back().step());
      job.checkpoints.pop_back();
    }
  }
  if (restarting && !job.checkpoints.empty()) {
    const v1::JobCheckpoint& latest = job.checkpoints.back();
    auto files = job.checkpoint_stage_files.find(latest.step());
    if (job.elastic.relayout_step == latest.step()) {
      // Written on another layout than the plan's (an elastic re-plan): by parameter name.
      start = AttemptStart{latest, job.elastic.relayout_files, job.elastic.relayout_by_name,
                           std::nullopt};
      job.restored = latest;
    } else if (files != job.checkpoint_stage_files.end() &&
               static_cast<int>(files->second.size()) == job.plan.num_stages) {
      start = AttemptStart{latest, files->second, false, std::nullopt};
      job.restored = latest;
    }
  }
  // The ranks in registration order of the free workers, unless the latest in-memory snapshot
  // is newer: then on the workers holding it.
  workers.assign(idle.begin(), idle.begin() + job.plan.num_tasks());
  if (restarting && snapshot_failed && job.snapshots.latest().has_value() &&
      job.snapshots.latest()->step() == failed_snapshot) {
    spdlog::warn(
        "{}: not restarting from the in-memory snapshot after step {} again: the "
        "attempt that started from it failed before its first step",
        job.id, failed_snapshot);
    job.snapshots.DropLatest();
  }
  if (restarting) StartFromSnapshotLocked(job, idle, start, workers);
  job.attempt_base = start.checkpoint.has_value() ? start.checkpoint->step() : job.base_step;
  if (job.hold_step >= 0 && job.hold_step < job.attempt_base) job.hold_step = -1;
  // Steps after the starting point are run again.
  const size_t kept = static_cast<size_t>(job.attempt_base - job.base_step);
  job.losses.resize(std::min(job.losses.size(), kept));
  job.max_bubble_ratios.resize(std::min(job.max_bubble_ratios.size(), kept));
  auto& missing = job.missing_loss_steps;
  missing.erase(std::remove_if(missing.begin(), missing.end(),
                               [kept](int64_t step) { return step >= static_cast<int64_t>(kept); }),
                missing.end());
  job.training.DropFrom(job.attempt_base);
  job.traces.DropAfter(job.attempt_base - 1);
  job.steps_completed = 0;
  job.pausing = false;
  job.finishing = job.inference;
  job.partial_steps.clear();
  job.checkpoint_files.clear();
  return start;
}

void Placement::StartFromSnapshotLocked(Job& job, const std::vector<WorkerRecord>& idle,
                                        AttemptStart& start, std::vector<WorkerRecord>& workers) {
  const std::optional<v1::JobSnapshot>& snapshot = job.snapshots.latest();
  if (!snapshot.has_value() || job.plan.replicas > 1 || job.forward_only()) return;
  const int64_t step = snapshot->step();
  const int64_t from = start.checkpoint.has_value() ? start.checkpoint->step() : job.base_step;
  // Like a checkpoint, a snapshot past the losses on record is not restarted from.
  const int64_t covered = job.base_step + static_cast<int64_t>(job.losses.size());
  if (step <= from || step > covered) return;
  const Plan& plan = job.plan;
  // Taken on another layout (an elastic re-plan continues from it): each rank reads the old
  // stages' files that hold its layers, by parameter name.
  const bool by_name = job.elastic.relayout_snapshot_step == step;
  std::vector<std::vector<int>> needs(plan.num_ranks);
  for (int s = 0; s < plan.num_stages; ++s) {
    std::vector<int>& mine = needs[plan.stage_to_rank[s]];
    if (!by_name) {
      mine.push_back(s);
      continue;
    }
    for (const v1::StageCheckpointFile& f : job.elastic.relayout_snapshot_files[s]) {
      if (std::find(mine.begin(), mine.end(), f.stage()) == mine.end()) mine.push_back(f.stage());
    }
  }
  // The last stage's tied copy of the embeddings comes from stage 0's file.
  const int last = plan.stage_to_rank[plan.num_stages - 1];
  if (!by_name && TiedAcrossStages(job.spec, plan.num_stages) && plan.stage_to_rank[0] != last) {
    needs[last].push_back(0);
  }
  std::vector<std::string> ids;
  for (const WorkerRecord& w : idle) ids.push_back(w.id);
  const std::optional<SnapshotPlacement> placed = PlaceOnSnapshot(*snapshot, needs, ids);
  if (!placed.has_value()) {
    spdlog::info(
        "{}: not restarting from the in-memory snapshot after step {}: a rank's files "
        "are held by no free worker",
        job.id, step);
    return;
  }
  workers.clear();
  for (int w : placed->workers) workers.push_back(idle[w]);
  AttemptStart from_snapshot;
  v1::JobCheckpoint& point = from_snapshot.checkpoint.emplace();
  point.set_step(step);
  point.set_directory(absl::StrCat("in-memory snapshot after step ", step));
  from_snapshot.by_name = by_name;
  if (by_name) {
    from_snapshot.stage_files = job.elastic.relayout_snapshot_files;
  } else {
    from_snapshot.stage_files.resize(plan.num_stages);
    for (const v1::SnapshotCopy& copy : snapshot->ranks()) {
      for (const v1::StageCheckpointFile& f : copy.files()) {
        if (f.stage() >= 0 && f.stage() < plan.num_stages) {
          from_snapshot.stage_files[f.stage()].push_back(f);
        }
      }
    }
  }
  *from_snapshot.snapshot.emplace().mutable_transfers() = {placed->transfers.begin(),
                                                           placed->transfers.end()};
  start = std::move(from_snapshot);
  job.restored.reset();  // not a checkpoint
  job.restored_snapshot = step;
}

void Placement::HoldSparesLocked(Job& job, const std::vector<WorkerRecord>& idle) {
  registry_->Unreserve(job.id);
  job.spare_workers.clear();
  const size_t spares = static_cast<size_t>(job.spec.placement.spares);
  for (const WorkerRecord& w : idle) {
    if (job.spare_workers.size() >= spares) break;
    // The attempt's own workers are busy now: Reserve refuses them.
    if (registry_->Reserve(w.id, job.id).ok()) job.spare_workers.push_back(w.id);
  }
}

namespace {

std::string HostOf(const std::string& address) {
  auto parsed = rpc::ParseHostPort(address, "worker address");
  return parsed.ok() ? parsed->host : address;
}

}  // namespace

std::map<std::string, int> RanksByHost(const std::vector<RankSlot>& ranks) {
  std::map<std::string, int> counts;
  for (const RankSlot& slot : ranks) ++counts[HostOf(slot.worker_address)];
  return counts;
}

int RanksOnHost(const std::vector<RankSlot>& ranks, const std::string& address) {
  const std::map<std::string, int> counts = RanksByHost(ranks);
  const auto it = counts.find(HostOf(address));
  return it == counts.end() ? 0 : it->second;
}

StartOrder Placement::AssignRanksLocked(Job& job, const std::vector<WorkerRecord>& workers,
                                        const AttemptStart& start) {
  const int64_t step_limit = job.hold_step >= 0 ? job.hold_step : job.finish_step;
  ++job.attempt;
  job.starting = true;
  job.ranks.clear();
  job.snapshots.StartAttempt(job.attempt, job.plan.num_ranks);
  job.replica_health.Reset(job.plan.replicas, job.plan.num_ranks,
                           !job.forward_only() && !job.inference && spec::CarriesOn(job.spec));
  StartOrder order;
  order.job_id = job.id;
  order.attempt = job.attempt;
  for (int i = 0; i < static_cast<int>(workers.size()); ++i) {
    const int r = i % job.plan.num_ranks;
    RankSlot& slot = job.ranks.emplace_back();
    slot.rank = r;
    slot.replica = i / job.plan.num_ranks;
    slot.worker_id = workers[i].id;
    slot.worker_address = workers[i].address;
    for (int s = 0; s < job.plan.num_stages; ++s) {
      if (job.plan.stage_to_rank[s] == r) slot.stages.push_back(s);
    }
    for (const auto& action : job.plan.lowered[r]) {
      if (action.has_value()) slot.actions.push_back(action->ToString());
    }
  }
  // Counted once per attempt: a job may have thousands of ranks.
  const std::map<std::string, int> ranks_by_host = RanksByHost(job.ranks);
  std::map<std::string, int> placed_on_host;
  for (const RankSlot& slot : job.ranks) {
    v1::TaskAssignment task = BuildTaskAssignment(job, slot, start, step_limit, settings_);
    const std::string host = HostOf(slot.worker_address);
    task.set_ranks_on_host(ranks_by_host.at(host));
    task.set_index_on_host(placed_on_host[host]++);
    order.tasks.emplace_back(slot.worker_address, std::move(task));
    absl::Status assigned = registry_->Assign(slot.worker_id, job.id, slot.rank);
    if (!assigned.ok()) spdlog::error("{}: {}", job.id, assigned.message());
  }
  return order;
}

}  // namespace stagecoach::coordinator
