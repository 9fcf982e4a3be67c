// Executes one rank's lowered action list (the schedule IR) for one training step: forward and
// backward of the rank's stages on each microbatch, with activations and gradients exchanged
// with the other ranks over a Transport, or handed over in memory when the producing or
// consuming stage is on this rank.
//
// Stages exchange values as their wiring says (model::PipelineWiring; a chain by default): a
// value goes from the stage that produces it straight to every stage that consumes it, also to
// a non-adjacent one (a skip connection), and its gradient comes back the same way. In the IR a
// stage's SEND_F/RECV_F (and SEND_B/RECV_B) cover all of its producer->consumer pairs; when a
// stage's neighbour is on this rank the IR has no such action for it, and the stage's transfers
// with other ranks are posted by its F or B instead.
//
// Semantics per action (PyTorch's runtime, see DESIGN.md "Schedule IR"):
//   RECV_F s,m  posts the receives of stage s's inputs for microbatch m from other ranks
//   F s,m       runs stage s on microbatch m; waits for its posted receives just before use; on
//               the last stage computes the microbatch's loss
//   SEND_F s,m  sends stage s's outputs of microbatch m to their consumers on other ranks
//               (asynchronously)
//   RECV_B s,m  posts the receives of the gradients of stage s's outputs from other ranks
//   B s,m       backward of stage s for microbatch m (from the loss on the last stage,
//               otherwise from the received or handed-over output gradients, summed over each
//               output's consumers)
//   I s,m       the input-gradient part of B only (split_backward.h); keeps what W needs
//   W s,m       the weight-gradient part of B, from what I kept, then frees the graph
//   (F;B)OVERLAP_F_B  its sub-actions in order; the F's output is sent as soon as it exists,
//               so that transfer overlaps the B (its SEND_F action then finds it posted)
//   SEND_B s,m  sends the gradients of stage s's inputs to their producers on other ranks
//   REDUCE_GRAD s  the stage's gradients are complete (already the mean over microbatches:
//               the step loss is the mean of the microbatch losses, and the last stage seeds
//               each microbatch's backward with 1/m, unless scale_grads is off; or those of
//               the token-normalised loss, TokenNormalization): calls
//               on_gradients_ready(s) (the reduction across data-parallel replicas starts there)
//   UNSHARD s   with ExecutorOptions::sharding (placement.shard: parameters), starts gathering
//               stage s's parameters; F, I, B and W of s first wait until they are whole
//   RESHARD s   with sharding, frees stage s's gathered parameters (stage_sharding.h); without
//               it both do nothing
// An activation's send is released once the gradient for it came back (the consumer has used
// it, so the send is complete); the other sends are waited for at the end of the step (a
// transport cannot test a send without waiting). Every wait is bounded by comm_timeout and its
// error names the rank, action, peer, stage and microbatch.
//
// Shapes: AgreeShapes runs once before the first step. Each stage infers its outputs' shapes
// per microbatch from its inputs' and tells the ranks of their consumers, with whether each
// value carries a gradient back (it requires grad); so every receive buffer has its exact shape
// and dtype, every message is checked against them, and only differentiable values have
// gradient messages. A stage infers its shapes by running once on zeros (a probe) under
// SideEffectGuard: its buffers (a BatchNorm's running statistics) and the random generator are as
// before, so the first step starts from the model the user wrote.
//
// Varying shapes (ExecutorOptions::dynamic_shapes): the agreed shapes are the largest (those of
// the spec's batch) and fix each value's dtype, dimensions and whether it carries a gradient; a
// step's microbatches may be smaller in any size. The producer sends a shape header ahead of each
// activation (shape_header.h): on Gloo in the value's own message (the consumer posts a receive
// for the largest value at RECV_F, the value travels at once); on a transport of exact receives
// (NCCL) as a message ahead, the value's buffer allocated once it is in (at the F that needs
// it). A gradient goes back with the shape of the activation it is for, which both ranks know.
// The cost on Gloo: a copy of each activation behind its 80-byte header (bench/ragged_bench).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/schedule/action.h"
#include "worker/model/precision.h"
#include "worker/model/stage_model.h"
#include "worker/runtime/device/counting_allocator.h"
#include "worker/runtime/executor/progress_beacon.h"
#include "worker/runtime/executor/stage_sharding.h"
#include "worker/runtime/executor/training_setup.h"
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
  // Gradients are the mean over microbatches, not the sum (PyTorch's scale_grads): the last
  // stage seeds each microbatch's backward with 1/num_microbatches instead of 1, as the
  // gradient of the mean loss is, so no pass over the gradients divides them afterwards.
  bool scale_grads = true;
  // B and W compute each Linear layer's weight gradient straight into .grad
  // (fused_weight_grad.h) instead of into a new tensor that autograd then adds.
  bool fuse_weight_grads = true;
  LossKind loss = LossKind::kMse;
  // Forward-only (inference): F runs without recording autograd graphs, the last stage keeps
  // its outputs (StepResult::outputs) instead of computing a loss, and no targets are needed.
  bool forward_only = false;
  // Where the stages' parameters live. CUDA activations cross a host-memory transport (Gloo)
  // through host copies, and a device-memory transport (NCCL) directly.
  torch::Device device = torch::kCPU;
  // Which values cross from which stage to which; empty means a chain of num_stages stages.
  model::PipelineWiring wiring;
  // Called on the executor's thread at each REDUCE_GRAD, once the stage's gradients are scaled
  // (GradientReducer::StageReady with data-parallel replicas); may be empty.
  std::function<void(int stage)> on_gradients_ready;
  // Activation recomputation (training.activation_checkpointing: full): F runs without
  // recording a graph and keeps only the stage's inputs (and its outputs until they are sent or
  // handed over) and the device's random generator state; B and I first run the stage's
  // forward again with the graph from that random state (a dropout draws the same mask), then
  // go on as usual (I's pending W keeps what the recomputed graph needs). The recomputed
  // forward is the same computation on the same inputs, so losses and gradients are
  // bit-identical.
  bool recompute = false;
  // training.precision (worker/model/precision.h): with bf16, stages run under autocast, their
  // floating outputs cross to the next stage in bf16 (so do the gradients that come back), and
  // the last stage's output is cast to fp32 for the loss (and for forward-only outputs).
  model::Precision precision = model::Precision::kFp32;
  // When set (CPU workers: the process's counting allocator), RunStep measures the most bytes
  // of tensors allocated above what was live at the step's start (StepResult::
  // peak_activation_bytes). Process-wide: meaningful with one executor per process.
  CountingCpuAllocator* memory_counter = nullptr;
  // Microbatch shapes may differ from the agreed ones and from step to step (ragged token
  // batches): every activation crossing to another rank is preceded by a shape header
  // (shape_header.h), its receive buffer is allocated when the header has arrived, and every
  // value is held to fit its agreed shape (same dtype and dimensions, no size larger) instead
  // of to equal it. Off, shapes are the agreed ones and no header is sent.
  bool dynamic_shapes = false;
  // When set, the executor marks each action it runs, each wait on another rank and the wait
  // for its sends at the step's end (RANK_PHASE_SENDS) in it (progress_beacon.h); RunStep does
  // not begin or end the step there (its caller does).
  ProgressBeacon* progress = nullptr;
  // With placement.shard: parameters, what UNSHARD and RESHARD do (stage_sharding.h); the
  // shape probes run on its placeholders. Null: the stages' parameters are always whole. Must
  // outlive the executor.
  StageSharding* sharding = nullptr;
  // The worker's --debug-slow-actions (tests of the straggler rule): each compute action
  // (F, B, I, W, OVERLAP_F_B) is made this many times as long as its own work (its waits for
  // data excluded) by sleeping after it. 1: off.
  double debug_slow_factor = 1.0;
};

// Shape and dtype of one tensor crossing a stage boundary.
struct TensorMeta {
  std::vector<int64_t> shape;
  torch::ScalarType dtype = torch::kFloat32;
  // Whether the value requires grad where it is produced, so its gradient is sent back (set by
  // AgreeShapes; not part of ==).
  bool requires_grad = false;

  std::string ToString() const;
  friend bool operator==(const TensorMeta& a, const TensorMeta& b) {
    return a.shape == b.shape && a.dtype == b.dtype;
  }
};

// training.loss_normalization: tokens, for one step. The step's loss is the sum of every counted
// token's cross-entropy (targets other than kIgnoredTarget) over the whole global batch, all
// microbatches and replicas, divided by `counted_tokens`, that batch's count of them; the last
// stage computes each microbatch's share of it (its summed token loss / counted_tokens, reported
// as its microbatch loss: the step loss is their sum over microbatches and replicas) and seeds
// its backward with `gradient_factor` instead of 1/m. With D replicas whose reduction averages
// the gradients, gradient_factor = D makes the reduced gradient that of the step's loss.
struct TokenNormalization {
  int64_t counted_tokens = 0;
  double gradient_factor = 1.0;
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
  // Payload bytes this rank posted to send to, and received from, each peer rank in the step.
  std::map<int, int64_t> bytes_sent_to;
  std::map<int, int64_t> bytes_received_from;
  // With ExecutorOptions::memory_counter: the step's peak of live tensor bytes minus those live
  // when it started; 0 otherwise.
  int64_t peak_activation_bytes = 0;
};

// Not thread-safe: one step at a time. The transport and the stage models must outlive it.
class PipelineExecutor {
 public:
  // `options.wiring`, when given, must have num_stages entries whose sources are earlier stages.
  PipelineExecutor(ExecutorOptions options, transport::Transport* transport,
                   std::map<int, model::StageModel*> stages);
  ~PipelineExecutor();

  // Agrees every boundary's shapes with the other ranks (see the file comment).
  // `first_stage_inputs` are the input shapes of stage 0 per microbatch; only the rank that
  // owns stage 0 uses them. Also checks the wiring against the stages (their output counts).
  absl::Status AgreeShapes(const std::vector<TensorMeta>& first_stage_inputs);

  // Runs `actions` for one step. `inputs` (stage 0's microbatches) are needed when this rank
  // owns stage 0, `targets` when it owns the last stage. Gradients accumulate into the stage
  // parameters' .grad; the caller zeroes them and steps the optimizer. With `tokens` (a
  // cross-entropy training step) the loss is normalised by tokens (TokenNormalization), else it
  // is the mean of the microbatch losses. With `segments` (rows packed with several documents,
  // one tensor per microbatch, on every rank), every forward of microbatch m keeps the
  // documents of segments[m] apart (model::StageModel::SetSegments).
  absl::StatusOr<StepResult> RunStep(const std::vector<schedule::Action>& actions,
                                     const std::vector<torch::Tensor>& inputs,
                                     const std::vector<torch::Tensor>& targets,
                                     std::optional<TokenNormalization> tokens = std::nullopt,
                                     const std::vector<torch::Tensor>* segments = nullptr);

 private:
  struct StepState;
  // The shape messages AgreeShapes posted (pipeline_executor_shapes.cc).
  struct ShapeSends;
  // One value crossing from a producer stage to a consumer stage (a wiring input of stage >= 1).
  struct ValueEdge {
    int producer = 0;
    int output = 0;  // index among the producer's outputs
    int consumer = 0;
    int input = 0;  // index among the consumer's inputs
  };

  // Shape agreement (pipeline_executor_shapes.cc). The wiring's own checks.
  absl::Status CheckWiring() const;
  // Stage s's input metas per microbatch (`in`): the batch's, a local producer's, or received.
  absl::Status InputMetas(int s, const std::vector<TensorMeta>& first_stage_inputs,
                          const std::string& where, std::vector<std::vector<TensorMeta>>& in);
  // Receives producer p's pair message to stage s into `in`.
  absl::Status ReceivePairMetas(int p, int s, const std::string& where,
                                std::vector<std::vector<TensorMeta>>& in);
  // Stage s's output metas per microbatch, inferred by probe forwards on `in`.
  absl::Status OutputMetas(int s, const std::vector<std::vector<TensorMeta>>& in,
                           const std::string& where, std::vector<std::vector<TensorMeta>>& out);
  // Posts stage s's pair messages to its consumers on other ranks.
  absl::Status SendOutputMetas(int s, const std::string& where, ShapeSends& sends);

  // One step (pipeline_executor.cc): its arguments, its actions in order (adding each one's
  // own work to `busy`), the wait for its sends, and what a complete step leaves behind.
  absl::Status CheckStepInputs(const std::vector<torch::Tensor>& inputs,
                               const std::vector<torch::Tensor>& targets,
                               const std::optional<TokenNormalization>& tokens,
                               const std::vector<torch::Tensor>* segments) const;
  // The last stage's loss of microbatch m from its output (the mean, or its token share).
  torch::Tensor LastStageLoss(const torch::Tensor& output, int microbatch,
                              const StepState& state) const;
  absl::Status RunActions(const std::vector<schedule::Action>& actions, StepState& state,
                          absl::Duration& busy);
  absl::Status CheckStepComplete(const StepState& state) const;
  absl::Status Execute(const schedule::Action& action, StepState& state);
  absl::Status ExecuteOverlap(const schedule::Action& action, const std::string& where,
                              StepState& state);
  // With sharding: waits until stage `stage`'s parameters are gathered, as the action's wait.
  absl::Status AwaitStage(int stage, const std::string& where, StepState& state);
  // Whether this rank can run `action` at all (its stage, microbatch, kind of step).
  absl::Status CheckAction(const schedule::Action& action, const std::string& where) const;

  // Forward and backward (pipeline_executor_forward.cc, pipeline_executor_backward.cc).
  // Stage s's forward on `xs` in options_.precision: under its autocast, outputs cast to the
  // wire's dtype (the last stage's to fp32), with the rows' `segments` when defined (packed
  // rows). Every forward of a stage (F, recomputation, the shape probes) goes through it.
  std::vector<torch::Tensor> RunStage(int stage, const std::vector<torch::Tensor>& xs,
                                      const torch::Tensor& segments = torch::Tensor());
  // Microbatch m's segments in this step; undefined without packed rows.
  torch::Tensor SegmentsOf(int microbatch, const StepState& state) const;
  absl::Status Forward(int stage, int microbatch, const std::string& where, StepState& state);
  // B (split = false) or I (split = true).
  absl::Status Backward(int stage, int microbatch, bool split, const std::string& where,
                        StepState& state);
  // The outputs B or I runs from and their gradients: the loss on the last stage, else each
  // output's gradients from its consumers (handed over or received), summed.
  absl::Status OutputGradients(int stage, int microbatch, const std::string& where,
                               StepState& state, std::vector<torch::Tensor>& outputs,
                               std::vector<torch::Tensor>& grads);
  absl::Status BackwardWeight(int stage, int microbatch, const std::string& where,
                              StepState& state);
  // With options_.recompute, before B or I: stage s's forward on microbatch m again, recording
  // the graph, into the step's outputs (or the last stage's loss).
  absl::Status Recompute(int stage, int microbatch, const std::string& where, StepState& state);
  absl::Status ReduceGrad(int stage);

  // Transfers (pipeline_executor_transfers.cc).
  // Posts the receives of stage s's inputs (activations) or of its outputs' gradients from other
  // ranks that are not posted yet.
  absl::Status PostActivationRecvs(int stage, int microbatch, const std::string& where,
                                   StepState& state);
  absl::Status PostGradientRecvs(int stage, int microbatch, const std::string& where,
                                 StepState& state);
  // Sends stage s's outputs to their consumers on other ranks / its input gradients to their
  // producers on other ranks.
  absl::Status SendActivations(int stage, int microbatch, const std::string& where,
                               StepState& state);
  absl::Status SendGradients(int stage, int microbatch, const std::string& where, StepState& state);
  // Checks `t` against the agreed `meta` and posts its send to `peer`.
  absl::Status PostSend(const torch::Tensor& t, const TensorMeta& meta, int peer, uint64_t tag,
                        const std::string& what, const std::string& where, StepState& state);
  // Waits for and frees the send of edge `edge`'s value for `microbatch`, if it is held, once
  // its gradient came back.
  absl::Status ReleaseActivationSend(int edge, int microbatch, StepState& state);
  // Frees the other sends the transport has finished (Work::Done), without waiting: after each
  // action, so that an input gradient's buffer lives until its receiver took it, not to the end
  // of the step. An error if one of them failed.
  absl::Status ReleaseFinishedSends(StepState& state);
  // At the step's end: waits for every send still held.
  absl::Status WaitSends(StepState& state);
  // Posts the receive of edge `edge`'s value (or its gradient) for `microbatch`.
  absl::Status PostRecv(bool gradient, int edge, int microbatch, const std::string& where,
                        StepState& state);
  // Waits for the posted receive of edge `edge` (posting it first if needed); counts the time
  // blocked.
  absl::StatusOr<torch::Tensor> WaitRecv(bool gradient, int edge, int microbatch,
                                         const std::string& where, StepState& state);
  // Whether the transport moves device memory itself (NCCL) rather than host memory.
  bool TransportTakesDeviceMemory() const;
  // Where transfer buffers live: the stages' device for a device-memory transport, else the CPU.
  torch::Device TransferDevice() const;
  bool Local(int stage) const;
  int RankOf(int stage) const { return options_.stage_to_rank[stage]; }
  // Whether the lowered list has a SEND_F / RECV_F / SEND_B / RECV_B action for stage s (it
  // does when the adjacent stage is on another rank).
  bool HasSendF(int s) const { return s + 1 < options_.num_stages && !Local(s + 1); }
  bool HasRecvF(int s) const { return s > 0 && !Local(s - 1); }
  // The agreed meta of edge e's value for a microbatch.
  const TensorMeta& EdgeMeta(int edge, int microbatch) const;
  // The meta of edge e's value in this step: as sent or received (dynamic_shapes), else agreed.
  const TensorMeta& StepEdgeMeta(int edge, int microbatch, const StepState& state) const;
  // dynamic_shapes: whether activations travel framed with their header (shape_header.h), as
  // they do on a transport that takes shorter receives; else the header goes ahead.
  bool FramesValues() const;
  // dynamic_shapes: checks output `t` of edge e against its agreed meta and records its meta for
  // the step.
  absl::StatusOr<TensorMeta> SentMeta(int edge, int microbatch, const torch::Tensor& t,
                                      const std::string& what, const std::string& where,
                                      StepState& state);
  // dynamic_shapes, header ahead: SentMeta, then posts `t`'s shape header (the value follows).
  absl::Status PostShapeHeader(int edge, int microbatch, const torch::Tensor& t,
                               const std::string& what, const std::string& where, StepState& state);
  // dynamic_shapes, framed: SentMeta, then posts a copy of `t` behind its header.
  absl::Status PostFramedValue(int edge, int microbatch, const torch::Tensor& t,
                               const std::string& what, const std::string& where, StepState& state);
  // dynamic_shapes, header ahead: waits for the header of a posted activation receive, then
  // allocates its buffer and posts the value's receive.
  absl::Status ReceiveAfterHeader(int edge, int microbatch, const std::string& where,
                                  StepState& state);
  // A received value's meta (`meta`, or why it could not be read) checked against the agreed
  // one and recorded for the step; errors name the value and the rank it came from.
  absl::Status AcceptReceivedMeta(int edge, int microbatch, const std::string& where, int peer,
                                  absl::StatusOr<TensorMeta> meta, StepState& state);
  uint64_t EdgeTag(bool gradient, int edge, int microbatch) const;
  // "activation of stage c" (the consumer's input) or "output gradient of stage p", with the
  // edge's value indices when the wiring is not a chain.
  std::string EdgeName(bool gradient, int edge) const;

  ExecutorOptions options_;
  transport::Transport* transport_;
  std::map<int, model::StageModel*> stages_;
  // Every value edge of the pipeline, ordered by (producer, consumer, consumer input); edges of
  // one producer -> consumer pair are sent and received in this order.
  std::vector<ValueEdge> edges_;
  // edges_into_[s][i]: the edge feeding input i of stage s (-1 for the pipeline's input).
  std::vector<std::vector<int>> edges_into_;
  // edges_out_of_[s][k]: the edges carrying output k of stage s.
  std::vector<std::vector<std::vector<int>>> edges_out_of_;
  // Agreed metas: input_meta_[s][m][i] is stage s's input i for microbatch m, output_meta_[s][m][k]
  // its output k.
  std::map<int, std::vector<std::vector<TensorMeta>>> input_meta_;
  std::map<int, std::vector<std::vector<TensorMeta>>> output_meta_;
};

}  // namespace stagecoach::runtime
