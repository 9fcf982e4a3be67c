#include "worker/runtime/task/checkpoint_steps.h"

#include <torch/torch.h>

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/util/logging.h"
#include "common/util/sha256.h"
#include "common/util/status_macros.h"
#include "worker/runtime/checkpoint/checkpoint.h"
#include "worker/runtime/checkpoint/hf_export.h"

namespace stagecoach::runtime {

CheckpointSteps::CheckpointSteps(CheckpointStepsOptions options,
                                 const std::map<int, model::StageModel*>& stages,
                                 const torch::optim::Optimizer* optimizer,
                                 const StepReports* reports, const ZeroShards* shards)
    : options_(std::move(options)),
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
                                          stage->NamedBuffers(), *optimizer_,
                                          /*data_position=*/global_steps, Omitted(s)));
    for (auto& file : files) *report->add_checkpoint_files() = std::move(file);
    if (options_.hf_export) {
      ASSIGN_OR_RETURN(files, WriteHfExport(CheckpointStepDir(dir_, global_steps), s,
                                            stage->NamedParameters(), Omitted(s),
                                            options_.hf_part_bytes));
      for (auto& file : files) *report->add_checkpoint_files() = std::move(file);
    }
  }
  spdlog::info("{} rank {}: checkpoint after step {} in {}", report->job_id(), options_.rank,
               global_steps, CheckpointStepDir(dir_, global_steps));
  last_ = global_steps;
  return absl::OkStatus();
}

void CheckpointSteps::AddDigests(v1::ReportStepRequest* report) const {
  for (const auto& [s, stage] : stages_) {
    Sha256 digest;
    for (const torch::Tensor& p : stage->Parameters()) {
      const torch::Tensor bytes = p.detach().to(torch::kCPU).contiguous();
      digest.Update(absl::string_view(static_cast<const char*>(bytes.data_ptr()),
                                      bytes.numel() * bytes.element_size()));
    }
    (*report->mutable_parameter_digests())[s] = digest.FinalHex();
  }
}

absl::Status CheckpointSteps::AfterStep(int64_t global_steps, bool requested,
                                        v1::ReportStepRequest* report) {
  const bool every = options_.every_steps > 0 && global_steps % options_.every_steps == 0;
  if (dir_.empty() || !(requested || every)) return absl::OkStatus();
  if (options_.digests) AddDigests(report);
  if (!(writer_ || shards_ != nullptr)) return absl::OkStatus();
  return Write(global_steps, report);
}

absl::Status CheckpointSteps::AtHold(int64_t global_steps, int64_t task_step) {
  if (dir_.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", options_.rank,
                     ": a checkpoint was asked for, but the job has no training.checkpoint.dir"));
  }
  if (!(writer_ || shards_ != nullptr) || last_ == global_steps) return absl::OkStatus();
  v1::ReportStepRequest report = reports_->CheckpointOnly(task_step, global_steps);
  RETURN_IF_ERROR(Write(global_steps, &report));
  reports_->Send(report);
  return absl::OkStatus();
}

}  // namespace stagecoach::runtime
