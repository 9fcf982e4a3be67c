#include "coordinator/lifecycle/task_assignment.h"

#include <algorithm>
#include <set>

#include "common/rpc/address.h"
#include "common/rpc/time_conversion.h"
#include "coordinator/checkpoints/resume_layout.h"

namespace stagecoach::coordinator {

std::vector<int> SnapshotHolders(const std::vector<RankSlot>& ranks, int num_ranks) {
  if (num_ranks <= 1) return std::vector<int>(std::max(num_ranks, 0), -1);
  auto host = [&](int r) {
    auto parsed = rpc::ParseHostPort(ranks[r].worker_address, "worker address");
    return parsed.ok() ? parsed->host : ranks[r].worker_address;
  };
  std::vector<int> holders(num_ranks);
  for (int r = 0; r < num_ranks; ++r) {
    holders[r] = (r + 1) % num_ranks;
    if (static_cast<int>(ranks.size()) < num_ranks) continue;
    for (int k = 1; k < num_ranks; ++k) {
      const int q = (r + k) % num_ranks;
      if (host(q) != host(r)) {
        holders[r] = q;
        break;
      }
    }
  }
  return holders;
}

v1::TaskAssignment BuildTaskAssignment(const Job& job, const RankSlot& slot,
                                       const AttemptStart& start, int64_t step_limit,
                                       const TaskSettings& settings) {
  const Plan& plan = job.plan;
  const int r = slot.rank;
  v1::TaskAssignment task;
  task.set_job_id(job.id);
  task.set_attempt(job.attempt);
  task.set_rank(r);
  task.set_world_size(plan.num_ranks);
  task.set_replica(slot.replica);
  task.set_replicas(plan.replicas);
  task.set_settle_steps(job.replica_health.carry_on());
  task.set_num_stages(plan.num_stages);
  for (int owner : plan.stage_to_rank) task.add_stage_to_rank(owner);
  for (int s : slot.stages) {
    v1::StageAssignment* st = task.add_stages();
    st->set_stage(s);
    st->set_first_layer(plan.stages[s].first_layer);
    st->set_end_layer(plan.stages[s].end_layer);
    st->set_parameters(plan.stages[s].parameters);
  }
  for (const v1::LayerInfo& layer : plan.layers) task.add_layer_names(layer.name());
  for (const StagePlan& stage : plan.stages) task.add_stage_first_layers(stage.first_layer);
  for (const auto& a : slot.actions) task.add_actions(a);
  task.set_spec_yaml(job.spec_yaml);
  task.set_rendezvous_prefix(job.RendezvousPrefix());
  if (job.spec.training.snapshot.every_steps > 0) {
    for (int holder : SnapshotHolders(job.ranks, plan.num_ranks)) task.add_snapshot_holders(holder);
  }
  task.set_transport(plan.transport);
  *task.mutable_comm_timeout() = rpc::ToProtoDuration(settings.comm_timeout);
  task.set_forward_only(job.forward_only());
  task.set_step_limit(step_limit);
  // T of training.lr_schedule: the timeline as the spec plans it (RunSteps extensions stay at
  // min_lr).
  task.set_timeline_steps(job.base_step + job.spec.training.steps);
  task.set_finish_at_limit(job.inference);
  *task.mutable_hold_timeout() = rpc::ToProtoDuration(settings.hold_timeout);
  if (!job.forward_only() && !job.spec.training.checkpoint.dir.empty()) {
    task.add_checkpoint_steps(job.finish_step);
  }
  if (start.checkpoint.has_value()) {
    v1::ResumeTask* resume = task.mutable_resume();
    resume->set_directory(start.checkpoint->directory());
    resume->set_step(start.checkpoint->step());
    resume->set_by_name(start.by_name);
    if (start.snapshot.has_value()) *resume->mutable_snapshot() = *start.snapshot;
    std::set<std::string> listed;
    for (int s : slot.stages) {
      for (const v1::StageCheckpointFile& f : start.stage_files[s]) {
        if (listed.insert(f.file()).second) *resume->add_files() = f;
      }
    }
    // Tied embeddings on different stages: the last stage's copy is restored from stage 0's
    // training-state file (the checkpoint holds the weight once). By name, the last stage's
    // files already include it (resume_layout.h).
    const bool tied = !start.by_name && TiedAcrossStages(job.spec, plan.num_stages);
    const bool holds_first =
        std::find(slot.stages.begin(), slot.stages.end(), 0) != slot.stages.end();
    const bool holds_last = std::find(slot.stages.begin(), slot.stages.end(),
                                      plan.num_stages - 1) != slot.stages.end();
    if (tied && holds_last && !holds_first) {
      for (const v1::StageCheckpointFile& f : start.stage_files[0]) {
        if (listed.insert(f.file()).second) *resume->add_files() = f;
      }
    }
  }
  if (job.inference && plan.stage_to_rank[0] == r) {
    *task.mutable_inference()->mutable_inputs() = job.inference_inputs;
  } else if (job.inference) {
    task.mutable_inference();
  }
  return task;
}

}  // namespace stagecoach::coordinator
