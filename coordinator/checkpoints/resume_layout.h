// Which files of a checkpoint each stage of a job reads when it resumes (training.resume_from,
// or a restart from the checkpoint it resumed from): the checkpoint's stage s for stage s when
// the checkpoint was written on this job's layout, else, by parameter name, every checkpoint
// stage that holds a layer of the job's stage (any stage count, split points or nesting depth
// of the layers: "encoder" in the checkpoint holds the job's "encoder.layers.encoder_layer_2").
// Pure: no disk, no LibTorch (the workers match the parameters themselves,
// worker/runtime/checkpoint/checkpoint_by_name.h).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"
#include "coordinator/checkpoints/checkpoint_manifest.h"
#include "stagecoach/v1/types.pb.h"

namespace stagecoach::coordinator {

// The job's layers, by name, and the first layer of each of its stages (Plan::stages).
struct JobLayout {
  std::vector<std::string> layer_names;
  std::vector<int> stage_first_layers;
};

// The layout of a job's `layers` cut before each of `stage_first_layers`.
JobLayout JobLayoutOf(const std::vector<v1::LayerInfo>& layers,
                      std::vector<int> stage_first_layers);

struct ResumeLayout {
  // The checkpoint's stages are not the job's: restore by name (ResumeTask.by_name).
  bool by_name = false;
  // Indexed by the job's stage: the checkpoint files that stage reads (training-state files and
  // optimizer shard files; no exports), each file once, in checkpoint stage order.
  std::vector<std::vector<v1::StageCheckpointFile>> stage_files;
};

// Whether one layer name holds the other: equal, or one is a dotted prefix of the other
// ("blocks" holds "blocks.3.attn", not "blocks3").
bool LayersOverlap(const std::string& a, const std::string& b);

// The files each stage of `job` reads from `checkpoint` (written in `dir`). With `tied` (a tied
// embedding whose copy sits in the job's last stage, tied_parameters.h), the last stage also
// reads the checkpoint stage that holds the job's first layer. INVALID_ARGUMENT naming `dir` and
// the layer when a layer of the job is in no stage of the checkpoint ("another model"), or a
// layer of the checkpoint is in none of the job's; INVALID_ARGUMENT for a layout that is not one
// (no stages, first layers out of order).
absl::StatusOr<ResumeLayout> MatchResumeLayout(const CheckpointManifest& checkpoint,
                                               const std::string& dir, const JobLayout& job,
                                               bool tied);

// Whether a job of `spec` on `num_stages` stages keeps a tied embedding copy in its last stage
// (a built-in decoder with tied embeddings on more than one stage).
bool TiedAcrossStages(const spec::JobSpec& spec, int num_stages);

}  // namespace stagecoach::coordinator
