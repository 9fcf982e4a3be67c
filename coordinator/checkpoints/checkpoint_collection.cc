#include "coordinator/checkpoints/checkpoint_collection.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/checkpoint/layout.h"
#include "common/util/logging.h"
#include "common/util/sha256.h"
#include "common/util/status_macros.h"
#include "coordinator/checkpoints/hf_export_index.h"

namespace stagecoach::coordinator {
namespace {

// The step of a checkpoint step directory (the checkpoint layout's name), or -1.
int64_t StepOfEntry(const std::filesystem::directory_entry& entry) {
  return checkpoint::StepOfCheckpointDirectory(entry.path().filename().string()).value_or(-1);
}

}  // namespace

absl::Status ValidateCheckpointReport(const Job& job, const v1::ReportStepRequest& req) {
  const int64_t global_step = job.attempt_base + req.step() + 1;
  if (req.global_step() != 0 && req.global_step() != global_step) {
    return absl::InvalidArgumentError(
        absl::StrCat("global_step: rank ", req.rank(), " reported ", req.global_step(),
                     " after step ", req.step(), ", expected ", global_step, " (", job.attempt_base,
                     " steps before this attempt + ", req.step() + 1, ")"));
  }
  if (req.checkpoint_files_size() == 0) return absl::OkStatus();
  if (job.spec.training.checkpoint.dir.empty() || job.forward_only()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint_files: rank ", req.rank(), " reported a checkpoint, but job ", job.id,
        job.forward_only() ? " is forward-only" : " has no training.checkpoint.dir"));
  }
  for (const v1::StageCheckpointFile& f : req.checkpoint_files()) {
    if (f.stage() < 0 || f.stage() >= job.plan.num_stages ||
        job.plan.stage_to_rank[f.stage()] != req.rank()) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint_files: rank ", req.rank(),
                                                     " reported a file of stage ", f.stage(),
                                                     ", which it does not own"));
    }
    if (!checkpoint::IsCheckpointFileName(f.file()) || f.size_bytes() < 0 ||
        !IsSha256Hex(f.sha256())) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint_files: stage ", f.stage(), " file '", f.file(),
                       "' needs a plain file name (or hf/ and one), a size and a 64-digit "
                       "sha256"));
    }
  }
  return absl::OkStatus();
}

std::optional<PendingManifest> AddReportedFilesLocked(Job& job, const v1::ReportStepRequest& req) {
  if (req.checkpoint_files_size() == 0) return std::nullopt;
  const int64_t step = job.attempt_base + req.step() + 1;
  // A report sent again after its answer was lost (the worker retries unanswered calls) adds
  // nothing: its checkpoint is recorded already, or its files are listed already.
  for (const v1::JobCheckpoint& c : job.checkpoints) {
    if (c.step() == step) return std::nullopt;
  }
  auto& stages = job.checkpoint_files[step];
  for (const v1::StageCheckpointFile& f : req.checkpoint_files()) {
    std::vector<v1::StageCheckpointFile>& listed = stages[f.stage()];
    const bool known = std::any_of(listed.begin(), listed.end(),
                                   [&](const auto& g) { return g.file() == f.file(); });
    if (!known) listed.push_back(f);
  }
  if (static_cast<int>(stages.size()) < job.plan.num_stages) return std::nullopt;
  // With ZeRO-1 every replica adds its optimizer shard of each stage to replica 0's two files.
  if (job.spec.placement.shards() && job.plan.replicas > 1) {
    for (const auto& [s, files] : stages) {
      const bool has_parameters = job.plan.stages[s].parameters > 0;
      if (static_cast<int>(files.size()) < 2 + (has_parameters ? job.plan.replicas : 0)) {
        return std::nullopt;
      }
    }
  }

  PendingManifest pending;
  pending.job_id = job.id;
  pending.step_dir = CheckpointStepDirectory(job.spec.training.checkpoint.dir, step);
  pending.manifest = ManifestOfPlan(job.plan, step, stages);
  pending.manifest.job_id = job.id;
  pending.manifest.model_json = ModelReferenceJson(job.spec.model);
  if (job.spec.model.builtin.has_value()) pending.hf_config = job.spec.model.builtin->decoder;
  job.checkpoint_files.erase(step);
  return pending;
}

CheckpointManifest ManifestOfPlan(
    const Plan& plan, int64_t step,
    const std::map<int, std::vector<v1::StageCheckpointFile>>& files) {
  CheckpointManifest m;
  m.step = step;
  m.data_position = step;
  m.num_stages = plan.num_stages;
  m.schedule = plan.schedule_name;
  for (int s = 0; s < plan.num_stages; ++s) {
    ManifestStage& st = m.stages.emplace_back();
    st.stage = s;
    st.first_layer = plan.stages[s].first_layer;
    st.end_layer = plan.stages[s].end_layer;
    for (int l = st.first_layer; l < st.end_layer && l < static_cast<int>(plan.layers.size());
         ++l) {
      st.layers.push_back(plan.layers[l].name());
    }
    auto it = files.find(s);
    if (it != files.end()) st.files = it->second;
  }
  return m;
}

absl::Status WritePendingManifest(const PendingManifest& pending) {
  const std::string& dir = pending.step_dir;
  for (const ManifestStage& st : pending.manifest.stages) {
    for (const v1::StageCheckpointFile& f : st.files) {
      std::error_code ec;
      const auto size = std::filesystem::file_size(std::filesystem::path(dir) / f.file(), ec);
      if (ec) {
        return absl::DataLossError(
            absl::StrCat(f.file(), " (stage ", st.stage, ") is not in ", dir, ": ", ec.message()));
      }
      if (static_cast<int64_t>(size) != f.size_bytes()) {
        return absl::DataLossError(absl::StrCat(f.file(), " (stage ", st.stage, ") in ", dir,
                                                " has ", size, " bytes, its rank reported ",
                                                f.size_bytes()));
      }
    }
  }
  if (pending.hf_config.has_value()) {
    RETURN_IF_ERROR(WriteHfExportIndex(dir, pending.manifest, *pending.hf_config));
  }
  return WriteManifest(dir, pending.manifest);
}

void RecordCheckpointLocked(Job& job, const PendingManifest& pending) {
  const int64_t step = pending.manifest.step;
  auto& files = job.checkpoint_stage_files[step];
  files.clear();
  for (const ManifestStage& st : pending.manifest.stages) files.push_back(st.files);
  v1::JobCheckpoint& done = job.checkpoints.emplace_back();
  done.set_step(step);
  done.set_directory(pending.step_dir);
  done.set_manifest(ManifestPath(pending.step_dir));
  // Reports of one step arrive in order, but manifests are written off the lock: keep the list
  // ordered by step.
  std::sort(
      job.checkpoints.begin(), job.checkpoints.end(),
      [](const v1::JobCheckpoint& a, const v1::JobCheckpoint& b) { return a.step() < b.step(); });
  spdlog::info("{}: checkpoint at step {} complete: {}", job.id, step, done.manifest());
}

// The job's layers and partition as MatchResumeLayout wants them.
static JobLayout LayoutOf(const Plan& plan) {
  std::vector<int> firsts;
  for (const StagePlan& stage : plan.stages) firsts.push_back(stage.first_layer);
  return JobLayoutOf(plan.layers, std::move(firsts));
}

absl::StatusOr<std::optional<VerifiedResume>> VerifyResumeFrom(const spec::JobSpec& spec,
                                                               const Plan& plan) {
  const std::string& dir = spec.training.resume_from;
  if (dir.empty()) return std::nullopt;
  auto refused = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("training.resume_from: ", why));
  };
  absl::StatusOr<CheckpointManifest> m = VerifyCheckpoint(dir);
  if (!m.ok()) return refused(m.status().message());
  absl::StatusOr<ResumeLayout> layout =
      MatchResumeLayout(*m, dir, LayoutOf(plan), TiedAcrossStages(spec, plan.num_stages));
  if (!layout.ok()) return refused(layout.status().message());
  return std::optional<VerifiedResume>(VerifiedResume{*std::move(m), *std::move(layout)});
}

void ApplyResume(const std::optional<VerifiedResume>& checkpoint, Job& job) {
  if (!checkpoint.has_value()) return;
  const std::string& dir = job.spec.training.resume_from;
  v1::JobCheckpoint from;
  from.set_step(checkpoint->manifest.step);
  from.set_directory(dir);
  from.set_manifest(ManifestPath(dir));
  job.resumed_from = from;
  job.base_step = checkpoint->manifest.step;
  job.resume_files = checkpoint->layout.stage_files;
  job.resume_by_name = checkpoint->layout.by_name;
  spdlog::info("{} resumes from {} (step {}{})", job.id, from.directory(), from.step(),
               job.resume_by_name ? "; another layout: restored by parameter name" : "");
}

absl::Status CheckCheckpointTargetsFree(const spec::JobSpec& spec, int64_t base_step) {
  const spec::CheckpointSpec& ckpt = spec.training.checkpoint;
  if (ckpt.dir.empty()) return absl::OkStatus();
  const int64_t last = base_step + spec.training.steps;
  std::error_code error;
  for (std::filesystem::directory_iterator it(ckpt.dir, error), end; !error && it != end;
       it.increment(error)) {
    const int64_t step = StepOfEntry(*it);
    if (step < 0) continue;
    const bool written = step == last || (ckpt.every_steps > 0 && step > base_step && step < last &&
                                          step % ckpt.every_steps == 0);
    if (written) {
      return absl::InvalidArgumentError(absl::StrCat(
          "training.checkpoint.dir: ", it->path().string(),
          " already exists (another job's checkpoint after step ", step,
          "); this job would write there, and checkpoints are never overwritten: use another "
          "directory or remove it"));
    }
  }
  return absl::OkStatus();
}

void SetAsidePartialCheckpoints(const std::string& dir, int64_t after_step,
                                const std::string& tag) {
  std::error_code error;
  std::vector<std::filesystem::path> partial;
  for (std::filesystem::directory_iterator it(dir, error), end; !error && it != end;
       it.increment(error)) {
    const int64_t step = StepOfEntry(*it);
    if (step <= after_step) continue;
    if (std::filesystem::exists(ManifestPath(it->path().string()))) continue;
    partial.push_back(it->path());
  }
  for (const auto& path : partial) {
    std::filesystem::path aside = path;
    aside += absl::StrCat(".partial-", tag);
    std::error_code moved;
    std::filesystem::rename(path, aside, moved);
    if (moved) {
      spdlog::warn("cannot move partial checkpoint {} aside: {}", path.string(), moved.message());
    } else {
      spdlog::info("moved partial checkpoint {} to {}", path.string(), aside.string());
    }
  }
}

}  // namespace stagecoach::coordinator
