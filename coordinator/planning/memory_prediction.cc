#include "coordinator/planning/memory_prediction.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/schedule/simulator.h"
#include "coordinator/planning/plan_costs.h"

namespace stagecoach::coordinator {
namespace {

constexpr double kBytesPerParameter = 4;  // fp32 weights, gradients and optimizer buffers

schedule::OptimizerKind OptimizerOf(const spec::OptimizerSpec& optimizer) {
  if (optimizer.kind == "adamw") return schedule::OptimizerKind::kAdamW;
  return optimizer.momentum > 0 ? schedule::OptimizerKind::kSgdMomentum
                                : schedule::OptimizerKind::kSgd;
}

// What a split backward holds from I to W: measured (weight_pending_bytes, less the stage's
// input, which the model keeps as its receive buffer until W), else estimated as everything but
// the output plus a gradient the size of each layer's output. With the measurement, the W's
// transient is the most any layer's W allocated (weight_transient_bytes), replacing the
// estimate StageMemoryModel set (its largest layer's parameters).
void SetWeightPending(const Plan& plan, const StagePlan& stage, bool recompute,
                      schedule::StageMemory& m) {
  double measured = 0;
  bool has_measured = false;
  for (int l = stage.first_layer; l < stage.end_layer; ++l) {
    measured += static_cast<double>(plan.layers[l].weight_pending_bytes());
    has_measured = has_measured || plan.layers[l].weight_pending_bytes() > 0;
  }
  if (has_measured) {
    // The W's own temporaries, measured with the weight gradients already in .grad: a weight
    // gradient computed straight into .grad adds none, a bias's is computed apart.
    m.weight_transient = 0;
    for (int l = stage.first_layer; l < stage.end_layer; ++l) {
      m.weight_transient = std::max(m.weight_transient,
                                    static_cast<double>(plan.layers[l].weight_transient_bytes()));
    }
  }
  if (has_measured && !recompute) {
    if (stage.first_layer > 0) {
      measured -= static_cast<double>(plan.layers[stage.first_layer - 1].output_bytes());
    }
    measured = std::max(measured, 0.0);
    m.weight_activations = std::min(m.activations, measured);
    m.weight_gradients = measured - m.weight_activations;
    return;
  }
  m.weight_activations = std::max(0.0, m.activations - m.output);
  for (int l = stage.first_layer; l < stage.end_layer; ++l) {
    m.weight_gradients += static_cast<double>(plan.layers[l].output_bytes());
  }
}

}  // namespace

schedule::MemoryModel StageMemoryModel(const spec::JobSpec& spec, const Plan& plan) {
  schedule::MemoryModel model;
  const bool recompute = spec.training.activation_checkpointing == "full";
  const int replicas = std::max(1, plan.replicas);
  const spec::ShardLevel level = replicas > 1 ? spec.placement.shard : spec::ShardLevel::kNone;
  const int shards = level != spec::ShardLevel::kNone ? replicas : 1;
  for (const StagePlan& stage : plan.stages) {
    schedule::StageMemory m;
    const double whole = kBytesPerParameter * static_cast<double>(stage.parameters);
    // One replica's shard of the stage's flat parameters, padded (sharding/zero_shards.h).
    const double shard =
        kBytesPerParameter * static_cast<double>((stage.parameters + shards - 1) / shards);
    m.parameters = whole;
    m.gradients = whole;
    if (level == spec::ShardLevel::kOptimizer || level == spec::ShardLevel::kGradients) {
      m.parameters = whole + 2 * shard;  // the optimizer's shard and its gradient
    } else if (level == spec::ShardLevel::kParameters) {
      m.parameters = 2 * shard;
      m.gathered_parameters = shard * shards;
    }
    m.gradients_freed_at_reduce = level >= spec::ShardLevel::kGradients;
    m.optimizer_state =
        schedule::OptimizerStateBytes(OptimizerOf(spec.training.optimizer), whole, shards);
    double kept = 0;
    double transient = 0;  // the layers' backwards run one after another
    for (int l = stage.first_layer; l < stage.end_layer; ++l) {
      kept += static_cast<double>(plan.layers[l].activation_bytes());
      // A layer's measured backward includes its input's gradient (the previous layer's output
      // size; none for the data): the model counts the stage's own apart (its input gradient).
      const double input_grad =
          l > 0 ? static_cast<double>(plan.layers[l - 1].output_bytes()) : 0.0;
      transient = std::max(
          transient, static_cast<double>(plan.layers[l].backward_transient_bytes()) - input_grad);
      m.weight_transient =
          std::max(m.weight_transient,
                   kBytesPerParameter * static_cast<double>(plan.layers[l].parameters()));
      m.forward_transient = std::max(m.forward_transient,
                                     static_cast<double>(plan.layers[l].forward_transient_bytes()));
    }
    m.output = stage.end_layer > stage.first_layer
                   ? static_cast<double>(plan.layers[stage.end_layer - 1].output_bytes())
                   : 0;
    m.backward_transient = transient;
    if (recompute) {
      m.activations = std::min(m.output, kept);
      m.backward_transient += kept;
    } else {
      m.activations = kept;
    }
    SetWeightPending(plan, stage, recompute, m);
    model.per_stage.push_back(m);
  }
  return model;
}

absl::StatusOr<std::vector<PredictedRankMemory>> PredictMemory(const spec::JobSpec& spec,
                                                               const Plan& plan) {
  if (!plan.has_backward || !HasMeasuredSizes(plan)) return std::vector<PredictedRankMemory>();
  auto sim =
      schedule::Simulate(plan.lowered, plan.stage_to_rank, plan.num_stages, plan.num_microbatches,
                         PlanCostModel(plan, DefaultCostAssumptions()));
  if (!sim.ok()) {
    return absl::InternalError(absl::StrCat("predicting memory: simulating the ",
                                            plan.schedule_name,
                                            " schedule failed: ", sim.status().message()));
  }
  return PredictMemory(spec, plan, *sim);
}

absl::StatusOr<std::vector<PredictedRankMemory>> PredictMemory(
    const spec::JobSpec& spec, const Plan& plan, const schedule::Simulation& simulation) {
  if (!plan.has_backward || !HasMeasuredSizes(plan)) return std::vector<PredictedRankMemory>();
  auto profile = schedule::SimulateMemory(simulation, plan.stage_to_rank, plan.num_stages,
                                          StageMemoryModel(spec, plan));
  if (!profile.ok()) {
    return absl::InternalError(absl::StrCat("predicting memory: ", profile.status().message()));
  }
  std::vector<PredictedRankMemory> out;
  for (const schedule::RankMemory& rank : profile->ranks) {
    out.push_back({static_cast<int64_t>(std::llround(rank.static_bytes)),
                   static_cast<int64_t>(std::llround(rank.peak_dynamic)), rank.peak_action});
  }
  return out;
}

bool HasMeasuredSizes(const std::vector<v1::LayerInfo>& layers) {
  return std::any_of(layers.begin(), layers.end(), [](const v1::LayerInfo& layer) {
    return layer.activation_bytes() > 0 || layer.output_bytes() > 0;
  });
}

bool HasMeasuredSizes(const Plan& plan) { return HasMeasuredSizes(plan.layers); }

}  // namespace stagecoach::coordinator
