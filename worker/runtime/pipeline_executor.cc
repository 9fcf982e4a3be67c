#include "worker/runtime/pipeline_executor.h"

#include <torch/autograd.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/util/status_macros.h"
#include "worker/runtime/message_tags.h"
#include "worker/runtime/split_backward.h"

namespace stagecoach::runtime {
namespace {

using schedule::Action;
using schedule::ActionType;

// A TensorMeta on the wire: [dtype, ndim, d0 .. d(kMaxDims-1)].
constexpr int kMaxDims = 8;
constexpr int kMetaWords = 2 + kMaxDims;

TensorMeta MetaOf(const torch::Tensor& t) { return TensorMeta{t.sizes().vec(), t.scalar_type()}; }

struct Key {
  int stage;
  int microbatch;
  friend bool operator<(const Key& a, const Key& b) {
    return a.stage != b.stage ? a.stage < b.stage : a.microbatch < b.microbatch;
  }
};

struct PendingRecv {
  torch::Tensor buffer;
  std::unique_ptr<transport::Work> work;
  int peer = -1;
};

struct PendingSend {
  torch::Tensor buffer;  // keeps the bytes alive until the send completed
  std::unique_ptr<transport::Work> work;
  std::string what;
};

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

// Runs `fn`, turning LibTorch exceptions into a Status prefixed with `where`.
template <typename Fn>
absl::Status GuardTorch(const std::string& where, Fn&& fn) {
  try {
    return fn();
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat(where, ": ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(where, ": ", e.what()));
  }
}

}  // namespace

std::string TensorMeta::ToString() const {
  return absl::StrCat(c10::toString(dtype), "[", absl::StrJoin(shape, ", "), "]");
}

struct PipelineExecutor::StepState {
  const std::vector<torch::Tensor>* inputs = nullptr;
  const std::vector<torch::Tensor>* targets = nullptr;
  std::map<Key, PendingRecv> activation_recvs;  // input of (stage, mb) on its way
  std::map<Key, PendingRecv> gradient_recvs;    // gradient of (stage, mb)'s output on its way
  std::map<Key, torch::Tensor> stage_inputs;    // what F consumed (requires grad unless stage 0)
  std::map<Key, torch::Tensor> stage_outputs;   // what F produced (not on the last stage)
  std::map<Key, torch::Tensor> losses;          // last stage only
  std::map<Key, torch::Tensor> handed_inputs;   // from a local stage s-1, for stage s
  std::map<Key, torch::Tensor> handed_grads;    // from a local stage s+1, for stage s
  std::map<Key, torch::Tensor> input_grads;     // gradient of stage s's input, to send
  std::map<Key, PendingWeightGrad> pending_weights;  // I ran, W has not
  std::set<Key> early_sends;                         // F outputs already sent by an OVERLAP_F_B
  std::vector<PendingSend> sends;
  absl::Time step_start;
  absl::Duration action_wait;  // time the current action spent blocked on receives
  StepResult result;
};

PipelineExecutor::PipelineExecutor(ExecutorOptions options, transport::Transport* transport,
                                   std::map<int, model::StageModel*> stages)
    : options_(std::move(options)), transport_(transport), stages_(std::move(stages)) {}

PipelineExecutor::~PipelineExecutor() = default;

bool PipelineExecutor::Local(int stage) const { return stages_.count(stage) > 0; }

absl::Status PipelineExecutor::AgreeShapes(const std::vector<TensorMeta>& first_stage_inputs) {
  const int m = options_.num_microbatches;
  // Shape messages are int64 words in memory the transport moves (device memory for NCCL).
  const torch::TensorOptions wire =
      torch::TensorOptions(torch::kInt64)
          .device(TransportTakesDeviceMemory() ? options_.device : torch::Device(torch::kCPU));
  std::vector<torch::Tensor> send_buffers;
  std::vector<std::pair<int, std::unique_ptr<transport::Work>>> sends;  // peer, work
  for (auto& [s, model] : stages_) {
    const std::string where =
        absl::StrCat("rank ", options_.rank, ", agreeing shapes of stage ", s);
    std::vector<TensorMeta> in;
    if (s == 0) {
      if (static_cast<int>(first_stage_inputs.size()) != m) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": expected ", m, " microbatch input shapes, got ", first_stage_inputs.size()));
      }
      in = first_stage_inputs;
    } else if (Local(s - 1)) {
      in = output_meta_[s - 1];
    } else {
      const int peer = RankOf(s - 1);
      torch::Tensor received = torch::empty({m * kMetaWords}, wire);
      ASSIGN_OR_RETURN(auto work, transport_->Recv(received.data_ptr(), received.nbytes(), peer,
                                                   MessageTag(Payload::kShapes, s - 1, 0)));
      absl::Status waited = work->Wait(options_.comm_timeout);
      if (!waited.ok()) {
        return absl::Status(waited.code(),
                            absl::StrCat(where, ": waiting for the shapes of stage ", s - 1,
                                         "'s output from rank ", peer, ": ", waited.message()));
      }
      const torch::Tensor words = received.to(torch::kCPU);
      for (int mb = 0; mb < m; ++mb) {
        const int64_t* w = words.data_ptr<int64_t>() + static_cast<size_t>(mb) * kMetaWords;
        const int64_t ndim = w[1];
        if (w[0] < 0 || w[0] >= static_cast<int64_t>(torch::ScalarType::NumOptions) || ndim < 0 ||
            ndim > kMaxDims) {
          return absl::DataLossError(absl::StrCat(where, ": malformed shape message from rank ",
                                                  peer, " for microbatch ", mb));
        }
        in.push_back(TensorMeta{std::vector<int64_t>(w + 2, w + 2 + ndim),
                                static_cast<torch::ScalarType>(w[0])});
      }
    }
    std::vector<TensorMeta> out;
    for (int mb = 0; mb < m; ++mb) {
      // Microbatches of one shape have one output shape: infer each distinct shape once.
      int same = -1;
      for (int j = 0; j < mb; ++j) {
        if (in[j] == in[mb]) same = j;
      }
      if (same >= 0) {
        out.push_back(out[same]);
        continue;
      }
      const std::string from =
          s == 0 ? std::string("the batch") : absl::StrCat("stage ", s - 1, "'s output");
      RETURN_IF_ERROR(GuardTorch(absl::StrCat(where, ", microbatch ", mb, " (input ",
                                              in[mb].ToString(), " from ", from, ")"),
                                 [&]() -> absl::Status {
                                   torch::NoGradGuard no_grad;
                                   torch::Tensor probe = torch::zeros(
                                       in[mb].shape,
                                       torch::TensorOptions(in[mb].dtype).device(options_.device));
                                   out.push_back(MetaOf(model->Forward(probe)));
                                   return absl::OkStatus();
                                 }));
    }
    input_meta_[s] = in;
    output_meta_[s] = out;
    if (s + 1 < options_.num_stages && !Local(s + 1)) {
      torch::Tensor words = torch::zeros({m * kMetaWords}, torch::kInt64);
      for (int mb = 0; mb < m; ++mb) {
        if (out[mb].shape.size() > kMaxDims) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": output has more than ", kMaxDims, " dimensions"));
        }
        int64_t* w = words.data_ptr<int64_t>() + static_cast<size_t>(mb) * kMetaWords;
        w[0] = static_cast<int64_t>(out[mb].dtype);
        w[1] = static_cast<int64_t>(out[mb].shape.size());
        for (size_t d = 0; d < out[mb].shape.size(); ++d) w[2 + d] = out[mb].shape[d];
      }
      const torch::Tensor& sent = send_buffers.emplace_back(words.to(wire.device()));
      const int peer = RankOf(s + 1);
      ASSIGN_OR_RETURN(auto work, transport_->Send(sent.data_ptr(), sent.nbytes(), peer,
                                                   MessageTag(Payload::kShapes, s, 0)));
      sends.emplace_back(peer, std::move(work));
    }
  }
  for (auto& [peer, work] : sends) {
    absl::Status sent = work->Wait(options_.comm_timeout);
    if (!sent.ok()) {
      return absl::Status(
          sent.code(), absl::StrCat("rank ", options_.rank, ": sending shapes to rank ", peer, ": ",
                                    sent.message()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<StepResult> PipelineExecutor::RunStep(const std::vector<Action>& actions,
                                                     const std::vector<torch::Tensor>& inputs,
                                                     const std::vector<torch::Tensor>& targets) {
  StepState state;
  state.inputs = &inputs;
  state.targets = &targets;
  state.step_start = absl::Now();
  state.result.start = state.step_start;
  state.result.executed.reserve(actions.size());
  state.result.timings.reserve(actions.size());
  const int m = options_.num_microbatches;
  const int last = options_.num_stages - 1;
  const bool owns_last = Local(last);
  const bool wants_losses = owns_last && !options_.forward_only;
  if (wants_losses)
    state.result.microbatch_losses.assign(m, std::numeric_limits<double>::quiet_NaN());
  if (owns_last && options_.forward_only) state.result.outputs.resize(m);

  absl::Status status = absl::OkStatus();
  if (Local(0) && static_cast<int>(inputs.size()) != m) {
    status = absl::InvalidArgumentError(absl::StrCat("rank ", options_.rank, ": expected ", m,
                                                     " input microbatches, got ", inputs.size()));
  }
  if (status.ok() && wants_losses && static_cast<int>(targets.size()) != m) {
    status = absl::InvalidArgumentError(absl::StrCat("rank ", options_.rank, ": expected ", m,
                                                     " target microbatches, got ", targets.size()));
  }
  absl::Duration busy;
  for (size_t i = 0; status.ok() && i < actions.size(); ++i) {
    state.action_wait = absl::ZeroDuration();
    const absl::Duration start = absl::Now() - state.step_start;
    status = Execute(actions[i], state);
    if (!status.ok()) break;
    ActionTiming timing{start, absl::Now() - state.step_start, state.action_wait};
    if (schedule::IsCompute(actions[i].type)) busy += timing.end - timing.start - timing.wait;
    state.result.executed.push_back(actions[i].ToString());
    state.result.timings.push_back(timing);
  }
  for (PendingSend& send : state.sends) {
    if (!status.ok()) break;
    absl::Status sent = send.work->Wait(options_.comm_timeout);
    if (!sent.ok()) {
      status = absl::Status(
          sent.code(), absl::StrCat("rank ", options_.rank, ": ", send.what, ": ", sent.message()));
    }
  }
  if (status.ok()) {
    std::vector<std::string> unused;
    for (const auto& [k, r] : state.activation_recvs) {
      unused.push_back(absl::StrCat("activation of stage ", k.stage, " microbatch ", k.microbatch));
    }
    for (const auto& [k, r] : state.gradient_recvs) {
      unused.push_back(absl::StrCat("gradient of stage ", k.stage, " microbatch ", k.microbatch));
    }
    if (!unused.empty()) {
      status = absl::FailedPreconditionError(absl::StrCat(
          "rank ", options_.rank,
          ": the step ended with receives no action used: ", absl::StrJoin(unused, ", ")));
    }
  }
  if (status.ok() && !state.pending_weights.empty()) {
    const Key& k = state.pending_weights.begin()->first;
    status = absl::FailedPreconditionError(
        absl::StrCat("rank ", options_.rank, ": the step ended without the W of stage ", k.stage,
                     " microbatch ", k.microbatch, " after its I"));
  }
  for (int mb = 0; status.ok() && owns_last && mb < m; ++mb) {
    const bool missing = wants_losses ? std::isnan(state.result.microbatch_losses[mb])
                                      : !state.result.outputs[mb].defined();
    if (missing) {
      status = absl::FailedPreconditionError(absl::StrCat(
          "rank ", options_.rank, ": the step ended without a forward of the last stage (", last,
          ") on microbatch ", mb));
    }
  }
  if (!status.ok()) {
    // Buffers of posted transfers are freed when `state` goes away; after an error the data
    // plane of this job is unusable anyway, and Abort guarantees nothing writes into them.
    transport_->Abort();
    return status;
  }
  state.result.duration = absl::Now() - state.step_start;
  state.result.bubble_ratio =
      state.result.duration > absl::ZeroDuration()
          ? std::max(0.0, 1.0 - absl::FDivDuration(busy, state.result.duration))
          : 0.0;
  return std::move(state.result);
}

bool PipelineExecutor::TransportTakesDeviceMemory() const {
  return transport_->backend() == "nccl";
}

absl::Status PipelineExecutor::PostRecv(bool gradient, int stage, int microbatch,
                                        const TensorMeta& meta, int peer, uint64_t tag,
                                        const std::string& where, StepState& st) {
  std::map<Key, PendingRecv>& recvs = gradient ? st.gradient_recvs : st.activation_recvs;
  const Key key{stage, microbatch};
  if (recvs.count(key) > 0) {
    return absl::FailedPreconditionError(absl::StrCat(where, ": posted twice in one step"));
  }
  PendingRecv recv;
  recv.peer = peer;
  const torch::Device device = TransportTakesDeviceMemory() ? options_.device : torch::kCPU;
  recv.buffer = torch::empty(meta.shape, torch::TensorOptions(meta.dtype).device(device));
  ASSIGN_OR_RETURN(recv.work,
                   transport_->Recv(recv.buffer.data_ptr(), recv.buffer.nbytes(), peer, tag));
  recvs.emplace(key, std::move(recv));
  return absl::OkStatus();
}

absl::StatusOr<torch::Tensor> PipelineExecutor::WaitRecv(bool gradient, int stage, int microbatch,
                                                         const std::string& where, StepState& st) {
  std::map<Key, PendingRecv>& recvs = gradient ? st.gradient_recvs : st.activation_recvs;
  const char* what = gradient ? "output gradient" : "activation";
  auto it = recvs.find(Key{stage, microbatch});
  if (it == recvs.end()) {
    return absl::FailedPreconditionError(absl::StrCat(where, ": needs the ", what, " of stage ",
                                                      stage, " microbatch ", microbatch,
                                                      ", but no receive for it was posted"));
  }
  const absl::Time before = absl::Now();
  absl::Status waited = it->second.work->Wait(options_.comm_timeout);
  st.action_wait += absl::Now() - before;
  if (!waited.ok()) {
    return absl::Status(
        waited.code(),
        absl::StrCat(where, ": waiting for the ", what, " of stage ", stage, " microbatch ",
                     microbatch, " from rank ", it->second.peer, ": ", waited.message()));
  }
  torch::Tensor t = std::move(it->second.buffer);
  recvs.erase(it);
  if (t.device() != options_.device) t = t.to(options_.device);
  return t;
}

absl::Status PipelineExecutor::PostSend(const torch::Tensor& t, const TensorMeta& meta, int peer,
                                        uint64_t tag, const std::string& what,
                                        const std::string& where, StepState& st) {
  if (!(MetaOf(t) == meta)) {
    return absl::FailedPreconditionError(absl::StrCat(where, ": ", what, " is ",
                                                      MetaOf(t).ToString(), " but ",
                                                      meta.ToString(), " was agreed at set-up"));
  }
  PendingSend pending;
  pending.buffer = t.detach();
  if (!TransportTakesDeviceMemory() && !pending.buffer.is_cpu()) {
    pending.buffer = pending.buffer.to(torch::kCPU);
  }
  pending.buffer = pending.buffer.contiguous();
  pending.what = absl::StrCat(where, ": sending the ", what, " to rank ", peer);
  ASSIGN_OR_RETURN(pending.work,
                   transport_->Send(pending.buffer.data_ptr(), pending.buffer.nbytes(), peer, tag));
  st.sends.push_back(std::move(pending));
  return absl::OkStatus();
}

absl::Status PipelineExecutor::Execute(const Action& action, StepState& st) {
  const std::string where = absl::StrCat("rank ", options_.rank, ", action ", action.ToString());
  if (action.type == ActionType::kOverlapFB) {
    for (const Action& sub : action.sub_actions) {
      const std::string sub_where = absl::StrCat(where, " (", sub.ToString(), ")");
      if (sub.sub_actions.empty() && !Local(sub.stage)) {
        return absl::InvalidArgumentError(
            absl::StrCat(sub_where, ": stage ", sub.stage, " is not on this rank"));
      }
      RETURN_IF_ERROR(Execute(sub, st));
      // Start the forward output's transfer now, so that it overlaps the backward that follows.
      const int s = sub.stage;
      if (sub.type == ActionType::kForward && s + 1 < options_.num_stages && !Local(s + 1)) {
        RETURN_IF_ERROR(SendActivation(s, sub.microbatch.value_or(-1), sub_where, st));
        st.early_sends.insert(Key{s, sub.microbatch.value_or(-1)});
      }
    }
    return absl::OkStatus();
  }
  const int s = action.stage;
  const int mb = action.microbatch.value_or(-1);
  const int last = options_.num_stages - 1;
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

  switch (action.type) {
    case ActionType::kRecvF:
      if (s == 0 || Local(s - 1)) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": stage ", s, " receives no activation from another rank"));
      }
      return PostRecv(false, s, mb, input_meta_[s][mb], RankOf(s - 1),
                      MessageTag(Payload::kActivation, s - 1, mb), where, st);

    case ActionType::kRecvB:
      if (s == last || Local(s + 1)) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": stage ", s, " receives no gradient from another rank"));
      }
      return PostRecv(true, s, mb, output_meta_[s][mb], RankOf(s + 1),
                      MessageTag(Payload::kGradient, s, mb), where, st);

    case ActionType::kForward:
      return Forward(s, mb, where, st);

    case ActionType::kSendF:
      if (s == last || Local(s + 1)) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": stage ", s + 1, " is not on another rank"));
      }
      if (st.early_sends.erase(Key{s, mb}) > 0) return absl::OkStatus();  // sent at the overlap
      return SendActivation(s, mb, where, st);

    case ActionType::kFullBackward:
      return Backward(s, mb, /*split=*/false, where, st);

    case ActionType::kBackwardInput:
      return Backward(s, mb, /*split=*/true, where, st);

    case ActionType::kBackwardWeight: {
      auto it = st.pending_weights.find(Key{s, mb});
      if (it == st.pending_weights.end()) {
        return absl::FailedPreconditionError(
            absl::StrCat(where, ": W before the I of stage ", s, " microbatch ", mb));
      }
      PendingWeightGrad pending = std::move(it->second);
      st.pending_weights.erase(it);
      return GuardTorch(where, [&]() -> absl::Status {
        SplitBackward::BackwardWeight(std::move(pending));
        return absl::OkStatus();
      });
    }

    case ActionType::kSendB:
      if (s == 0 || Local(s - 1)) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": stage ", s - 1, " is not on another rank"));
      }
      return SendGradient(s, mb, where, st);

    case ActionType::kReduceGrad:
      if (!options_.scale_grads || options_.num_microbatches == 1) return absl::OkStatus();
      return GuardTorch(where, [&]() -> absl::Status {
        torch::NoGradGuard no_grad;
        for (torch::Tensor& p : stages_.at(s)->Parameters()) {
          if (p.grad().defined()) p.mutable_grad().div_(options_.num_microbatches);
        }
        return absl::OkStatus();
      });

    case ActionType::kUnshard:
    case ActionType::kReshard:
      return absl::OkStatus();  // stages are not sharded: their parameters are always whole

    default:
      return absl::UnimplementedError(absl::StrCat(where, ": action type ",
                                                   schedule::ActionTypeName(action.type),
                                                   " is not supported by this worker"));
  }
}

absl::Status PipelineExecutor::Forward(int s, int mb, const std::string& where, StepState& st) {
  const Key key{s, mb};
  const int last = options_.num_stages - 1;
  torch::Tensor x;
  if (s == 0) {
    x = (*st.inputs)[mb];
    if (!(MetaOf(x) == input_meta_[0][mb])) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": input microbatch is ", MetaOf(x).ToString(), " but ",
                       input_meta_[0][mb].ToString(), " was agreed at set-up"));
    }
    if (x.device() != options_.device) x = x.to(options_.device);
  } else if (Local(s - 1)) {
    auto it = st.handed_inputs.find(key);
    if (it == st.handed_inputs.end()) {
      return absl::FailedPreconditionError(absl::StrCat(
          where, ": stage ", s - 1, " has not run forward on microbatch ", mb, " yet"));
    }
    x = std::move(it->second);
    st.handed_inputs.erase(it);
  } else {
    ASSIGN_OR_RETURN(x, WaitRecv(false, s, mb, where, st));
  }
  if (st.stage_inputs.count(key) > 0 || st.stage_outputs.count(key) > 0 ||
      st.losses.count(key) > 0) {
    return absl::FailedPreconditionError(absl::StrCat(where, ": forward ran twice"));
  }
  return GuardTorch(where, [&]() -> absl::Status {
    model::StageModel* model = stages_.at(s);
    if (options_.forward_only) {
      torch::NoGradGuard no_grad;
      torch::Tensor y = model->Forward(x);
      if (s == last) {
        st.result.outputs[mb] = y.to(torch::kCPU);
      } else {
        st.stage_outputs[key] = y;
        if (Local(s + 1)) st.handed_inputs[Key{s + 1, mb}] = y;
      }
      return absl::OkStatus();
    }
    if (s > 0) x.requires_grad_(true);
    torch::Tensor y = model->Forward(x);
    st.stage_inputs[key] = x;
    if (s == last) {
      torch::Tensor loss = ComputeLoss(options_.loss, y, (*st.targets)[mb].to(options_.device));
      st.result.microbatch_losses[mb] = loss.item<double>();
      st.losses[key] = loss;
    } else {
      st.stage_outputs[key] = y;
      if (Local(s + 1)) st.handed_inputs[Key{s + 1, mb}] = y.detach();
    }
    return absl::OkStatus();
  });
}

absl::Status PipelineExecutor::SendActivation(int s, int mb, const std::string& where,
                                              StepState& st) {
  const Key key{s, mb};
  auto it = st.stage_outputs.find(key);
  if (it == st.stage_outputs.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat(where, ": no forward output of stage ", s, " microbatch ", mb, " to send"));
  }
  absl::Status sent = PostSend(
      it->second, output_meta_[s][mb], RankOf(s + 1), MessageTag(Payload::kActivation, s, mb),
      absl::StrCat("activation of stage ", s, " microbatch ", mb), where, st);
  // Forward-only steps keep no graph; training steps keep the output for the backward.
  if (options_.forward_only) st.stage_outputs.erase(it);
  return sent;
}

absl::Status PipelineExecutor::Backward(int s, int mb, bool split, const std::string& where,
                                        StepState& st) {
  const Key key{s, mb};
  const int last = options_.num_stages - 1;
  auto in = st.stage_inputs.find(key);
  if (in == st.stage_inputs.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat(where, ": backward before forward of stage ", s, " microbatch ", mb));
  }
  // The gradient of the stage's output: the loss's own on the last stage.
  torch::Tensor output;
  torch::Tensor grad;
  if (s == last) {
    output = st.losses.at(key);
  } else {
    output = st.stage_outputs.at(key);
    if (Local(s + 1)) {
      auto it = st.handed_grads.find(key);
      if (it == st.handed_grads.end()) {
        return absl::FailedPreconditionError(absl::StrCat(
            where, ": stage ", s + 1, " has not run backward on microbatch ", mb, " yet"));
      }
      grad = std::move(it->second);
      st.handed_grads.erase(it);
    } else {
      ASSIGN_OR_RETURN(grad, WaitRecv(true, s, mb, where, st));
    }
  }
  torch::Tensor input_grad;
  RETURN_IF_ERROR(GuardTorch(where, [&]() -> absl::Status {
    if (split) {
      PendingWeightGrad pending;
      input_grad = SplitBackward::BackwardInput({output}, {grad}, in->second, &pending);
      st.pending_weights.emplace(key, std::move(pending));
      return absl::OkStatus();
    }
    if (grad.defined()) {
      torch::autograd::backward({output}, {grad});
    } else {
      torch::autograd::backward({output});
    }
    if (s > 0) {
      input_grad = in->second.grad();
      if (!input_grad.defined()) input_grad = torch::zeros_like(in->second);
    }
    return absl::OkStatus();
  }));
  if (s > 0) {
    if (Local(s - 1)) {
      st.handed_grads[Key{s - 1, mb}] = input_grad;
    } else {
      st.input_grads[key] = input_grad;
    }
  }
  // After B the graph is gone; after I it lives on in the pending W only.
  st.stage_inputs.erase(in);
  st.stage_outputs.erase(key);
  st.losses.erase(key);
  return absl::OkStatus();
}

absl::Status PipelineExecutor::SendGradient(int s, int mb, const std::string& where,
                                            StepState& st) {
  auto it = st.input_grads.find(Key{s, mb});
  if (it == st.input_grads.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat(where, ": no input gradient of stage ", s, " microbatch ", mb, " to send"));
  }
  absl::Status sent = PostSend(
      it->second, input_meta_[s][mb], RankOf(s - 1), MessageTag(Payload::kGradient, s - 1, mb),
      absl::StrCat("input gradient of stage ", s, " microbatch ", mb), where, st);
  st.input_grads.erase(it);
  return sent;
}

}  // namespace stagecoach::runtime
