// The elastic job the coordinator's elastic unit tests plan and re-plan: an 8-layer MLP cut into
// 4 stages of 2 layers (split.points) on 4 workers, restart.elastic with min_workers 2, wait 5s.
#pragma once

namespace stagecoach::coordinator {

inline constexpr char kFourStageElasticJob[] = R"(name: elastic
model:
  builtin: {family: mlp, sizes: [8, 16, 16, 16, 16, 16, 16, 16, 4], seed: 1}
split:
  points: {"2": beginning, "4": beginning, "6": beginning}
schedule: {kind: 1F1B, microbatches: 4}
placement: {workers: 4}
training:
  batch_size: 16
  optimizer: {kind: sgd, lr: 0.1}
data: {kind: synthetic}
restart: {max_restarts: 2, elastic: true, min_workers: 2, wait: 5s}
)";

}  // namespace stagecoach::coordinator
