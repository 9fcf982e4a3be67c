#include "worker/runtime/task/checkpoint_steps.h"

#include <torch/torch.h>

#include <cstdlib>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/util/logging.h"
#include "common/util/sha256.h"
#include "common/util/status_macros.h"
#include "worker/runtime/checkpoint/checkpoint.h"
#include "worker/runtime/checkpoint/hf_export.h"

namespace stagecoach::runtime {

namespace {

absl::Duration StallFromEnvironment() {
  const char* value = std::getenv("STAGECOACH_FAULT_CHECKPOINT_STALL_MS");
  int64_t ms = 0;
  if (value == nullptr || !absl::SimpleAtoi(value, &ms) || ms <= 0) return absl::ZeroDuration();
  return absl::Milliseconds(ms);
}

}  // namespace

CheckpointSteps::CheckpointSteps(CheckpointStepsOptions options,
                                 const std::map<int, model::StageModel*>& stages,
                                 const torch::optim::Optimizer* optimizer,
                                 const StepReports* reports, const ZeroShards* shards,
                                 ParameterGathering* gathering)
    : options_(std::move(options)),
      stages_(stages),
      optimizer_(optimizer),
      reports_(reports),
      shards_(shards),
      gathering_(gathering),
      stall_(StallFromEnvironment()),
      background_(absl::StrCat("rank ", options_.rank, "'s asynchronous checkpoint"),
                  options_.write_timeout) {}

absl::StatusOr<std::vector<StateSnapshot>> CheckpointSteps::Snapshot(int64_t global_steps) const {
  std::vector<StateSnapshot> snapshots;
  if (shards_ != nullptr) {
    ASSIGN_OR_RETURN(snapshots, shards_->SnapshotShardFiles(global_steps, *optimizer_));
  }
  for (const auto& [s, stage] : stages_) {
    if (!writer_) break;
    ASSIGN_OR_RETURN(snapshots.emplace_back(),
                     SnapshotState(s, global_steps, StageStateFileName(s), true,
                                   stage->NamedParameters(), stage->NamedBuffers(), *optimizer_,
                                   /*data_position=*/global_steps, Omitted(s)));
  }
  return snapshots;
}

absl::StatusOr<std::vector<v1::StageCheckpointFile>> CheckpointSteps::WriteAll(
    const std::vector<StateSnapshot>& snapshots) const {
  std::vector<v1::StageCheckpointFile> out;
  for (const StateSnapshot& snapshot : snapshots) {
    // A task that ended without draining (stopped, failed) wants no more files: a later attempt
    // may write this step again once the coordinator set the partial directory aside.
    if (background_.abandoned()) {
      return absl::CancelledError(absl::StrCat("the task ended during checkpoint ",
                                               CheckpointStepDir(dir_, snapshot.global_step)));
    }
    ASSIGN_OR_RETURN(std::vector<v1::StageCheckpointFile> files, WriteSnapshot(dir_, snapshot));
    if (snapshot.with_export && options_.hf_export) {
      ASSIGN_OR_RETURN(std::vector<v1::StageCheckpointFile> hf,
                       WriteHfExport(CheckpointStepDir(dir_, snapshot.global_step), snapshot.stage,
                                     snapshot.values, "", options_.hf_part_bytes));
      files.insert(files.end(), hf.begin(), hf.end());
    }
    for (auto& file : files) out.push_back(std::move(file));
    if (stall_ > absl::ZeroDuration()) absl::SleepFor(stall_);
  }
  return out;
}

absl::Status CheckpointSteps::Write(int64_t global_steps, v1::ReportStepRequest* report,
                                    bool async) {
  if (async) RETURN_IF_ERROR(background_.Drain());  // one copy held at a time
  ASSIGN_OR_RETURN(std::vector<StateSnapshot> snapshots, Snapshot(global_steps));
  last_ = global_steps;
  const std::string where = CheckpointStepDir(dir_, global_steps);
  if (!async) {
    ASSIGN_OR_RETURN(std::vector<v1::StageCheckpointFile> files, WriteAll(snapshots));
    for (auto& file : files) *report->add_checkpoint_files() = std::move(file);
    spdlog::info("{} rank {}: checkpoint after step {} in {}", report->job_id(), options_.rank,
                 global_steps, where);
    return absl::OkStatus();
  }
  v1::ReportStepRequest done = reports_->CheckpointOnly(report->step(), global_steps);
  return background_.Start([this, snapshots = std::move(snapshots), done = std::move(done),
                            where]() mutable -> absl::Status {
    ASSIGN_OR_RETURN(std::vector<v1::StageCheckpointFile> files, WriteAll(snapshots));
    if (background_.abandoned()) return absl::OkStatus();
    for (auto& file : files) *done.add_checkpoint_files() = std::move(file);
    reports_->Send(done);
    spdlog::info("{} rank {}: checkpoint after step {} in {} (written asynchronously)",
                 done.job_id(), options_.rank, done.global_step(), where);
    return absl::OkStatus();
  });
}

absl::Status CheckpointSteps::Drain() { return background_.Drain(); }

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
  return WithWholeParameters([&]() -> absl::Status {
    if (options_.digests) AddDigests(report);
    if (!(writer_ || shards_ != nullptr)) return absl::OkStatus();
    return Write(global_steps, report, options_.async);
  });
}

absl::Status CheckpointSteps::WithWholeParameters(const std::function<absl::Status()>& write) {
  if (gathering_ == nullptr) return write();
  RETURN_IF_ERROR(gathering_->GatherAll());
  const absl::Status written = write();
  gathering_->ReleaseAll();
  return written;
}

absl::Status CheckpointSteps::AtHold(int64_t global_steps, int64_t task_step) {
  if (dir_.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", options_.rank,
                     ": a checkpoint was asked for, but the job has no training.checkpoint.dir"));
  }
  RETURN_IF_ERROR(background_.Drain());
  if (!(writer_ || shards_ != nullptr) || last_ == global_steps) return absl::OkStatus();
  v1::ReportStepRequest report = reports_->CheckpointOnly(task_step, global_steps);
  RETURN_IF_ERROR(WithWholeParameters(
      [&]() -> absl::Status { return Write(global_steps, &report, /*async=*/false); }));
  reports_->Send(report);
  return absl::OkStatus();
}

}  // namespace stagecoach::runtime
