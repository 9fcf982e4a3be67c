// The built-in families' stages by family (model.builtin.family): mlp.h, gpt.h, llama.h.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"
#include "worker/model/stage_model.h"

namespace stagecoach::model {

// Layers [first_layer, end_layer) of the built-in model; INVALID_ARGUMENT naming
// model.builtin.family for a family this worker does not build, and the family's own errors.
absl::StatusOr<std::unique_ptr<StageModel>> BuildBuiltinStage(const spec::BuiltinModel& model,
                                                              int first_layer, int end_layer);

}  // namespace stagecoach::model
