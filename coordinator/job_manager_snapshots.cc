// JobManager's part in in-memory snapshots (training.snapshot, docs/recovery.md): the workers'
// reports of what they hold, and what the heartbeats tell them to keep.
#include "absl/strings/str_cat.h"
#include "common/util/logging.h"
#include "common/util/status_macros.h"
#include "coordinator/job_manager.h"

namespace stagecoach::coordinator {

absl::Status JobManager::ReportSnapshot(const v1::ReportSnapshotRequest& req) {
  absl::MutexLock lock(&table_.mu());
  ASSIGN_OR_RETURN(Job * job, table_.FindOrErrorLocked(req.job_id()));
  if (IsFinal(job->state) || req.attempt() != job->attempt) {
    return absl::OkStatus();  // late report of an ended job or of an earlier attempt
  }
  auto slot = std::find_if(job->ranks.begin(), job->ranks.end(),
                           [&](const RankSlot& s) { return s.worker_id == req.worker_id(); });
  if (slot == job->ranks.end()) {
    return absl::FailedPreconditionError(absl::StrCat("snapshot report from worker ",
                                                      req.worker_id(), ", which runs no rank of ",
                                                      job->id, " attempt ", job->attempt));
  }
  absl::StatusOr<bool> recorded = job->snapshots.Record(
      req.worker_id(), slot->rank, req.attempt(), req.step(), req.held(), deps_.clock->Now());
  if (!recorded.ok()) {
    return absl::Status(recorded.status().code(),
                        absl::StrCat(job->id, ": ", recorded.status().message()));
  }
  const bool completed = *recorded;
  if (completed) {
    const v1::JobSnapshot& latest = *job->snapshots.latest();
    spdlog::info(
        "{}: in-memory snapshot after step {} complete ({} bytes, every rank on two "
        "workers)",
        job->id, latest.step(), latest.bytes());
    v1::JobEvent event;
    v1::SnapshotTaken* taken = event.mutable_snapshot_taken();
    taken->set_global_step(latest.step());
    taken->set_bytes(latest.bytes());
    taken->set_ranks(latest.ranks_size());
    int copies = INT32_MAX;
    for (const v1::SnapshotCopy& copy : latest.ranks()) {
      copies = std::min(copies, copy.worker_ids_size());
    }
    taken->set_copies(copies);
    job->AddEvent(std::move(event), deps_.clock->Now());
    table_.PersistLocked(*job);
  }
  return absl::OkStatus();
}

v1::HeartbeatResponse JobManager::SnapshotKeepFrom(
    const google::protobuf::RepeatedPtrField<std::string>& jobs) {
  v1::HeartbeatResponse response;
  absl::MutexLock lock(&table_.mu());
  for (const std::string& id : jobs) {
    Job* job = table_.FindLocked(id);
    int64_t keep = -1;
    // A live job keeps its latest complete snapshot and newer (all it has before one).
    if (job != nullptr && !IsFinal(job->state)) keep = std::max<int64_t>(0, job->snapshots.KeepFrom());
    (*response.mutable_snapshot_keep_from())[id] = keep;
  }
  return response;
}

}  // namespace stagecoach::coordinator
