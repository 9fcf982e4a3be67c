// A memory model for pipeline schedules: what each rank holds while it runs a lowered schedule,
// computed from a Simulation (simulator.h) and the bytes each stage keeps. The planner uses it to
// refuse plans that do not fit a worker and to rank those that do; `stagectl schedule` prints it
// and draws it as a counter track in the Chrome trace. Pure functions; thread-safe; no LibTorch.
//
// What a rank holds, by kind:
//  - static: its stages' parameters and optimizer state, live for the whole step;
//  - gradients: a stage's gradient buffers, allocated by its first backward of the step that
//    computes weight gradients (B, or W with a split backward) and live until the step ends (or,
//    sharded, until its REDUCE_GRAD); the next step starts without them (the runtime sets them
//    to none, as PyTorch's zero_grad does);
//  - gathered parameters (sharded): a stage's whole parameters from its UNSHARD to its RESHARD;
//  - activations: per (stage, microbatch), what F keeps for the backward (its saved tensors and
//    its output, which the runtime keeps to run the backward from);
//  - buffers: a received input (RECV_F), kept until the B that produces its gradient or, with a
//    split backward, until W (the first weight product's gradient needs it); a received output
//    gradient (RECV_B), kept until the I or B that consumes it; a computed input gradient, kept
//    until its SEND_B has arrived (or the step's end, see MemoryModel) or, when the previous
//    stage is on the same rank, until that stage's I or B has consumed it. Stage 0's input batch
//    is the data, not counted.
// "Dynamic" bytes are gradients, gathered parameters, activations and buffers; the peak a worker measures from the start
// of a step (counting_allocator.h) is the dynamic peak.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/schedule/simulator.h"

namespace stagecoach::schedule {

// The bytes one stage holds. All values finite and >= 0; bytes are doubles so that fractional
// models (an average over layers) need no rounding.
struct StageMemory {
  double parameters = 0;       // its weights
  double gradients = 0;        // its gradient buffers (dynamic: from its first B or W)
  double optimizer_state = 0;  // e.g. OptimizerStateBytes
  // Per microbatch: what F(stage, mb) keeps until the backward, its output included. B releases
  // all of it; with a split backward I releases all but `weight_activations`, which W releases.
  double activations = 0;
  // Per microbatch: the part of `activations` that W still needs after I (the inputs of the
  // stage's weight products). <= activations.
  double weight_activations = 0;
  // Per microbatch, with a split backward: what I computes that W still needs (the gradients at
  // the outputs of the stage's weight products), from the end of I to the end of W.
  double weight_gradients = 0;
  // Per microbatch: extra bytes live while the stage's B or I runs and freed when it ends (the
  // activations a recomputing stage rebuilds, autograd's temporaries).
  double backward_transient = 0;
  // Per microbatch: extra bytes live while its F runs beyond what F keeps (intermediate values
  // it frees itself).
  double forward_transient = 0;
  // Per microbatch: the part of backward_transient that belongs to the weight gradients (each
  // computed before it is accumulated): with a split backward it is live while W runs, and I
  // runs with the rest.
  double weight_transient = 0;
  // Per microbatch: the tensor the stage sends forward; the next stage's receive buffer and the
  // size of the gradient that comes back.
  double output = 0;
  // Sharded parameters (placement.shard: parameters): the whole parameters, gathered from the
  // stage's UNSHARD (its start) to its RESHARD (its end); `parameters` then holds only what
  // stays between uses (the shards). 0: the parameters are always whole.
  double gathered_parameters = 0;
  // Sharded gradients (placement.shard: gradients or parameters): the gradient buffers are
  // freed at the end of the stage's REDUCE_GRAD (their reduce-scattered shard, which stays, is
  // static bytes) instead of at the step's end.
  bool gradients_freed_at_reduce = false;
};

// What every stage holds.
struct MemoryModel {
  // Stages without an entry in per_stage.
  StageMemory defaults;
  // Element s overrides `defaults` for stage s; may be shorter than the number of stages, not
  // longer.
  std::vector<StageMemory> per_stage;
  // Input gradients sent by SEND_B are kept until the rank's last action ends rather than until
  // they arrive: what a runtime does that waits for its sends only at the end of the step
  // (PyTorch's pipelining stages). Ours frees a gradient send once the transport finished it.
  bool gradient_sends_held_to_step_end = false;
};

// Optimizers whose state the model knows.
enum class OptimizerKind {
  kSgd,          // no state
  kSgdMomentum,  // one buffer the size of the parameters
  kAdamW,        // two (first and second moments)
};

// The optimizer state for `parameter_bytes` of fp32 parameters, divided over `shards` replicas
// (ZeRO-1; 1 when not sharded), each shard rounded up to whole bytes. shards >= 1.
double OptimizerStateBytes(OptimizerKind kind, double parameter_bytes, int shards = 1);

// One point of a rank's dynamic-memory curve: from `time` on, `bytes` are live.
struct MemoryPoint {
  double time = 0;
  double bytes = 0;
};

struct RankMemory {
  double static_bytes = 0;  // parameters + optimizer state of the rank's stages
  double peak_dynamic = 0;  // the most gradient, activation and buffer bytes live at once
  double peak_total = 0;    // static_bytes + peak_dynamic
  double peak_time = 0;     // when peak_dynamic was first reached
  // The action during (or at the end of) which the peak was first reached, e.g. "0F3"; empty when
  // peak_dynamic is 0.
  std::string peak_action;
  // Activations (stage, microbatch pairs) held at that moment.
  int peak_microbatches = 0;
  // The dynamic bytes over the step: a point wherever they change, in time order (0 bytes before
  // the first). Bytes live only while an action runs are a point at its start followed by one at
  // its end; of several changes at one time the curve keeps the last.
  std::vector<MemoryPoint> curve;
};

struct MemoryProfile {
  std::vector<RankMemory> ranks;  // element r: rank r (a row of the simulated timeline)
};

// Replays `simulation` (the result of Simulate on the same lowered lists and `stage_to_rank`) and
// says what each rank holds over time. Rules, per rank, in time order:
//  - RECV_F(s, mb) at its post allocates output(s-1); RECV_B(s, mb) at its post allocates
//    output(s);
//  - F(s, mb) holds activations(s) from its start (they build up while it runs), and
//    forward_transient(s) while it runs;
//  - B(s, mb) while it runs also holds backward_transient(s) and the input gradient output(s-1)
//    (s > 0); at its end it frees activations(s), the transient, its RECV_F and RECV_B buffers and
//    a locally handed gradient, and keeps the input gradient;
//  - the first B(s, ·) or W(s, ·) of the step also allocates gradients(s), kept to the end of
//    the step. It allocates them layer by layer as it frees, layer by layer, what it consumes
//    (B: activations(s); W: weight_activations(s)), so while it runs it holds only what
//    gradients(s) exceed those by (the transients are profiled with the graph retained);
//  - I(s, mb) is B that keeps weight_activations(s) and its RECV_F buffer, adds
//    weight_gradients(s), which it builds up while it runs, and runs with
//    backward_transient - weight_transient; W(s, mb) holds weight_transient while it runs and
//    frees all of them at its end. Stage 0's input is the data, so its I has no input path: it
//    computes and frees nothing (its RECV_B buffer stays), and its W is a B: it runs with
//    backward_transient and frees activations(0) and the RECV_B buffer;
//  - UNSHARD(s) at its start allocates gathered_parameters(s), and RESHARD(s) at its end frees
//    them; with gradients_freed_at_reduce, REDUCE_GRAD(s) at its end frees gradients(s);
//  - an OVERLAP_F_B runs its sub-actions one after another: its peak is the highest any of them
//    reaches on what the earlier ones left; the changes apply at its end;
//  - an input gradient sent by SEND_B is freed when the message arrives (with
//    gradient_sends_held_to_step_end, when the rank's last action ends); one handed to a stage
//    on the same rank is freed at the end of that stage's I or B;
//  - at equal times, frees on message arrival come before the rank's own events.
// Forward-only schedules never free activations: model an inference stage with activations 0
// and its output as `output`.
// Errors, INVALID_ARGUMENT: a value negative or not finite (named, e.g.
// "memory.per_stage[1].activations"), weight_activations above activations, per_stage longer
// than num_stages, stage_to_rank or simulation inconsistent with num_stages.
absl::StatusOr<MemoryProfile> SimulateMemory(const Simulation& simulation,
                                             const std::vector<int>& stage_to_rank, int num_stages,
                                             const MemoryModel& model);

// For a terminal: per rank, static bytes, dynamic peak (with when and at which action) and total
// peak, in binary units (util::FormatBytes). Ends with "\n".
std::string FormatMemory(const MemoryProfile& profile);

}  // namespace stagecoach::schedule
