// Reading the stage weights workers write into a checkpoint
// (worker/runtime/checkpoint/checkpoint.h, docs/checkpoints.md): one export file
// `step-NNNNNN/stage-S.state_dict.pt` per stage, a pickled dict of parameter name -> tensor that
// torch.load reads. Independent of the worker's code.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace stagecoach::testing {

// `dir`/step-%06d/stage-%d.state_dict.pt.
std::string StageFilePath(const std::string& dir, int64_t step, int stage);

// The file's parameters by name; an empty map (and a test failure) when it is missing.
std::map<std::string, torch::Tensor> LoadStageFile(const std::string& path);

// The MLP layer of a parameter name "{layer}.weight".
int LayerOf(const std::string& name);

// Every stage's weights after `step` steps, merged by name; a name found in two stages is a test
// failure. With `layers`, also each MLP stage's first and last layer (LayerOf its names).
struct StageLayers {
  int first = 1 << 20;
  int last = -1;
};
std::map<std::string, torch::Tensor> LoadAllStageFiles(const std::string& dir, int64_t step,
                                                       int stages,
                                                       std::vector<StageLayers>* layers = nullptr);

}  // namespace stagecoach::testing
