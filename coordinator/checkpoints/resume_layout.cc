#include "coordinator/checkpoints/resume_layout.h"

#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/spec/builtin_model.h"
#include "common/util/status_macros.h"

namespace stagecoach::coordinator {
namespace {

// The layers [first, end) of the job's stage `s`.
std::pair<int, int> StageRange(const JobLayout& job, int s) {
  const int n = static_cast<int>(job.layer_names.size());
  const int first = job.stage_first_layers[s];
  const int end =
      s + 1 < static_cast<int>(job.stage_first_layers.size()) ? job.stage_first_layers[s + 1] : n;
  return {first, end};
}

bool SameLayout(const CheckpointManifest& m, const JobLayout& job) {
  if (m.num_stages != static_cast<int>(job.stage_first_layers.size())) return false;
  for (int s = 0; s < m.num_stages; ++s) {
    const auto [first, end] = StageRange(job, s);
    const ManifestStage& saved = m.stages[s];
    if (saved.first_layer != first || saved.end_layer != end ||
        static_cast<int>(saved.layers.size()) != end - first) {
      return false;
    }
    for (int l = first; l < end; ++l) {
      if (saved.layers[l - first] != job.layer_names[l]) return false;
    }
  }
  return true;
}

// The checkpoint file a stage reads: its training state and optimizer shards, not its export.
bool ReadOnResume(const v1::StageCheckpointFile& f) {
  return f.file() != checkpoint::StageExportFileName(f.stage()) &&
         !absl::StartsWith(f.file(), "hf/");
}

absl::Status CheckJobLayout(const JobLayout& job) {
  const int n = static_cast<int>(job.layer_names.size());
  if (job.stage_first_layers.empty() || job.stage_first_layers[0] != 0) {
    return absl::InvalidArgumentError("the job's plan has no stages starting at layer 0");
  }
  for (size_t s = 1; s < job.stage_first_layers.size(); ++s) {
    if (job.stage_first_layers[s] <= job.stage_first_layers[s - 1] ||
        job.stage_first_layers[s] >= n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the job's plan has stage ", s, " starting at layer ", job.stage_first_layers[s]));
    }
  }
  return absl::OkStatus();
}

}  // namespace

JobLayout JobLayoutOf(const std::vector<v1::LayerInfo>& layers,
                      std::vector<int> stage_first_layers) {
  JobLayout out;
  for (const v1::LayerInfo& layer : layers) out.layer_names.push_back(layer.name());
  out.stage_first_layers = std::move(stage_first_layers);
  return out;
}

bool LayersOverlap(const std::string& a, const std::string& b) {
  if (a == b) return true;
  const std::string& shorter = a.size() < b.size() ? a : b;
  const std::string& longer = a.size() < b.size() ? b : a;
  return absl::StartsWith(longer, shorter) && longer[shorter.size()] == '.';
}

absl::StatusOr<ResumeLayout> MatchResumeLayout(const CheckpointManifest& checkpoint,
                                               const std::string& dir, const JobLayout& job,
                                               bool tied) {
  RETURN_IF_ERROR(CheckJobLayout(job));
  if (checkpoint.stages.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint ", dir, " has no stages"));
  }
  ResumeLayout out;
  const int stages = static_cast<int>(job.stage_first_layers.size());
  out.stage_files.resize(stages);
  if (SameLayout(checkpoint, job)) {
    for (int s = 0; s < stages; ++s) out.stage_files[s] = checkpoint.stages[s].files;
    return out;
  }
  out.by_name = true;
  // Which checkpoint stages hold each of the job's layers, and every checkpoint layer is held.
  std::vector<std::set<int>> sources(stages);
  std::set<std::string> matched_saved;
  for (int s = 0; s < stages; ++s) {
    const auto [first, end] = StageRange(job, s);
    for (int l = first; l < end; ++l) {
      const std::string& name = job.layer_names[l];
      bool found = false;
      for (const ManifestStage& saved : checkpoint.stages) {
        for (const std::string& layer : saved.layers) {
          if (!LayersOverlap(layer, name)) continue;
          sources[s].insert(saved.stage);
          matched_saved.insert(layer);
          found = true;
        }
      }
      if (!found) {
        return absl::InvalidArgumentError(absl::StrCat(
            "layer '", name, "' of this job's model (stage ", s, ") is in no stage of checkpoint ",
            dir, " (was it written for another model?)"));
      }
    }
  }
  for (const ManifestStage& saved : checkpoint.stages) {
    for (const std::string& layer : saved.layers) {
      if (matched_saved.count(layer) == 0) {
        return absl::InvalidArgumentError(absl::StrCat("checkpoint ", dir, " holds layer '", layer,
                                                       "' (its stage ", saved.stage,
                                                       "), which this job's model does not have"));
      }
    }
  }
  if (tied && stages > 1) sources[stages - 1].insert(sources[0].begin(), sources[0].end());
  for (int s = 0; s < stages; ++s) {
    for (int source : sources[s]) {
      for (const v1::StageCheckpointFile& f : checkpoint.stages[source].files) {
        if (ReadOnResume(f)) out.stage_files[s].push_back(f);
      }
    }
  }
  return out;
}

bool TiedAcrossStages(const spec::JobSpec& spec, int num_stages) {
  const auto& builtin = spec.model.builtin;
  return builtin.has_value() && spec::IsDecoder(*builtin) && builtin->tie_embeddings &&
         num_stages > 1;
}

}  // namespace stagecoach::coordinator
