// Client-batch steps: a batch a client hands to a held task (ControlTask's client_step), and
// the steps that run it.
//   - DecodeClientStep checks and decodes the request's client_step for this rank: stage 0's
//     rank gets the inputs, the last stage's rank the targets of a training client step, every
//     rank the inputs' shape; floating-point tensors are converted to float32 and split into
//     the job's microbatches. Ragged rows (client_step.row_lengths) have their targets past each
//     row's length ignored, and run cut to each microbatch's longest row where the job's shapes
//     vary per microbatch (data.packing, training steps), else to the replica's longest row.
//   - CheckStage0Takes runs stage 0 on such microbatches (no autograd), so that a batch the
//     model cannot take is refused before any rank starts a step.
//   - ClientSteps runs the client step the gate hands over. A training client step agrees its
//     shapes on the task's executor and runs as a counted step (DataSteps::RunCounted, marked
//     client_batch). A forward-only one runs the F, SEND_F and RECV_F actions of the rank's
//     list (ForwardActions) on a forward-only executor of its own (a forward-only task's list
//     and executor already are), does not count in the timeline, and the last stage's rank
//     reports the merged outputs.
// Every rank agrees shapes again before a client step and before the first data step after
// one.
//
// Decoding and checking are thread-safe (stateless); ClientSteps is the task's thread's.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "stagecoach/v1/types.pb.h"
#include "stagecoach/v1/worker.pb.h"
#include "worker/model/stage_model.h"
#include "worker/runtime/task/data_steps.h"
#include "worker/runtime/task/step_gate.h"

namespace stagecoach::runtime {

// A client step's batch as the gate carries it, decoded, converted and split.
struct ClientBatch : StepGate::ClientPayload {
  // Stage 0's microbatches (only on the rank owning stage 0).
  std::vector<torch::Tensor> inputs;
  // The last stage's target microbatches (only on its rank, training client steps).
  std::vector<torch::Tensor> targets;
  // The whole client batch's counted targets (not kIgnoredTarget), on the last stage's rank:
  // a loss normalised by tokens divides by it.
  int64_t counted_tokens = 0;
  // The shapes the step agrees before it runs (stage 0's rank): the microbatches' own, or the
  // padded batch's when ragged rows are cut per microbatch.
  std::vector<TensorMeta> planned;
};

// The client step of `request` for `task`'s rank, its payload a ClientBatch. INVALID_ARGUMENT
// naming the field: a negative global_step, a step_limit other than global_step (forward-only)
// or global_step + 1 (training), a missing inputs_shape or fewer rows than microbatches, inputs
// or targets given to the wrong rank or missing on the right one, tensors that do not decode or
// do not match the shape. The job spec's errors.
absl::StatusOr<StepGate::ClientStep> DecodeClientStep(const v1::TaskAssignment& task,
                                                      const v1::ControlTaskRequest& request);

// Runs `stage0` on `microbatches` (once per distinct shape) without autograd, on the stage's
// device. INVALID_ARGUMENT "<field>: stage 0 cannot take microbatch <i> of shape [...]: <why>".
absl::Status CheckStage0Takes(const std::vector<torch::Tensor>& microbatches,
                              model::StageModel& stage0, absl::string_view field);

// Stage 0's microbatches of an Infer job: the replica's share of the client's batch
// (ReplicaMicrobatches), each distinct
// shape checked on stage 0 (CheckStage0Takes, field "inference.inputs"). Floating-point inputs
// are converted to float32. INVALID_ARGUMENT for a malformed tensor or fewer rows than
// `microbatches`.
absl::StatusOr<std::vector<torch::Tensor>> InferenceMicrobatches(const v1::TensorData& inputs,
                                                                 int microbatches,
                                                                 const ReplicaShare& share,
                                                                 model::StageModel& stage0);

class ClientSteps {
 public:
  // `data` is the task's DataSteps (its executor, its counted steps); it must outlive this.
  ClientSteps(const StepEnv& env, DataSteps* data);

  // Runs `step` (from StepGate::Next) at `global_step`. The executor's and reports' errors;
  // INTERNAL for a step without a ClientBatch.
  absl::Status Run(const StepGate::ClientStep& step, int64_t global_step);

 private:
  absl::Status RunForward(const ClientBatch& batch, int64_t global_step);

  const StepEnv env_;
  DataSteps* data_;
  // Training tasks: the forward-only executor and action list of forward-only client steps,
  // made at the first one.
  std::unique_ptr<PipelineExecutor> forward_executor_;
  std::vector<schedule::Action> forward_actions_;
};

}  // namespace stagecoach::runtime
