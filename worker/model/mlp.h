// The built-in MLP family (model.builtin {family: mlp, sizes: [in, h1, ..., out], seed}).
// Layer i is Linear(sizes[i], sizes[i+1]) followed by ReLU, except after the last layer.
// Parameter names are "{i}.weight" and "{i}.bias" with i the layer index in the whole model.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"
#include "worker/model/stage_model.h"

namespace stagecoach::model {

// Builds layers [first_layer, end_layer) of the MLP. Every worker builds the whole model's
// parameters in layer order from the spec's seed and keeps only its own, so that the stages of
// all workers together are exactly one model: the one `torch.manual_seed(seed)` followed by
// building nn.Linear layers in order gives in PyTorch. INVALID_ARGUMENT for a layer range
// outside the model.
absl::StatusOr<std::unique_ptr<StageModel>> BuildMlpStage(const spec::BuiltinModel& model,
                                                          int first_layer, int end_layer);

}  // namespace stagecoach::model
