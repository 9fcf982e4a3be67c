// The planner's memory prediction (coordinator/planning/memory_prediction.h): the per-stage model
// it builds from measured layer sizes and the recipe, worked by hand, and the prediction PlanJob
// attaches to a plan (none without measured sizes, none for forward-only plans).
#include "coordinator/planning/memory_prediction.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/spec/spec_parser.h"
#include "coordinator/planning/planner.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stagecoach::coordinator::memory_prediction_test {
namespace {

spec::JobSpec Parse(const std::string& schedule, const std::string& training = "",
                    const std::string& placement = "{workers: 4}") {
  auto spec = spec::ParseJobSpec(
      absl::StrCat("name: t\nmodel: {builtin: {family: mlp, sizes: [4, 8, 8, 8, 8, 8, 8, 8, 2]}}\n"
                   "split: {stages: 4}\nschedule: ",
                   schedule, "\nplacement: ", placement, "\ntraining: {batch_size: 16", training,
                   "}\n"),
      "t");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

// Eight layers of 100 parameters; each keeps 1,000 bytes, outputs 200 and allocates at most
// 300 + l in its backward (its input's 200-byte gradient included).
std::vector<v1::LayerInfo> MeasuredLayers() {
  std::vector<v1::LayerInfo> layers(8);
  for (size_t l = 0; l < layers.size(); ++l) {
    layers[l].set_name(absl::StrCat("layers.", l));
    layers[l].set_parameters(100);
    layers[l].set_activation_bytes(1000);
    layers[l].set_output_bytes(200);
    layers[l].set_backward_transient_bytes(300 + static_cast<int>(l));
  }
  return layers;
}

Plan MustPlan(const spec::JobSpec& spec, std::vector<v1::LayerInfo> layers) {
  auto plan = PlanJob(spec, std::move(layers), {});
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.ok() ? *std::move(plan) : Plan{};
}

TEST(MemoryPrediction, StageModelFromLayersAndRecipe) {
  const spec::JobSpec spec = Parse("{kind: 1F1B, microbatches: 8}", ", optimizer: {kind: adamw}");
  const Plan plan = MustPlan(spec, MeasuredLayers());
  const schedule::MemoryModel model = StageMemoryModel(spec, plan);
  ASSERT_EQ(model.per_stage.size(), 4u);
  const schedule::StageMemory& s1 = model.per_stage[1];  // layers 2 and 3
  EXPECT_EQ(s1.parameters, 800);                         // 200 fp32 parameters
  EXPECT_EQ(s1.gradients, 800);
  EXPECT_EQ(s1.optimizer_state, 1600);  // AdamW: two moments
  EXPECT_EQ(s1.activations, 2000);
  EXPECT_EQ(s1.output, 200);
  EXPECT_EQ(s1.weight_activations, 1800);
  // The most its layers' backwards allocate beyond their input's gradient: 303 - 200.
  EXPECT_EQ(s1.backward_transient, 103);
  EXPECT_FALSE(model.gradient_sends_held_to_step_end);
}

TEST(MemoryPrediction, MeasuredWeightPendingSetsWhatWHolds) {
  const spec::JobSpec spec = Parse("{kind: ZBVZeroBubble, microbatches: 8}", "", "{workers: 2}");
  std::vector<v1::LayerInfo> layers = MeasuredLayers();
  for (size_t l = 0; l < layers.size(); ++l) {
    layers[l].set_weight_pending_bytes(450);
    layers[l].set_weight_transient_bytes(l == 3 ? 64 : 16);  // e.g. a bias computed apart
  }
  // 4 stages of two layers: 900 live between I and W, less the stage's 200-byte input (a
  // receive buffer the model keeps until W), all within the 2,000 bytes of activations.
  schedule::MemoryModel model = StageMemoryModel(spec, MustPlan(spec, layers));
  ASSERT_EQ(model.per_stage.size(), 4u);
  EXPECT_EQ(model.per_stage[0].weight_activations, 900);  // stage 0's input is the data
  EXPECT_EQ(model.per_stage[0].weight_gradients, 0);
  EXPECT_EQ(model.per_stage[1].weight_activations, 700);
  EXPECT_EQ(model.per_stage[1].weight_gradients, 0);
  // W's transient is what its layers' W measured, the most of them: not their 400 bytes of
  // parameters, which the W computes straight into .grad.
  EXPECT_EQ(model.per_stage[0].weight_transient, 16);
  EXPECT_EQ(model.per_stage[1].weight_transient, 64);
  // More than the activations: the rest is what I computed for W.
  for (v1::LayerInfo& layer : layers) layer.set_weight_pending_bytes(1500);
  model = StageMemoryModel(spec, MustPlan(spec, layers));
  EXPECT_EQ(model.per_stage[1].weight_activations, 2000);
  EXPECT_EQ(model.per_stage[1].weight_gradients, 800);
  // Without the measurement: everything but the output, and a gradient per layer output.
  model = StageMemoryModel(spec, MustPlan(spec, MeasuredLayers()));
  EXPECT_EQ(model.per_stage[1].weight_activations, 1800);
  EXPECT_EQ(model.per_stage[1].weight_gradients, 400);
  EXPECT_EQ(model.per_stage[1].weight_transient, 400);  // the largest layer's parameters
}

TEST(MemoryPrediction, RecomputationKeepsOnlyTheOutputAndRebuildsTheRest) {
  const spec::JobSpec spec =
      Parse("{kind: GPipe, microbatches: 4}", ", activation_checkpointing: full");
  const schedule::MemoryModel model = StageMemoryModel(spec, MustPlan(spec, MeasuredLayers()));
  EXPECT_EQ(model.per_stage[0].activations, 200);
  // Layer 0's input is the data (no gradient): its 300; plus the 2,000 rebuilt.
  EXPECT_EQ(model.per_stage[0].backward_transient, 300 + 2000);
}

TEST(MemoryPrediction, ShardedOptimizerStateIsDividedOverTheReplicas) {
  const spec::JobSpec spec =
      Parse("{kind: GPipe, microbatches: 4}", ", optimizer: {kind: sgd, momentum: 0.9}",
            "{workers: 4, replicas: 2, shard_optimizer: true}");
  const schedule::MemoryModel model = StageMemoryModel(spec, MustPlan(spec, MeasuredLayers()));
  EXPECT_EQ(model.per_stage[0].optimizer_state, 400);  // one 800-byte buffer, half each
}

// Stage 0 has 200 parameters (800 bytes); a replica's shard 100 (400 bytes).
TEST(MemoryPrediction, ShardLevelsHoldTheirShareAndGatherTheRest) {
  struct Want {
    std::string level;
    double parameters;
    double gathered;
    bool freed;
  };
  for (const Want& want :
       {Want{"none", 800, 0, false}, Want{"optimizer", 800 + 800, 0, false},
        Want{"gradients", 800 + 800, 0, true}, Want{"parameters", 800, 800, true}}) {
    SCOPED_TRACE(want.level);
    const spec::JobSpec spec =
        Parse("{kind: 1F1B, microbatches: 4}", ", optimizer: {kind: sgd, momentum: 0.9}",
              absl::StrCat("{workers: 4, replicas: 2, shard: ", want.level, "}"));
    const Plan plan = MustPlan(spec, MeasuredLayers());
    const schedule::MemoryModel model = StageMemoryModel(spec, plan);
    EXPECT_EQ(model.per_stage[0].parameters, want.parameters);
    EXPECT_EQ(model.per_stage[0].gradients, 800);  // built whole by the backward
    EXPECT_EQ(model.per_stage[0].gathered_parameters, want.gathered);
    EXPECT_EQ(model.per_stage[0].gradients_freed_at_reduce, want.freed);
    EXPECT_EQ(model.per_stage[0].optimizer_state, want.level == "none" ? 800 : 400);
    ASSERT_EQ(plan.predicted_memory.size(), 4u);
    EXPECT_EQ(plan.predicted_memory[0].static_bytes,
              static_cast<int64_t>(want.parameters + model.per_stage[0].optimizer_state));
  }
}

TEST(MemoryPrediction, PlanCarriesOnePredictionPerRank) {
  const spec::JobSpec spec = Parse("{kind: 1F1B, microbatches: 8}");
  const Plan plan = MustPlan(spec, MeasuredLayers());
  ASSERT_EQ(plan.predicted_memory.size(), 4u);
  // Rank 0's first B allocates the 800 bytes of gradients as it frees its microbatch's 2,000
  // bytes of activations, so the peak is its second B: 4 microbatches of 2,000 bytes again
  // (after F4), the gradients, the 200-byte gradient it receives and, while it runs, the 300-byte
  // transient (layer 0's; layer 1's is 301 - 200): 9,300.
  EXPECT_EQ(plan.predicted_memory[0].peak_bytes, 4 * 2000 + 200 + 300 + 800);
  EXPECT_EQ(plan.predicted_memory[0].static_bytes, 800);  // SGD without momentum: parameters
  // Each later rank holds one microbatch fewer, plus receive and gradient buffers.
  for (int r = 1; r < 4; ++r) {
    EXPECT_LT(plan.predicted_memory[r].peak_bytes, plan.predicted_memory[r - 1].peak_bytes);
  }
  EXPECT_EQ(plan.predicted_memory[0].peak_action, "0B1");
}

TEST(MemoryPrediction, NothingToPredictWithoutMeasuredSizesOrBackward) {
  const spec::JobSpec spec = Parse("{kind: 1F1B, microbatches: 8}");
  std::vector<v1::LayerInfo> unmeasured = MeasuredLayers();
  for (v1::LayerInfo& layer : unmeasured) {
    layer.clear_activation_bytes();
    layer.clear_output_bytes();
  }
  EXPECT_TRUE(MustPlan(spec, unmeasured).predicted_memory.empty());
  EXPECT_TRUE(MustPlan(Parse("{kind: ForwardOnly, microbatches: 4}"), MeasuredLayers())
                  .predicted_memory.empty());
}

}  // namespace
}  // namespace stagecoach::coordinator::memory_prediction_test
