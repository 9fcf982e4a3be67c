// What tests share that run a pipeline's ranks as threads of one process, each with a real Gloo
// transport and its own PipelineExecutor (tests/integration): connecting a rank, its actions of a
// built schedule, the float32 shapes of its input microbatches, and its stages' gradients.
#pragma once

#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/schedule/build.h"
#include "worker/model/stage_model.h"
#include "worker/runtime/executor/pipeline_executor.h"
#include "worker/transport/gloo/factory.h"
#include "worker/transport/in_memory_store.h"

namespace stagecoach::testing {

// Rank `rank` of `ranks` over loopback Gloo, rendezvousing under `prefix` in `store`.
inline absl::StatusOr<std::unique_ptr<transport::Transport>> ConnectThreadRank(
    transport::InMemoryStore& store, const std::string& prefix, int rank, int ranks) {
  transport::GlooOptions gloo;
  gloo.rank = rank;
  gloo.world_size = ranks;
  gloo.key_prefix = prefix;
  gloo.connect_timeout = absl::Seconds(20);
  return transport::CreateGlooTransport(gloo, &store);
}

// The rank's actions of `built`, its idle slots dropped.
inline std::vector<schedule::Action> RankActions(const schedule::BuiltSchedule& built, int rank) {
  std::vector<schedule::Action> actions;
  for (const auto& a : built.lowered[rank]) {
    if (a.has_value()) actions.push_back(*a);
  }
  return actions;
}

// The float32 metas of stage 0's microbatches, for AgreeShapes.
inline std::vector<runtime::TensorMeta> Float32Metas(const std::vector<torch::Tensor>& microbatches) {
  std::vector<runtime::TensorMeta> metas;
  for (const auto& mb : microbatches) {
    metas.push_back(runtime::TensorMeta{mb.sizes().vec(), torch::kFloat32});
  }
  return metas;
}

// Every parameter's gradient of `stages`, cloned, by name.
inline std::map<std::string, torch::Tensor> GradientsByName(
    const std::map<int, model::StageModel*>& stages) {
  std::map<std::string, torch::Tensor> grads;
  for (const auto& [s, stage] : stages) {
    for (auto& [name, p] : stage->NamedParameters()) grads[name] = p.grad().clone();
  }
  return grads;
}

}  // namespace stagecoach::testing
