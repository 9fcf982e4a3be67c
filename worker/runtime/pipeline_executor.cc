#include "worker/runtime/pipeline_executor.h"

#include <torch/autograd.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/util/status_macros.h"
#include "worker/runtime/message_tags.h"
#include "worker/runtime/split_backward.h"

namespace stagecoach::runtime {
namespace {

using schedule::Action;
using schedule::ActionType;

// A TensorMeta on the wire: [dtype, requires_grad, ndim, d0 .. d(kMaxDims-1)].
constexpr int kMaxDims = 8;
constexpr int kMetaWords = 3 + kMaxDims;

TensorMeta MetaOf(const torch::Tensor& t) { return TensorMeta{t.sizes().vec(), t.scalar_type()}; }

struct Key {
  int stage;
  int microbatch;
  friend bool operator<(const Key& a, const Key& b) {
    return a.stage != b.stage ? a.stage < b.stage : a.microbatch < b.microbatch;
  }
};

// A value edge (PipelineExecutor::ValueEdge, by index) for one microbatch.
struct EdgeKey {
  int edge;
  int microbatch;
  friend bool operator<(const EdgeKey& a, const EdgeKey& b) {
    return a.edge != b.edge ? a.edge < b.edge : a.microbatch < b.microbatch;
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

std::string MetasToString(const std::vector<TensorMeta>& metas) {
  std::vector<std::string> parts;
  for (const TensorMeta& m : metas) parts.push_back(m.ToString());
  return absl::StrJoin(parts, ", ");
}

}  // namespace

std::string TensorMeta::ToString() const {
  return absl::StrCat(c10::toString(dtype), "[", absl::StrJoin(shape, ", "), "]");
}

struct PipelineExecutor::StepState {
  const std::vector<torch::Tensor>* inputs = nullptr;
  const std::vector<torch::Tensor>* targets = nullptr;
  std::map<EdgeKey, PendingRecv> activation_recvs;          // an input value on its way
  std::map<EdgeKey, PendingRecv> gradient_recvs;            // an output value's gradient on its way
  std::map<Key, std::vector<torch::Tensor>> stage_inputs;   // what F consumed
  std::map<Key, std::vector<torch::Tensor>> stage_outputs;  // what F produced (not last stage)
  std::map<Key, torch::Tensor> losses;                      // last stage only
  std::map<EdgeKey, torch::Tensor> handed_values;    // from a local producer, for a local consumer
  std::map<EdgeKey, torch::Tensor> handed_grads;     // from a local consumer, for a local producer
  std::map<EdgeKey, torch::Tensor> input_grads;      // for a producer on another rank, to send
  std::map<Key, PendingWeightGrad> pending_weights;  // I ran, W has not
  std::set<Key> early_sends;                         // F outputs already sent by an OVERLAP_F_B
  std::vector<PendingSend> sends;
  absl::Time step_start;
  absl::Duration action_wait;  // time the current action spent blocked on receives
  StepResult result;
};

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

absl::Status PipelineExecutor::AgreeShapes(const std::vector<TensorMeta>& first_stage_inputs) {
  const int m = options_.num_microbatches;
  const int num_stages = options_.num_stages;
  if (static_cast<int>(options_.wiring.size()) != num_stages) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", options_.rank, ": the wiring has ",
                                                   options_.wiring.size(), " stages, expected ",
                                                   num_stages));
  }
  for (int c = 0; c < num_stages; ++c) {
    for (size_t i = 0; i < options_.wiring[c].inputs.size(); ++i) {
      const model::ValueSource& src = options_.wiring[c].inputs[i];
      const bool ok = src.stage == -1 ? c == 0
                                      : src.stage >= 0 && src.stage < c && src.index >= 0 &&
                                            src.index < options_.wiring[src.stage].num_outputs;
      if (!ok) {
        return absl::InvalidArgumentError(absl::StrCat(
            "rank ", options_.rank, ": input ", i, " of stage ", c, " comes from output ",
            src.index, " of stage ", src.stage, ", which is not an earlier stage's output"));
      }
    }
  }
  if (options_.wiring[num_stages - 1].num_outputs != 1) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", options_.rank, ": the last stage has ",
                                                   options_.wiring[num_stages - 1].num_outputs,
                                                   " outputs; it must have one, the model's"));
  }
  // Shape messages are int64 words in memory the transport moves (device memory for NCCL).
  const torch::TensorOptions wire =
      torch::TensorOptions(torch::kInt64)
          .device(TransportTakesDeviceMemory() ? options_.device : torch::Device(torch::kCPU));
  std::vector<torch::Tensor> send_buffers;
  std::vector<std::pair<int, std::unique_ptr<transport::Work>>> sends;  // peer, work
  for (auto& [s, model] : stages_) {
    const std::string where =
        absl::StrCat("rank ", options_.rank, ", agreeing shapes of stage ", s);
    const size_t n_in = options_.wiring[s].inputs.size();
    std::vector<std::vector<TensorMeta>> in(m, std::vector<TensorMeta>(n_in));
    std::set<int> received_from;  // producers whose pair message has been received
    for (size_t i = 0; i < n_in; ++i) {
      const int e = edges_into_[s][i];
      if (e < 0) {
        if (static_cast<int>(first_stage_inputs.size()) != m) {
          return absl::InvalidArgumentError(absl::StrCat(where, ": expected ", m,
                                                         " microbatch input shapes, got ",
                                                         first_stage_inputs.size()));
        }
        for (int mb = 0; mb < m; ++mb) {
          in[mb][i] = first_stage_inputs[mb];
          in[mb][i].requires_grad = false;
        }
        continue;
      }
      const int p = edges_[e].producer;
      if (Local(p)) {
        for (int mb = 0; mb < m; ++mb) in[mb][i] = output_meta_.at(p)[mb][edges_[e].output];
        continue;
      }
      if (!received_from.insert(p).second) continue;
      // The pair message: every value p sends s, in edge order, for every microbatch.
      std::vector<int> pair;
      for (size_t f = 0; f < edges_.size(); ++f) {
        if (edges_[f].producer == p && edges_[f].consumer == s) pair.push_back(static_cast<int>(f));
      }
      const int peer = RankOf(p);
      const int64_t words_per_mb = static_cast<int64_t>(pair.size()) * kMetaWords;
      torch::Tensor received = torch::empty({m * words_per_mb}, wire);
      ASSIGN_OR_RETURN(auto work,
                       transport_->Recv(received.data_ptr(), received.nbytes(), peer,
                                        MessageTag(Payload::kShapes, PairEdge(p, s), 0)));
      absl::Status waited = work->Wait(options_.comm_timeout);
      if (!waited.ok()) {
        return absl::Status(waited.code(),
                            absl::StrCat(where, ": waiting for the shapes of stage ", p,
                                         "'s output from rank ", peer, ": ", waited.message()));
      }
      const torch::Tensor words = received.to(torch::kCPU);
      for (int mb = 0; mb < m; ++mb) {
        for (size_t j = 0; j < pair.size(); ++j) {
          const int64_t* w =
              words.data_ptr<int64_t>() + mb * words_per_mb + static_cast<int64_t>(j) * kMetaWords;
          const int64_t ndim = w[2];
          if (w[0] < 0 || w[0] >= static_cast<int64_t>(torch::ScalarType::NumOptions) || ndim < 0 ||
              ndim > kMaxDims) {
            return absl::DataLossError(absl::StrCat(where, ": malformed shape message from rank ",
                                                    peer, " for microbatch ", mb));
          }
          TensorMeta meta{std::vector<int64_t>(w + 3, w + 3 + ndim),
                          static_cast<torch::ScalarType>(w[0])};
          meta.requires_grad = w[1] != 0;
          in[mb][edges_[pair[j]].input] = std::move(meta);
        }
      }
    }
    std::vector<std::vector<TensorMeta>> out(m);
    for (int mb = 0; mb < m; ++mb) {
      // Microbatches of one shape have one output shape: infer each distinct shape once.
      int same = -1;
      for (int j = 0; j < mb; ++j) {
        if (in[j] == in[mb]) same = j;
      }
      if (same >= 0) {
        out[mb] = out[same];
        continue;
      }
      std::string from;
      if (IsChain(options_.wiring)) {
        from = absl::StrCat(
            " (input ", in[mb][0].ToString(), " from ",
            s == 0 ? std::string("the batch") : absl::StrCat("stage ", s - 1, "'s output"), ")");
      } else {
        from = absl::StrCat(" (inputs ", MetasToString(in[mb]), ")");
      }
      RETURN_IF_ERROR(
          GuardTorch(absl::StrCat(where, ", microbatch ", mb, from), [&]() -> absl::Status {
            // Training probes record autograd, to learn which outputs carry a gradient back.
            torch::AutoGradMode grad_mode(!options_.forward_only);
            std::vector<torch::Tensor> probes;
            for (const TensorMeta& meta : in[mb]) {
              torch::Tensor t = torch::zeros(
                  meta.shape, torch::TensorOptions(meta.dtype).device(options_.device));
              if (meta.requires_grad && !options_.forward_only && t.is_floating_point()) {
                t.requires_grad_(true);
              }
              probes.push_back(std::move(t));
            }
            std::vector<torch::Tensor> values = model->ForwardValues(probes);
            if (static_cast<int>(values.size()) != options_.wiring[s].num_outputs) {
              return absl::InvalidArgumentError(
                  absl::StrCat("the stage returned ", values.size(), " values, but its wiring has ",
                               options_.wiring[s].num_outputs, " outputs"));
            }
            for (const torch::Tensor& v : values) {
              TensorMeta meta = MetaOf(v);
              meta.requires_grad = !options_.forward_only && v.requires_grad();
              out[mb].push_back(std::move(meta));
            }
            return absl::OkStatus();
          }));
    }
    input_meta_[s] = in;
    output_meta_[s] = out;
    // One pair message to each consumer stage on another rank.
    std::map<int, std::vector<int>> pairs;  // consumer -> edges, in edge order
    for (size_t f = 0; f < edges_.size(); ++f) {
      if (edges_[f].producer == s && !Local(edges_[f].consumer)) {
        pairs[edges_[f].consumer].push_back(static_cast<int>(f));
      }
    }
    for (const auto& [c, pair] : pairs) {
      const int64_t words_per_mb = static_cast<int64_t>(pair.size()) * kMetaWords;
      torch::Tensor words = torch::zeros({m * words_per_mb}, torch::kInt64);
      for (int mb = 0; mb < m; ++mb) {
        for (size_t j = 0; j < pair.size(); ++j) {
          const TensorMeta& meta = out[mb][edges_[pair[j]].output];
          if (meta.shape.size() > kMaxDims) {
            return absl::InvalidArgumentError(
                absl::StrCat(where, ": output has more than ", kMaxDims, " dimensions"));
          }
          int64_t* w =
              words.data_ptr<int64_t>() + mb * words_per_mb + static_cast<int64_t>(j) * kMetaWords;
          w[0] = static_cast<int64_t>(meta.dtype);
          w[1] = meta.requires_grad ? 1 : 0;
          w[2] = static_cast<int64_t>(meta.shape.size());
          for (size_t d = 0; d < meta.shape.size(); ++d) w[3 + d] = meta.shape[d];
        }
      }
      const torch::Tensor& sent = send_buffers.emplace_back(words.to(wire.device()));
      const int peer = RankOf(c);
      ASSIGN_OR_RETURN(auto work,
                       transport_->Send(sent.data_ptr(), sent.nbytes(), peer,
                                        MessageTag(Payload::kShapes, PairEdge(s, c), 0)));
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
      unused.push_back(absl::StrCat(EdgeName(false, k.edge), " microbatch ", k.microbatch));
    }
    for (const auto& [k, r] : state.gradient_recvs) {
      unused.push_back(absl::StrCat(EdgeName(true, k.edge), " microbatch ", k.microbatch));
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
  if (status.ok() && !state.input_grads.empty()) {
    const EdgeKey& k = state.input_grads.begin()->first;
    status = absl::FailedPreconditionError(absl::StrCat(
        "rank ", options_.rank, ": the step ended without sending the ", EdgeName(true, k.edge),
        " microbatch ", k.microbatch, " (no SEND_B of stage ", edges_[k.edge].consumer, ")"));
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

absl::Status PipelineExecutor::PostRecv(bool gradient, int e, int mb, const std::string& where,
                                        StepState& st) {
  std::map<EdgeKey, PendingRecv>& recvs = gradient ? st.gradient_recvs : st.activation_recvs;
  const EdgeKey key{e, mb};
  if (recvs.count(key) > 0) {
    return absl::FailedPreconditionError(absl::StrCat(where, ": the receive of the ",
                                                      EdgeName(gradient, e), " microbatch ", mb,
                                                      " was posted twice"));
  }
  const TensorMeta& meta = EdgeMeta(e, mb);
  PendingRecv recv;
  recv.peer = RankOf(gradient ? edges_[e].consumer : edges_[e].producer);
  const torch::Device device = TransportTakesDeviceMemory() ? options_.device : torch::kCPU;
  recv.buffer = torch::empty(meta.shape, torch::TensorOptions(meta.dtype).device(device));
  ASSIGN_OR_RETURN(recv.work, transport_->Recv(recv.buffer.data_ptr(), recv.buffer.nbytes(),
                                               recv.peer, EdgeTag(gradient, e, mb)));
  recvs.emplace(key, std::move(recv));
  return absl::OkStatus();
}

absl::StatusOr<torch::Tensor> PipelineExecutor::WaitRecv(bool gradient, int e, int mb,
                                                         const std::string& where, StepState& st) {
  std::map<EdgeKey, PendingRecv>& recvs = gradient ? st.gradient_recvs : st.activation_recvs;
  const ValueEdge& edge = edges_[e];
  auto it = recvs.find(EdgeKey{e, mb});
  if (it == recvs.end()) {
    // A receive the lowered list has an action for must have been posted by it; the others
    // (a skip connection whose stage has a neighbour on this rank) are posted here.
    const bool has_action = gradient ? HasSendF(edge.producer) : HasRecvF(edge.consumer);
    if (has_action) {
      return absl::FailedPreconditionError(absl::StrCat(where, ": needs the ",
                                                        EdgeName(gradient, e), " microbatch ", mb,
                                                        ", but no receive for it was posted"));
    }
    RETURN_IF_ERROR(PostRecv(gradient, e, mb, where, st));
    it = recvs.find(EdgeKey{e, mb});
  }
  const absl::Time before = absl::Now();
  absl::Status waited = it->second.work->Wait(options_.comm_timeout);
  st.action_wait += absl::Now() - before;
  if (!waited.ok()) {
    return absl::Status(
        waited.code(),
        absl::StrCat(where, ": waiting for the ", EdgeName(gradient, e), " microbatch ", mb,
                     " from rank ", it->second.peer, ": ", waited.message()));
  }
  torch::Tensor t = std::move(it->second.buffer);
  st.result.bytes_received_from[it->second.peer] += static_cast<int64_t>(t.nbytes());
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
  st.result.bytes_sent_to[peer] += static_cast<int64_t>(pending.buffer.nbytes());
  st.sends.push_back(std::move(pending));
  return absl::OkStatus();
}

absl::Status PipelineExecutor::PostActivationRecvs(int s, int mb, const std::string& where,
                                                   StepState& st) {
  for (int e : edges_into_[s]) {
    if (e < 0 || Local(edges_[e].producer)) continue;
    RETURN_IF_ERROR(PostRecv(false, e, mb, where, st));
  }
  return absl::OkStatus();
}

absl::Status PipelineExecutor::PostGradientRecvs(int s, int mb, const std::string& where,
                                                 StepState& st) {
  for (size_t e = 0; e < edges_.size(); ++e) {
    const ValueEdge& edge = edges_[e];
    if (edge.producer != s || Local(edge.consumer)) continue;
    if (!EdgeMeta(static_cast<int>(e), mb).requires_grad) continue;
    RETURN_IF_ERROR(PostRecv(true, static_cast<int>(e), mb, where, st));
  }
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
      if (sub.type == ActionType::kForward && HasSendF(s)) {
        RETURN_IF_ERROR(SendActivations(s, sub.microbatch.value_or(-1), sub_where, st));
        st.early_sends.insert(Key{s, sub.microbatch.value_or(-1)});
      }
    }
    return absl::OkStatus();
  }
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
      return Forward(s, mb, where, st);

    case ActionType::kSendF:
      if (!HasSendF(s)) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": stage ", s + 1, " is not on another rank"));
      }
      if (st.early_sends.erase(Key{s, mb}) > 0) return absl::OkStatus();  // sent at the overlap
      return SendActivations(s, mb, where, st);

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
      if (!HasRecvF(s)) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": stage ", s - 1, " is not on another rank"));
      }
      return SendGradients(s, mb, where, st);

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
  if (st.stage_inputs.count(key) > 0 || st.stage_outputs.count(key) > 0 ||
      st.losses.count(key) > 0) {
    return absl::FailedPreconditionError(absl::StrCat(where, ": forward ran twice"));
  }
  const size_t n_in = edges_into_[s].size();
  std::vector<torch::Tensor> xs(n_in);
  for (size_t i = 0; i < n_in; ++i) {
    const int e = edges_into_[s][i];
    const TensorMeta& meta = input_meta_.at(s)[mb][i];
    torch::Tensor x;
    if (e < 0) {
      x = (*st.inputs)[mb];
      if (!(MetaOf(x) == meta)) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": input microbatch is ",
                                                       MetaOf(x).ToString(), " but ",
                                                       meta.ToString(), " was agreed at set-up"));
      }
      if (x.device() != options_.device) x = x.to(options_.device);
    } else if (Local(edges_[e].producer)) {
      auto it = st.handed_values.find(EdgeKey{e, mb});
      if (it == st.handed_values.end()) {
        return absl::FailedPreconditionError(absl::StrCat(where, ": stage ", edges_[e].producer,
                                                          " has not run forward on microbatch ", mb,
                                                          " yet"));
      }
      x = std::move(it->second);
      st.handed_values.erase(it);
    } else {
      ASSIGN_OR_RETURN(x, WaitRecv(false, e, mb, where, st));
    }
    if (!options_.forward_only && meta.requires_grad && x.is_floating_point()) {
      x.requires_grad_(true);
    }
    xs[i] = std::move(x);
  }
  RETURN_IF_ERROR(GuardTorch(where, [&]() -> absl::Status {
    model::StageModel* model = stages_.at(s);
    std::vector<torch::Tensor> ys;
    {
      torch::AutoGradMode grad_mode(!options_.forward_only);
      ys = model->ForwardValues(xs);
    }
    if (static_cast<int>(ys.size()) != options_.wiring[s].num_outputs) {
      return absl::InternalError(absl::StrCat("the stage returned ", ys.size(),
                                              " values, but its wiring has ",
                                              options_.wiring[s].num_outputs, " outputs"));
    }
    if (!options_.forward_only) st.stage_inputs[key] = std::move(xs);
    if (s == last) {
      if (options_.forward_only) {
        st.result.outputs[mb] = ys[0].to(torch::kCPU);
      } else {
        torch::Tensor loss =
            ComputeLoss(options_.loss, ys[0], (*st.targets)[mb].to(options_.device));
        st.result.microbatch_losses[mb] = loss.item<double>();
        st.losses[key] = loss;
      }
      return absl::OkStatus();
    }
    for (size_t k = 0; k < ys.size(); ++k) {
      for (int e : edges_out_of_[s][k]) {
        if (!Local(edges_[e].consumer)) continue;
        st.handed_values[EdgeKey{e, mb}] = options_.forward_only ? ys[k] : ys[k].detach();
      }
    }
    st.stage_outputs[key] = std::move(ys);
    return absl::OkStatus();
  }));
  // Values for other ranks the lowered list has no SEND_F for (the next stage is on this rank)
  // go now.
  if (s != last && !HasSendF(s)) return SendActivations(s, mb, where, st);
  return absl::OkStatus();
}

absl::Status PipelineExecutor::SendActivations(int s, int mb, const std::string& where,
                                               StepState& st) {
  const Key key{s, mb};
  auto it = st.stage_outputs.find(key);
  if (it == st.stage_outputs.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat(where, ": no forward output of stage ", s, " microbatch ", mb, " to send"));
  }
  for (size_t e = 0; e < edges_.size(); ++e) {
    const ValueEdge& edge = edges_[e];
    if (edge.producer != s || Local(edge.consumer)) continue;
    RETURN_IF_ERROR(PostSend(it->second[edge.output], EdgeMeta(static_cast<int>(e), mb),
                             RankOf(edge.consumer), EdgeTag(false, static_cast<int>(e), mb),
                             absl::StrCat(EdgeName(false, static_cast<int>(e)), " microbatch ", mb),
                             where, st));
  }
  // Forward-only steps keep no graph; training steps keep the outputs for the backward.
  if (options_.forward_only) st.stage_outputs.erase(it);
  return absl::OkStatus();
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
  // The outputs to run backward from, and their gradients: the loss's own on the last stage,
  // else each output's gradients from its consumers, summed.
  std::vector<torch::Tensor> outputs;
  std::vector<torch::Tensor> grads;
  if (s == last) {
    outputs.push_back(st.losses.at(key));
    grads.emplace_back();
  } else {
    const std::vector<torch::Tensor>& ys = st.stage_outputs.at(key);
    for (size_t k = 0; k < ys.size(); ++k) {
      torch::Tensor grad;
      for (int e : edges_out_of_[s][k]) {
        if (!EdgeMeta(e, mb).requires_grad) continue;
        torch::Tensor g;
        if (Local(edges_[e].consumer)) {
          auto it = st.handed_grads.find(EdgeKey{e, mb});
          if (it == st.handed_grads.end()) {
            return absl::FailedPreconditionError(
                absl::StrCat(where, ": stage ", edges_[e].consumer,
                             " has not run backward on microbatch ", mb, " yet"));
          }
          g = std::move(it->second);
          st.handed_grads.erase(it);
        } else {
          ASSIGN_OR_RETURN(g, WaitRecv(true, e, mb, where, st));
        }
        grad = grad.defined() ? grad + g : g;
      }
      if (grad.defined() && ys[k].requires_grad()) {
        outputs.push_back(ys[k]);
        grads.push_back(std::move(grad));
      }
    }
  }
  std::vector<torch::Tensor>& xs = in->second;
  std::vector<torch::Tensor> input_grads(xs.size());
  RETURN_IF_ERROR(GuardTorch(where, [&]() -> absl::Status {
    if (split) {
      PendingWeightGrad pending;
      input_grads = SplitBackward::BackwardInputs(outputs, grads, xs, &pending);
      st.pending_weights.emplace(key, std::move(pending));
      return absl::OkStatus();
    }
    if (s == last) {
      torch::autograd::backward(outputs);
    } else if (!outputs.empty()) {
      torch::autograd::backward(outputs, grads);
    }
    for (size_t i = 0; i < xs.size(); ++i) {
      if (!xs[i].requires_grad()) continue;
      input_grads[i] = xs[i].grad();
      if (!input_grads[i].defined()) input_grads[i] = torch::zeros_like(xs[i]);
    }
    return absl::OkStatus();
  }));
  for (size_t i = 0; i < xs.size(); ++i) {
    const int e = edges_into_[s][i];
    if (e < 0 || !xs[i].requires_grad()) continue;
    if (Local(edges_[e].producer)) {
      st.handed_grads[EdgeKey{e, mb}] = input_grads[i];
    } else {
      st.input_grads[EdgeKey{e, mb}] = input_grads[i];
    }
  }
  // After B the graph is gone; after I it lives on in the pending W only.
  st.stage_inputs.erase(in);
  st.stage_outputs.erase(key);
  st.losses.erase(key);
  // Gradients for other ranks the lowered list has no SEND_B for (the previous stage is on this
  // rank) go now.
  if (!HasRecvF(s)) return SendGradients(s, mb, where, st);
  return absl::OkStatus();
}

absl::Status PipelineExecutor::SendGradients(int s, int mb, const std::string& where,
                                             StepState& st) {
  for (int e : edges_into_[s]) {
    if (e < 0 || Local(edges_[e].producer) || !EdgeMeta(e, mb).requires_grad) continue;
    auto it = st.input_grads.find(EdgeKey{e, mb});
    if (it == st.input_grads.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat(where, ": no input gradient of stage ", s, " microbatch ", mb, " to send"));
    }
    RETURN_IF_ERROR(
        PostSend(it->second, EdgeMeta(e, mb), RankOf(edges_[e].producer), EdgeTag(true, e, mb),
                 absl::StrCat("input gradient of stage ", s, " microbatch ", mb,
                              IsChain(options_.wiring)
                                  ? std::string()
                                  : absl::StrCat(" (to output ", edges_[e].output, " of stage ",
                                                 edges_[e].producer, ")")),
                 where, st));
    st.input_grads.erase(it);
  }
  return absl::OkStatus();
}

}  // namespace stagecoach::runtime
