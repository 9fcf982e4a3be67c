#include "coordinator/recovery.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/rpc/time_conversion.h"
#include "common/spec/spec_parser.h"
#include "coordinator/checkpoint_manifest.h"
#include "coordinator/planner.h"

namespace stagecoach::coordinator {
namespace {

// Plans the recorded job again; an Infer job's spec plans with the client's batch in place of
// its data (and marks the job as one).
absl::StatusOr<Plan> PlanAgain(const v1::Job& record, Job& job) {
  std::vector<v1::LayerInfo> layers(record.layers().begin(), record.layers().end());
  absl::StatusOr<Plan> plan = PlanJob(job.spec, layers);
  if (plan.ok()) return plan;
  PlanOptions options;
  options.client_batches = true;
  absl::StatusOr<Plan> inference_plan = PlanJob(job.spec, layers, options);
  if (!inference_plan.ok()) return plan.status();
  job.inference = true;
  return inference_plan;
}

// The plan's description from the record alone, for a job that no longer plans.
Plan DescribedPlan(const v1::Job& record) {
  Plan plan;
  plan.layers.assign(record.layers().begin(), record.layers().end());
  plan.num_stages = record.num_stages();
  plan.num_ranks = record.num_ranks();
  plan.replicas = std::max(1, record.replicas());
  plan.schedule_name = record.schedule();
  plan.num_microbatches = record.microbatches();
  return plan;
}

void RestoreCheckpoints(const v1::Job& record, bool final_state, Job& job,
                        std::vector<std::string>* problems) {
  if (record.has_resumed_from()) {
    job.resumed_from = record.resumed_from();
    job.base_step = record.resumed_from().step();
    if (!final_state) {
      auto m = VerifyCheckpoint(record.resumed_from().directory());
      if (m.ok()) {
        for (const ManifestStage& st : m->stages) job.resume_files.push_back(st.files);
      } else {
        problems->push_back(
            absl::StrCat(job.id, ": the checkpoint it resumed from: ", m.status().message()));
      }
    }
  }
  for (const v1::JobCheckpoint& c : record.checkpoints()) {
    if (final_state) {
      job.checkpoints.push_back(c);
      continue;
    }
    auto m = VerifyCheckpoint(c.directory());
    if (!m.ok()) {
      problems->push_back(absl::StrCat(job.id, ": checkpoint after step ", c.step(),
                                       " is unusable: ", m.status().message()));
      continue;
    }
    job.checkpoints.push_back(c);
    for (const ManifestStage& st : m->stages) {
      job.checkpoint_stage_files[c.step()].push_back(st.files);
    }
  }
}

// The ranks of a finished job, as recorded (for display).
void RestoreFinishedRanks(const v1::Job& record, Job& job) {
  for (const v1::RankStatus& r : record.ranks()) {
    RankSlot& slot = job.ranks.emplace_back();
    slot.rank = r.rank();
    slot.replica = r.replica();
    slot.worker_id = r.worker_id();
    slot.stages.assign(r.stages().begin(), r.stages().end());
    slot.steps_done = r.steps_done();
    slot.bytes_sent = r.bytes_sent();
    slot.bytes_received = r.bytes_received();
    slot.parameters = r.parameters();
    slot.task_ended = true;
  }
}

}  // namespace

absl::StatusOr<RebuiltJob> RebuildJob(const v1::Job& record, std::vector<std::string>* problems) {
  RebuiltJob out;
  out.job = std::make_shared<Job>();
  Job& job = *out.job;
  job.id = record.id();
  auto spec = spec::ParseJobSpec(record.spec_yaml(), record.id());
  if (!spec.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(record.id(), ": its spec no longer parses (",
                                                   spec.status().message(), "); not loaded"));
  }
  job.spec = *std::move(spec);
  job.spec_yaml = record.spec_yaml();
  job.created = rpc::FromProtoTimestamp(record.created_time());
  absl::StatusOr<Plan> plan = PlanAgain(record, job);
  if (plan.ok()) {
    job.plan = *std::move(plan);
  } else {
    job.plan = DescribedPlan(record);
    out.plan_error = std::string(plan.status().message());
  }
  for (const v1::JobTransition& t : record.history()) {
    absl::Status replayed =
        job.TransitionTo(t.state(), t.reason(), rpc::FromProtoTimestamp(t.time()));
    if (!replayed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(record.id(), ": its history is not a path of the job state machine (",
                       replayed.message(), "); not loaded"));
    }
  }
  if (job.state != record.state()) {
    return absl::InvalidArgumentError(absl::StrCat(record.id(), ": its history ends in ",
                                                   JobStateName(job.state), ", its state is ",
                                                   JobStateName(record.state()), "; not loaded"));
  }
  job.reason = record.reason();
  job.attempt = record.attempt();
  job.restarts = record.restarts();
  if (record.has_failure()) job.failure = record.failure();
  job.losses.assign(record.losses().begin(), record.losses().end());
  job.max_bubble_ratios.assign(record.max_bubble_ratios().begin(),
                               record.max_bubble_ratios().end());
  job.training.FromProto(record);
  const bool final_state = IsFinal(record.state());
  RestoreCheckpoints(record, final_state, job, problems);
  job.finish_step = job.base_step + record.steps_total();
  job.attempt_base = record.global_steps_done();
  if (record.state() == v1::JOB_STATE_PAUSED || record.pause_at_global_step() > 0) {
    job.hold_step = record.pause_at_global_step();
  }
  if (final_state) RestoreFinishedRanks(record, job);
  return out;
}

}  // namespace stagecoach::coordinator
