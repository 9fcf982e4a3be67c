// Executes one rank's lowered action list (the schedule IR) for one training step: forward and
// backward of the rank's stages on each microbatch, with activations and gradients exchanged
// with the other ranks over a Transport, or handed over in memory when the neighbouring stage
// is on this rank.
//
// Semantics per action (PyTorch's runtime, see DESIGN.md "Schedule IR"):
//   RECV_F s,m  posts the receive of stage s's input for microbatch m (from the rank of s-1)
//   F s,m       runs stage s on microbatch m; waits for its posted receive just before use; on
//               the last stage computes the microbatch's loss
//   SEND_F s,m  sends stage s's output of microbatch m to the rank of s+1 (asynchronously)
//   RECV_B s,m  posts the receive of the gradient of stage s's output (from the rank of s+1)
//   B s,m       backward of stage s for microbatch m (from the loss on the last stage,
//               otherwise from the received or handed-over output gradient)
//   I s,m       the input-gradient part of B only (split_backward.h); keeps what W needs
//   W s,m       the weight-gradient part of B, from what I kept, then frees the graph
//   (F;B)OVERLAP_F_B  its sub-actions in order; the F's output is sent as soon as it exists,
//               so that transfer overlaps the B (its SEND_F action then finds it posted)
//   SEND_B s,m  sends the gradient of stage s's input to the rank of s-1
//   REDUCE_GRAD s  the stage's gradients are complete: divides them by the number of
//               microbatches (the step loss is the mean of the microbatch losses), unless
//               scale_grads is off
//   UNSHARD s, RESHARD s  nothing: stages are not sharded
// Sends are waited for at the end of the step. Every wait is bounded by comm_timeout and its
// error names the rank, action, peer, stage and microbatch.
//
// Shapes: AgreeShapes runs once before the first step. Each stage infers its output shape per
// microbatch from its input shape and tells the rank of the next stage, so every receive
// buffer has its exact shape and dtype; every message is checked against them.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/schedule/action.h"
#include "worker/model/stage_model.h"
#include "worker/runtime/training_setup.h"
#include "worker/transport/transport.h"

namespace stagecoach::runtime {

struct ExecutorOptions {
  int rank = 0;
  int num_stages = 1;
  int num_microbatches = 1;
  // stage_to_rank[s]: the rank owning stage s.
  std::vector<int> stage_to_rank;
  // Bound on every data-plane wait.
  absl::Duration comm_timeout = absl::Seconds(60);
  // Divide gradients by num_microbatches at REDUCE_GRAD (PyTorch's scale_grads).
  bool scale_grads = true;
  LossKind loss = LossKind::kMse;
  // Forward-only (inference): F runs without recording autograd graphs, the last stage keeps
  // its outputs (StepResult::outputs) instead of computing a loss, and no targets are needed.
  bool forward_only = false;
  // Where the stages' parameters live. CUDA activations cross a host-memory transport (Gloo)
  // through host copies, and a device-memory transport (NCCL) directly.
  torch::Device device = torch::kCPU;
};

// Shape and dtype of one tensor crossing a stage boundary.
struct TensorMeta {
  std::vector<int64_t> shape;
  torch::ScalarType dtype = torch::kFloat32;

  std::string ToString() const;
  friend bool operator==(const TensorMeta& a, const TensorMeta& b) {
    return a.shape == b.shape && a.dtype == b.dtype;
  }
};

// When one executed action ran, relative to the start of its step.
struct ActionTiming {
  absl::Duration start;
  absl::Duration end;
  // Time inside [start, end) spent blocked on data from another rank (a posted receive the
  // action consumes); end - start - wait is the action's own work.
  absl::Duration wait;
};

struct StepResult {
  // Loss of each microbatch, in microbatch order; only when this rank owns the last stage of
  // a training step.
  std::vector<double> microbatch_losses;
  // Forward-only steps on the rank owning the last stage: its output of each microbatch, in
  // microbatch order.
  std::vector<torch::Tensor> outputs;
  // Actions executed, in order, in PyTorch's syntax.
  std::vector<std::string> executed;
  // timings[i] is when executed[i] ran.
  std::vector<ActionTiming> timings;
  // Wall-clock time the step started, for aligning ranks on one time base.
  absl::Time start;
  // From the start of the step to the completion of its last send.
  absl::Duration duration;
  // Share of `duration` this rank did no compute work (F, I, W, B, OVERLAP_F_B, minus their
  // waits): 1 - busy / duration.
  double bubble_ratio = 0.0;
};

// Not thread-safe: one step at a time. The transport and the stage models must outlive it.
class PipelineExecutor {
 public:
  PipelineExecutor(ExecutorOptions options, transport::Transport* transport,
                   std::map<int, model::StageModel*> stages);
  ~PipelineExecutor();

  // Agrees every boundary's shapes with the other ranks (see the file comment).
  // `first_stage_inputs` are the input shapes of stage 0 per microbatch; only the rank that
  // owns stage 0 uses them.
  absl::Status AgreeShapes(const std::vector<TensorMeta>& first_stage_inputs);

  // Runs `actions` for one step. `inputs` (stage 0's microbatches) are needed when this rank
  // owns stage 0, `targets` when it owns the last stage. Gradients accumulate into the stage
  // parameters' .grad; the caller zeroes them and steps the optimizer.
  absl::StatusOr<StepResult> RunStep(const std::vector<schedule::Action>& actions,
                                     const std::vector<torch::Tensor>& inputs,
                                     const std::vector<torch::Tensor>& targets);

 private:
  struct StepState;

  absl::Status Execute(const schedule::Action& action, StepState& state);
  absl::Status Forward(int stage, int microbatch, const std::string& where, StepState& state);
  // B (split = false) or I (split = true).
  absl::Status Backward(int stage, int microbatch, bool split, const std::string& where,
                        StepState& state);
  absl::Status SendActivation(int stage, int microbatch, const std::string& where,
                              StepState& state);
  absl::Status SendGradient(int stage, int microbatch, const std::string& where,
                            StepState& state);
  // Checks `t` against the agreed `meta` and posts its send to `peer`.
  absl::Status PostSend(const torch::Tensor& t, const TensorMeta& meta, int peer, uint64_t tag,
                        const std::string& what, const std::string& where, StepState& state);
  // Posts a receive of `meta` from `peer` for (stage, microbatch) into `kind`'s pending table.
  absl::Status PostRecv(bool gradient, int stage, int microbatch, const TensorMeta& meta,
                        int peer, uint64_t tag, const std::string& where, StepState& state);
  // Waits for the posted receive of (stage, microbatch); counts the time blocked.
  absl::StatusOr<torch::Tensor> WaitRecv(bool gradient, int stage, int microbatch,
                                         const std::string& where, StepState& state);
  // Whether the transport moves device memory itself (NCCL) rather than host memory.
  bool TransportTakesDeviceMemory() const;
  bool Local(int stage) const;
  int RankOf(int stage) const { return options_.stage_to_rank[stage]; }

  ExecutorOptions options_;
  transport::Transport* transport_;
  std::map<int, model::StageModel*> stages_;
  // Agreed shapes: input_meta_[s][m] is what stage s consumes for microbatch m,
  // output_meta_[s][m] what it produces.
  std::map<int, std::vector<TensorMeta>> input_meta_;
  std::map<int, std::vector<TensorMeta>> output_meta_;
};

}  // namespace stagecoach::runtime
