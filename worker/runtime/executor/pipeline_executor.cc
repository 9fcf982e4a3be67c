// PipelineExecutor: construction, the value edges, and one step (RunStep walks the action list
// through Execute). Shape agreement, forward, backward and transfers are in the
// pipeline_executor_*.cc files beside it.
#include "worker/runtime/executor/pipeline_executor.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/util/status_macros.h"
#include "worker/runtime/executor/message_tags.h"
#include "worker/runtime/executor/pipeline_executor_state.h"

namespace stagecoach::runtime {
namespace {

using schedule::Action;
using schedule::ActionType;

// Actions a forward-only step cannot have.
bool IsBackwardAction(ActionType type) {
  switch (type) {
    case ActionType::kFullBackward:
    case ActionType::kBackwardInput:
    case ActionType::kBackwardWeight:
    case ActionType::kSendB:
    case ActionType::kRecvB:
    case ActionType::kReduceGrad:
      return true;
    default:
      return false;
  }
}

}  // namespace

using executor_internal::EdgeKey;
using executor_internal::Key;

std::string TensorMeta::ToString() const {
  return absl::StrCat(c10::toString(dtype), "[", absl::StrJoin(shape, ", "), "]");
}

PipelineExecutor::PipelineExecutor(ExecutorOptions options, transport::Transport* transport,
                                   std::map<int, model::StageModel*> stages)
    : options_(std::move(options)), transport_(transport), stages_(std::move(stages)) {
  const int num_stages = options_.num_stages;
  if (options_.wiring.empty()) options_.wiring = model::ChainWiring(num_stages);
  edges_into_.resize(num_stages);
  edges_out_of_.resize(num_stages);
  for (int c = 0; c < num_stages && c < static_cast<int>(options_.wiring.size()); ++c) {
    const model::StageWiring& w = options_.wiring[c];
    edges_out_of_[c].resize(std::max(0, w.num_outputs));
    for (size_t i = 0; i < w.inputs.size(); ++i) {
      const model::ValueSource& src = w.inputs[i];
      if (src.stage < 0 || src.stage >= c) continue;  // the pipeline's input, or bad (AgreeShapes)
      edges_.push_back(ValueEdge{src.stage, src.index, c, static_cast<int>(i)});
    }
  }
  std::sort(edges_.begin(), edges_.end(), [](const ValueEdge& a, const ValueEdge& b) {
    return std::tie(a.producer, a.consumer, a.input) < std::tie(b.producer, b.consumer, b.input);
  });
  for (int c = 0; c < num_stages && c < static_cast<int>(options_.wiring.size()); ++c) {
    edges_into_[c].assign(options_.wiring[c].inputs.size(), -1);
  }
  for (size_t e = 0; e < edges_.size(); ++e) {
    const ValueEdge& edge = edges_[e];
    edges_into_[edge.consumer][edge.input] = static_cast<int>(e);
    if (edge.output >= 0 && edge.output < static_cast<int>(edges_out_of_[edge.producer].size())) {
      edges_out_of_[edge.producer][edge.output].push_back(static_cast<int>(e));
    }
  }
}

PipelineExecutor::~PipelineExecutor() = default;

bool PipelineExecutor::Local(int stage) const { return stages_.count(stage) > 0; }

const TensorMeta& PipelineExecutor::EdgeMeta(int e, int mb) const {
  const ValueEdge& edge = edges_[e];
  if (Local(edge.consumer)) return input_meta_.at(edge.consumer)[mb][edge.input];
  return output_meta_.at(edge.producer)[mb][edge.output];
}

const TensorMeta& PipelineExecutor::StepEdgeMeta(int e, int mb, const StepState& st) const {
  auto it = st.step_metas.find(EdgeKey{e, mb});
  return it != st.step_metas.end() ? it->second : EdgeMeta(e, mb);
}

uint64_t PipelineExecutor::EdgeTag(bool gradient, int e, int mb) const {
  const ValueEdge& edge = edges_[e];
  return MessageTag(gradient ? Payload::kGradient : Payload::kActivation,
                    PairEdge(edge.producer, edge.consumer), mb);
}

std::string PipelineExecutor::EdgeName(bool gradient, int e) const {
  const ValueEdge& edge = edges_[e];
  const bool chain = IsChain(options_.wiring);
  if (gradient) {
    return absl::StrCat("output gradient of stage ", edge.producer,
                        chain ? std::string()
                              : absl::StrCat(" (output ", edge.output, ", from input ", edge.input,
                                             " of stage ", edge.consumer, ")"));
  }
  return absl::StrCat("activation of stage ", edge.consumer,
                      chain ? std::string()
                            : absl::StrCat(" (input ", edge.input, ", output ", edge.output,
                                           " of stage ", edge.producer, ")"));
}

absl::StatusOr<StepResult> PipelineExecutor::RunStep(const std::vector<Action>& actions,
                                                     const std::vector<torch::Tensor>& inputs,
                                                     const std::vector<torch::Tensor>& targets,
                                                     std::optional<TokenNormalization> tokens,
                                                     const std::vector<torch::Tensor>* segments) {
  StepState state;
  state.inputs = &inputs;
  state.targets = &targets;
  state.tokens = tokens;
  state.segments = segments;
  state.step_start = absl::Now();
  state.result.start = state.step_start;
  const int64_t live_at_start =
      options_.memory_counter != nullptr ? options_.memory_counter->live_bytes() : 0;
  if (options_.memory_counter != nullptr) options_.memory_counter->ResetPeak();
  state.result.executed.reserve(actions.size());
  state.result.timings.reserve(actions.size());
  const int m = options_.num_microbatches;
  const bool owns_last = Local(options_.num_stages - 1);
  if (owns_last && !options_.forward_only) {
    state.result.microbatch_losses.assign(m, std::numeric_limits<double>::quiet_NaN());
  }
  if (owns_last && options_.forward_only) state.result.outputs.resize(m);

  absl::Duration busy;
  absl::Status status = CheckStepInputs(inputs, targets, tokens, segments);
  if (status.ok()) status = RunActions(actions, state, busy);
  if (status.ok()) status = WaitSends(state);
  if (status.ok()) status = CheckStepComplete(state);
  if (!status.ok()) {
    // Buffers of posted transfers are freed when `state` goes away; after an error the data
    // plane of this job is unusable anyway, and Abort guarantees nothing writes into them.
    transport_->Abort();
    return status;
  }
  state.result.duration = absl::Now() - state.step_start;
  if (options_.memory_counter != nullptr) {
    state.result.peak_activation_bytes = options_.memory_counter->peak_bytes() - live_at_start;
  }
  state.result.bubble_ratio =
      state.result.duration > absl::ZeroDuration()
          ? std::max(0.0, 1.0 - absl::FDivDuration(busy, state.result.duration))
          : 0.0;
  return std::move(state.result);
}

absl::Status PipelineExecutor::CheckStepInputs(const std::vector<torch::Tensor>& inputs,
                                               const std::vector<torch::Tensor>& targets,
                                               const std::optional<TokenNormalization>& tokens,
                                               const std::vector<torch::Tensor>* segments) const {
  if (segments != nullptr && static_cast<int>(segments->size()) != options_.num_microbatches) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", options_.rank, ": expected ", options_.num_microbatches,
                     " microbatches of segments, got ", segments->size()));
  }
  if (tokens.has_value() && !options_.forward_only) {
    if (options_.loss != LossKind::kCrossEntropy) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", options_.rank, ": a loss normalised by tokens needs the cross_entropy loss"));
    }
    if (tokens->counted_tokens <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", options_.rank, ": the step's batch counts ", tokens->counted_tokens,
                       " tokens; a loss normalised by tokens needs one"));
    }
  }
  const int m = options_.num_microbatches;
  if (Local(0) && static_cast<int>(inputs.size()) != m) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", options_.rank, ": expected ", m,
                                                   " input microbatches, got ", inputs.size()));
  }
  const bool wants_losses = Local(options_.num_stages - 1) && !options_.forward_only;
  if (wants_losses && static_cast<int>(targets.size()) != m) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", options_.rank, ": expected ", m,
                                                   " target microbatches, got ", targets.size()));
  }
  return absl::OkStatus();
}

absl::Status PipelineExecutor::RunActions(const std::vector<Action>& actions, StepState& state,
                                          absl::Duration& busy) {
  for (const Action& action : actions) {
    state.action_wait = absl::ZeroDuration();
    const absl::Duration start = absl::Now() - state.step_start;
    std::string name = action.ToString();  // for the beacon and the step's report
    if (options_.progress != nullptr) options_.progress->BeginAction(name);
    RETURN_IF_ERROR(Execute(action, state));
    if (options_.debug_slow_factor > 1.0 && schedule::IsCompute(action.type)) {
      const absl::Duration own = absl::Now() - state.step_start - start - state.action_wait;
      absl::SleepFor(own * (options_.debug_slow_factor - 1.0));
    }
    ActionTiming timing{start, absl::Now() - state.step_start, state.action_wait};
    if (options_.progress != nullptr) options_.progress->EndAction(timing.wait);
    RETURN_IF_ERROR(ReleaseFinishedSends(state));
    if (schedule::IsCompute(action.type)) busy += timing.end - timing.start - timing.wait;
    state.result.executed.push_back(std::move(name));
    state.result.timings.push_back(timing);
  }
  return absl::OkStatus();
}

absl::Status PipelineExecutor::CheckStepComplete(const StepState& state) const {
  std::vector<std::string> unused;
  for (const auto& [k, r] : state.activation_recvs) {
    unused.push_back(absl::StrCat(EdgeName(false, k.edge), " microbatch ", k.microbatch));
  }
  for (const auto& [k, r] : state.gradient_recvs) {
    unused.push_back(absl::StrCat(EdgeName(true, k.edge), " microbatch ", k.microbatch));
  }
  if (!unused.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", options_.rank,
        ": the step ended with receives no action used: ", absl::StrJoin(unused, ", ")));
  }
  if (!state.pending_weights.empty()) {
    const Key& k = state.pending_weights.begin()->first;
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", options_.rank, ": the step ended without the W of stage ", k.stage,
                     " microbatch ", k.microbatch, " after its I"));
  }
  if (!state.input_grads.empty()) {
    const EdgeKey& k = state.input_grads.begin()->first;
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", options_.rank, ": the step ended without sending the ", EdgeName(true, k.edge),
        " microbatch ", k.microbatch, " (no SEND_B of stage ", edges_[k.edge].consumer, ")"));
  }
  const int last = options_.num_stages - 1;
  for (int mb = 0; Local(last) && mb < options_.num_microbatches; ++mb) {
    // (A loss may itself be NaN: non-finite data is the training recipe's to skip.)
    const bool missing = options_.forward_only ? !state.result.outputs[mb].defined()
                                               : state.last_stage_forwards.count(mb) == 0;
    if (missing) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", options_.rank, ": the step ended without a forward of the last stage (", last,
          ") on microbatch ", mb));
    }
  }
  return absl::OkStatus();
}

torch::Tensor PipelineExecutor::LastStageLoss(const torch::Tensor& output, int mb,
                                              const StepState& st) const {
  const torch::Tensor target = (*st.targets)[mb].to(options_.device);
  if (!st.tokens.has_value()) return ComputeLoss(options_.loss, output, target);
  return SummedTokenLoss(output, target) / static_cast<double>(st.tokens->counted_tokens);
}

bool PipelineExecutor::TransportTakesDeviceMemory() const {
  return transport_->capabilities().takes_device_memory;
}

torch::Device PipelineExecutor::TransferDevice() const {
  return TransportTakesDeviceMemory() ? options_.device : torch::Device(torch::kCPU);
}

absl::Status PipelineExecutor::Execute(const Action& action, StepState& st) {
  const std::string where = absl::StrCat("rank ", options_.rank, ", action ", action.ToString());
  if (action.type == ActionType::kOverlapFB) return ExecuteOverlap(action, where, st);
  RETURN_IF_ERROR(CheckAction(action, where));
  const int s = action.stage;
  const int mb = action.microbatch.value_or(-1);
  switch (action.type) {
    case ActionType::kRecvF:
      if (!HasRecvF(s)) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": stage ", s, " receives no activation from another rank"));
      }
      return PostActivationRecvs(s, mb, where, st);

    case ActionType::kRecvB:
      if (!HasSendF(s)) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": stage ", s, " receives no gradient from another rank"));
      }
      return PostGradientRecvs(s, mb, where, st);

    case ActionType::kForward:
      RETURN_IF_ERROR(AwaitStage(s, where, st));
      return Forward(s, mb, where, st);

    case ActionType::kSendF:
      if (!HasSendF(s)) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": stage ", s + 1, " is not on another rank"));
      }
      if (st.early_sends.erase(Key{s, mb}) > 0) return absl::OkStatus();  // sent at the overlap
      return SendActivations(s, mb, where, st);

    case ActionType::kFullBackward:
      RETURN_IF_ERROR(AwaitStage(s, where, st));
      return Backward(s, mb, /*split=*/false, where, st);

    case ActionType::kBackwardInput:
      RETURN_IF_ERROR(AwaitStage(s, where, st));
      return Backward(s, mb, /*split=*/true, where, st);

    case ActionType::kBackwardWeight:
      RETURN_IF_ERROR(AwaitStage(s, where, st));
      return BackwardWeight(s, mb, where, st);

    case ActionType::kSendB:
      if (!HasRecvF(s)) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": stage ", s - 1, " is not on another rank"));
      }
      return SendGradients(s, mb, where, st);

    case ActionType::kReduceGrad:
      return ReduceGrad(s);

    case ActionType::kUnshard:
      if (options_.sharding != nullptr) options_.sharding->Unshard(s);
      return absl::OkStatus();  // without sharding the parameters are always whole

    case ActionType::kReshard:
      if (options_.sharding == nullptr) return absl::OkStatus();
      return options_.sharding->Reshard(s, where);

    default:
      return absl::UnimplementedError(absl::StrCat(where, ": action type ",
                                                   schedule::ActionTypeName(action.type),
                                                   " is not supported by this worker"));
  }
}

absl::Status PipelineExecutor::AwaitStage(int stage, const std::string& where, StepState& st) {
  if (options_.sharding == nullptr) return absl::OkStatus();
  ASSIGN_OR_RETURN(const absl::Duration waited, options_.sharding->AwaitGathered(stage, where));
  st.action_wait += waited;
  return absl::OkStatus();
}

absl::Status PipelineExecutor::ExecuteOverlap(const Action& action, const std::string& where,
                                              StepState& st) {
  for (const Action& sub : action.sub_actions) {
    const std::string sub_where = absl::StrCat(where, " (", sub.ToString(), ")");
    if (sub.sub_actions.empty() && !Local(sub.stage)) {
      return absl::InvalidArgumentError(
          absl::StrCat(sub_where, ": stage ", sub.stage, " is not on this rank"));
    }
    RETURN_IF_ERROR(Execute(sub, st));
    // Start the forward output's transfer now, so that it overlaps the backward that follows.
    const int s = sub.stage;
    if (sub.type == ActionType::kForward && HasSendF(s)) {
      RETURN_IF_ERROR(SendActivations(s, sub.microbatch.value_or(-1), sub_where, st));
      st.early_sends.insert(Key{s, sub.microbatch.value_or(-1)});
    }
  }
  return absl::OkStatus();
}

absl::Status PipelineExecutor::CheckAction(const Action& action, const std::string& where) const {
  const int s = action.stage;
  const int mb = action.microbatch.value_or(-1);
  if (!Local(s)) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": stage ", s, " is not on this rank"));
  }
  if (schedule::HasMicrobatch(action.type) && (mb < 0 || mb >= options_.num_microbatches)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": microbatch ", mb, " is outside 0..", options_.num_microbatches - 1));
  }
  if (options_.forward_only && IsBackwardAction(action.type)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": a forward-only step has no backward actions"));
  }

  return absl::OkStatus();
}

}  // namespace stagecoach::runtime
