#include "worker/runtime/checkpoint_steps.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/util/logging.h"
#include "common/util/status_macros.h"
#include "worker/runtime/checkpoint.h"

namespace stagecoach::runtime {

CheckpointSteps::CheckpointSteps(std::string dir, int64_t every_steps, int rank, bool writer,
                                 const std::map<int, model::StageModel*>& stages,
                                 const torch::optim::Optimizer* optimizer,
                                 const StepReports* reports, const ZeroShards* shards)
    : dir_(std::move(dir)),
      every_steps_(every_steps),
      rank_(rank),
      writer_(writer),
      stages_(stages),
      optimizer_(optimizer),
      reports_(reports),
      shards_(shards) {}

absl::Status CheckpointSteps::Write(int64_t global_steps, v1::ReportStepRequest* report) {
  if (shards_ != nullptr) {
    ASSIGN_OR_RETURN(std::vector<v1::StageCheckpointFile> files,
                     shards_->WriteShardFiles(dir_, global_steps, *optimizer_));
    for (auto& file : files) *report->add_checkpoint_files() = std::move(file);
  }
  for (const auto& [s, stage] : stages_) {
    if (!writer_) break;
    ASSIGN_OR_RETURN(std::vector<v1::StageCheckpointFile> files,
                     WriteStageCheckpoint(dir_, global_steps, s, stage->NamedParameters(),
                                          *optimizer_, /*data_position=*/global_steps));
    for (auto& file : files) *report->add_checkpoint_files() = std::move(file);
  }
  spdlog::info("{} rank {}: checkpoint after step {} in {}", report->job_id(), rank_, global_steps,
               CheckpointStepDir(dir_, global_steps));
  last_ = global_steps;
  return absl::OkStatus();
}

absl::Status CheckpointSteps::AfterStep(int64_t global_steps, bool requested,
                                        v1::ReportStepRequest* report) {
  const bool every = every_steps_ > 0 && global_steps % every_steps_ == 0;
  if (dir_.empty() || !(writer_ || shards_ != nullptr) || !(requested || every)) {
    return absl::OkStatus();
  }
  return Write(global_steps, report);
}

absl::Status CheckpointSteps::AtHold(int64_t global_steps, int64_t task_step) {
  if (dir_.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank_,
                     ": a checkpoint was asked for, but the job has no training.checkpoint.dir"));
  }
  if (!(writer_ || shards_ != nullptr) || last_ == global_steps) return absl::OkStatus();
  v1::ReportStepRequest report = reports_->CheckpointOnly(task_step, global_steps);
  RETURN_IF_ERROR(Write(global_steps, &report));
  reports_->Send(report);
  return absl::OkStatus();
}

}  // namespace stagecoach::runtime
