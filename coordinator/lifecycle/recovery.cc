#include "coordinator/lifecycle/recovery.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/rpc/time_conversion.h"
#include "common/spec/hf_model_spec.h"
#include "common/spec/spec_parser.h"
#include "common/util/status_macros.h"
#include "coordinator/checkpoints/checkpoint_manifest.h"
#include "coordinator/checkpoints/resume_layout.h"
#include "coordinator/planning/planner.h"

namespace stagecoach::coordinator {
namespace {

// Plans the job again with its recorded partition; an Infer job's spec plans with the client's
// batch in place of its data.
absl::StatusOr<Plan> PlanAgain(const RecoveryInput& input, bool* inference) {
  PlanOptions options;
  options.stage_first_layers = input.stage_first_layers;
  absl::StatusOr<Plan> plan = PlanJob(input.spec, input.layers, options);
  if (plan.ok()) return plan;
  options.client_batches = true;
  absl::StatusOr<Plan> inference_plan = PlanJob(input.spec, input.layers, options);
  if (!inference_plan.ok()) return plan.status();
  *inference = true;
  return inference_plan;
}

// The plan's description from the record alone (no schedule): what a job shows until it is
// planned again, and all a finished job needs.
Plan DescribedPlan(const v1::Job& record) {
  Plan plan;
  plan.layers.assign(record.layers().begin(), record.layers().end());
  plan.num_stages = record.num_stages();
  plan.num_ranks = record.num_ranks();
  plan.replicas = std::max(1, record.replicas());
  plan.schedule_name = record.schedule();
  plan.num_microbatches = record.microbatches();
  plan.split = record.split();
  for (const v1::StageAssignment& st : record.stages()) {
    StagePlan& stage = plan.stages.emplace_back();
    stage.stage = st.stage();
    stage.first_layer = st.first_layer();
    stage.end_layer = st.end_layer();
    stage.parameters = st.parameters();
  }
  return plan;
}

void CheckCheckpoints(const RecoveryInput& input, bool forward_only, RecoveredState& out) {
  const std::string& id = input.job_id;
  if (input.resumed_from.has_value()) {
    const std::string& dir = input.resumed_from->directory();
    auto m = VerifyCheckpoint(dir);
    absl::StatusOr<ResumeLayout> files =
        m.ok() ? MatchResumeLayout(*m, dir, JobLayoutOf(input.layers, input.stage_first_layers),
                                   TiedAcrossStages(input.spec, input.stage_first_layers.size()))
               : absl::StatusOr<ResumeLayout>(m.status());
    if (files.ok()) {
      out.resume_files = std::move(files->stage_files);
      out.resume_by_name = files->by_name;
    } else {
      m = files.status();
      out.problems.push_back(
          absl::StrCat(id, ": the checkpoint it resumed from: ", m.status().message()));
    }
  }
  // Newest first: those past the recorded losses are kept for placement to set aside; the
  // first one the losses cover is verified in full; older ones are listed by their manifest.
  bool verified = false;
  std::vector<v1::JobCheckpoint> kept;
  for (auto c = input.checkpoints.rbegin(); c != input.checkpoints.rend(); ++c) {
    if (!forward_only && c->step() > input.losses_cover) {
      kept.push_back(*c);
      continue;
    }
    auto m = verified ? ReadManifest(c->directory()) : VerifyCheckpoint(c->directory());
    if (!m.ok()) {
      out.problems.push_back(absl::StrCat(id, ": checkpoint after step ", c->step(),
                                          " is unusable: ", m.status().message()));
      continue;
    }
    if (!verified) {
      // Written on another layout (before an elastic re-plan): restored by parameter name.
      absl::StatusOr<ResumeLayout> layout =
          MatchResumeLayout(*m, c->directory(), JobLayoutOf(input.layers, input.stage_first_layers),
                            TiedAcrossStages(input.spec, input.stage_first_layers.size()));
      if (layout.ok() && layout->by_name) {
        out.relayout_step = c->step();
        out.relayout_files = std::move(layout->stage_files);
      }
    }
    verified = true;
    kept.push_back(*c);
    for (const ManifestStage& st : m->stages) {
      out.checkpoint_stage_files[c->step()].push_back(st.files);
    }
  }
  out.checkpoints.assign(kept.rbegin(), kept.rend());
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

RecoveryInput RecoveryInput::Of(const Job& job) {
  RecoveryInput in;
  in.job_id = job.id;
  in.spec = job.spec;
  in.layers = job.plan.layers;
  for (const StagePlan& st : job.plan.stages) in.stage_first_layers.push_back(st.first_layer);
  in.checkpoints = job.checkpoints;
  in.resumed_from = job.resumed_from;
  in.losses_cover = job.base_step + static_cast<int64_t>(job.losses.size());
  return in;
}

RecoveredState PrepareRecovery(const RecoveryInput& input) {
  RecoveredState out;
  out.plan = PlanAgain(input, &out.inference);
  CheckCheckpoints(input, out.plan.ok() && !out.plan->has_backward, out);
  return out;
}

void ApplyRecovery(Job& job, RecoveredState state) {
  if (state.plan.ok()) {
    // Planned again on the recorded partition; the split says what first cut it.
    std::string split = std::move(job.plan.split);
    job.plan = *std::move(state.plan);
    if (!split.empty()) job.plan.split = std::move(split);
  }
  job.inference = state.inference;
  job.checkpoints = std::move(state.checkpoints);
  job.checkpoint_stage_files = std::move(state.checkpoint_stage_files);
  job.resume_files = std::move(state.resume_files);
  job.resume_by_name = state.resume_by_name;
  job.elastic.relayout_step = state.relayout_step;
  job.elastic.relayout_files = std::move(state.relayout_files);
  job.elastic.relayout_by_name = state.relayout_step >= 0;
  job.recovering = false;
}

absl::StatusOr<RebuiltJob> RebuildJob(const v1::Job& record) {
  RebuiltJob out;
  out.job = std::make_shared<Job>();
  Job& job = *out.job;
  job.id = record.id();
  auto spec = spec::ReadJobSpec(record.spec_yaml(), record.id());
  if (!spec.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(record.id(), ": its spec no longer parses (",
                                                   spec.status().message(), "); not loaded"));
  }
  job.spec = *std::move(spec);
  job.spec_yaml = record.spec_yaml();
  job.created = rpc::FromProtoTimestamp(record.created_time());
  job.plan = DescribedPlan(record);
  if (record.has_plan_choice()) job.plan_choice = record.plan_choice();
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
  job.missing_loss_steps.assign(record.missing_loss_steps().begin(),
                                record.missing_loss_steps().end());
  job.training.FromProto(record);
  if (record.has_resumed_from()) {
    job.resumed_from = record.resumed_from();
    job.base_step = record.resumed_from().step();
  }
  job.checkpoints.assign(record.checkpoints().begin(), record.checkpoints().end());
  job.finish_step = job.base_step + record.steps_total();
  job.attempt_base = record.global_steps_done();
  if (record.state() == v1::JOB_STATE_PAUSED || record.pause_at_global_step() > 0) {
    job.hold_step = record.pause_at_global_step();
  }
  if (IsFinal(record.state())) {
    RestoreFinishedRanks(record, job);
    // The record keeps no action lists (nor does an ended job in memory, past a few MiB):
    // GetJobSchedule says so instead of answering an empty schedule.
    job.actions_released = true;
  } else {
    out.recovering = job.recovering = true;
  }
  return out;
}

}  // namespace stagecoach::coordinator
