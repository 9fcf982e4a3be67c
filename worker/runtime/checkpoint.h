// Stage parameter files: what a worker writes into training.checkpoint.dir.
//
// Layout: <dir>/step-<N>/stage-<s>.pt after N completed steps, one file per stage, written
// atomically (a temporary file renamed into place). Each file is a pickled dict from parameter
// name ("3.weight") to tensor, readable by torch::pickle_load here and torch.load in PyTorch.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace stagecoach::runtime {

// Path of stage `stage`'s file after `steps` steps.
std::string StageParametersPath(const std::string& dir, int64_t steps, int stage);

// Writes the named tensors (detached, on CPU) to StageParametersPath(dir, steps, stage).
absl::Status WriteStageParameters(const std::string& dir, int64_t steps, int stage,
                                  const std::vector<std::pair<std::string, torch::Tensor>>& params);

}  // namespace stagecoach::runtime
