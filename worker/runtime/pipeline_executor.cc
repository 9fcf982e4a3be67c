#include "worker/runtime/pipeline_executor.h"

#include <torch/autograd.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/util/status_macros.h"

namespace stagecoach::runtime {
namespace {

using schedule::Action;
using schedule::ActionType;

// What a message carries; part of its tag. Messages over the boundary between stage e and
// e+1 ("edge e") are tagged with e, so the two sides name the same tag.
enum class Payload : uint64_t { kActivation = 1, kGradient = 2, kShapes = 3 };

uint64_t Tag(Payload payload, int edge, int microbatch) {
  return (static_cast<uint64_t>(payload) << 56) | (static_cast<uint64_t>(edge) << 28) |
         static_cast<uint64_t>(microbatch);
}

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
  std::vector<PendingSend> sends;
  StepResult result;
};

PipelineExecutor::PipelineExecutor(ExecutorOptions options, transport::Transport* transport,
                                   std::map<int, model::StageModel*> stages)
    : options_(std::move(options)), transport_(transport), stages_(std::move(stages)) {}

PipelineExecutor::~PipelineExecutor() = default;

bool PipelineExecutor::Local(int stage) const { return stages_.count(stage) > 0; }

absl::Status PipelineExecutor::AgreeShapes(const std::vector<TensorMeta>& first_stage_inputs) {
  const int m = options_.num_microbatches;
  std::vector<std::vector<int64_t>> send_buffers;
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
      std::vector<int64_t> words(static_cast<size_t>(m) * kMetaWords);
      ASSIGN_OR_RETURN(auto work, transport_->Recv(words.data(), words.size() * sizeof(int64_t),
                                                   peer, Tag(Payload::kShapes, s - 1, 0)));
      absl::Status waited = work->Wait(options_.comm_timeout);
      if (!waited.ok()) {
        return absl::Status(waited.code(),
                            absl::StrCat(where, ": waiting for the shapes of stage ", s - 1,
                                         "'s output from rank ", peer, ": ", waited.message()));
      }
      for (int mb = 0; mb < m; ++mb) {
        const int64_t* w = &words[static_cast<size_t>(mb) * kMetaWords];
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
    RETURN_IF_ERROR(GuardTorch(where, [&]() -> absl::Status {
      torch::NoGradGuard no_grad;
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
        torch::Tensor probe = torch::zeros(in[mb].shape, torch::TensorOptions(in[mb].dtype));
        out.push_back(MetaOf(model->Forward(probe)));
      }
      return absl::OkStatus();
    }));
    input_meta_[s] = in;
    output_meta_[s] = out;
    if (s + 1 < options_.num_stages && !Local(s + 1)) {
      std::vector<int64_t>& words = send_buffers.emplace_back(static_cast<size_t>(m) * kMetaWords);
      for (int mb = 0; mb < m; ++mb) {
        if (out[mb].shape.size() > kMaxDims) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": output has more than ", kMaxDims, " dimensions"));
        }
        int64_t* w = &words[static_cast<size_t>(mb) * kMetaWords];
        w[0] = static_cast<int64_t>(out[mb].dtype);
        w[1] = static_cast<int64_t>(out[mb].shape.size());
        for (size_t d = 0; d < out[mb].shape.size(); ++d) w[2 + d] = out[mb].shape[d];
      }
      const int peer = RankOf(s + 1);
      ASSIGN_OR_RETURN(auto work, transport_->Send(words.data(), words.size() * sizeof(int64_t),
                                                   peer, Tag(Payload::kShapes, s, 0)));
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
  const int m = options_.num_microbatches;
  const int last = options_.num_stages - 1;
  const bool owns_last = Local(last);
  if (owns_last) state.result.microbatch_losses.assign(m, std::numeric_limits<double>::quiet_NaN());

  absl::Status status = absl::OkStatus();
  if (Local(0) && static_cast<int>(inputs.size()) != m) {
    status = absl::InvalidArgumentError(absl::StrCat("rank ", options_.rank, ": expected ", m,
                                                     " input microbatches, got ", inputs.size()));
  }
  if (status.ok() && owns_last && static_cast<int>(targets.size()) != m) {
    status = absl::InvalidArgumentError(absl::StrCat("rank ", options_.rank, ": expected ", m,
                                                     " target microbatches, got ", targets.size()));
  }
  for (size_t i = 0; status.ok() && i < actions.size(); ++i) {
    status = Execute(actions[i], state);
    if (status.ok()) state.result.executed.push_back(actions[i].ToString());
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
  if (status.ok() && owns_last) {
    for (int mb = 0; mb < m; ++mb) {
      if (std::isnan(state.result.microbatch_losses[mb])) {
        status = absl::FailedPreconditionError(absl::StrCat(
            "rank ", options_.rank, ": the step ended without a forward of the last stage (", last,
            ") on microbatch ", mb));
        break;
      }
    }
  }
  if (!status.ok()) {
    // Buffers of posted transfers are freed when `state` goes away; after an error the data
    // plane of this job is unusable anyway, and Abort guarantees nothing writes into them.
    transport_->Abort();
    return status;
  }
  return std::move(state.result);
}

absl::Status PipelineExecutor::Execute(const Action& action, StepState& st) {
  const std::string where = absl::StrCat("rank ", options_.rank, ", action ", action.ToString());
  if (action.type == ActionType::kOverlapFB) {
    for (const Action& sub : action.sub_actions) RETURN_IF_ERROR(Execute(sub, st));
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
  model::StageModel* model = stages_.at(s);
  const Key key{s, mb};

  auto post_recv = [&](std::map<Key, PendingRecv>& recvs, const TensorMeta& meta, int peer,
                       uint64_t tag) -> absl::Status {
    if (recvs.count(key) > 0) {
      return absl::FailedPreconditionError(absl::StrCat(where, ": posted twice in one step"));
    }
    PendingRecv recv;
    recv.peer = peer;
    recv.buffer = torch::empty(meta.shape, torch::TensorOptions(meta.dtype));
    ASSIGN_OR_RETURN(recv.work,
                     transport_->Recv(recv.buffer.data_ptr(), recv.buffer.nbytes(), peer, tag));
    recvs.emplace(key, std::move(recv));
    return absl::OkStatus();
  };
  auto wait_recv = [&](std::map<Key, PendingRecv>& recvs,
                       const char* what) -> absl::StatusOr<torch::Tensor> {
    auto it = recvs.find(key);
    if (it == recvs.end()) {
      return absl::FailedPreconditionError(absl::StrCat(where, ": needs the ", what, " of stage ",
                                                        s, " microbatch ", mb,
                                                        ", but no receive for it was posted"));
    }
    absl::Status waited = it->second.work->Wait(options_.comm_timeout);
    if (!waited.ok()) {
      return absl::Status(
          waited.code(),
          absl::StrCat(where, ": waiting for the ", what, " of stage ", s, " microbatch ", mb,
                       " from rank ", it->second.peer, ": ", waited.message()));
    }
    torch::Tensor t = std::move(it->second.buffer);
    recvs.erase(it);
    return t;
  };
  auto send = [&](const torch::Tensor& t, const TensorMeta& agreed, int peer, uint64_t tag,
                  std::string what) -> absl::Status {
    if (!(MetaOf(t) == agreed)) {
      return absl::FailedPreconditionError(
          absl::StrCat(where, ": ", what, " is ", MetaOf(t).ToString(), " but ", agreed.ToString(),
                       " was agreed at set-up"));
    }
    PendingSend pending;
    pending.buffer = t.detach().contiguous();
    pending.what = absl::StrCat(action.ToString(), ": sending the ", what, " to rank ", peer);
    ASSIGN_OR_RETURN(pending.work, transport_->Send(pending.buffer.data_ptr(),
                                                    pending.buffer.nbytes(), peer, tag));
    st.sends.push_back(std::move(pending));
    return absl::OkStatus();
  };

  switch (action.type) {
    case ActionType::kRecvF:
      if (s == 0 || Local(s - 1)) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": stage ", s, " receives no activation from another rank"));
      }
      return post_recv(st.activation_recvs, input_meta_[s][mb], RankOf(s - 1),
                       Tag(Payload::kActivation, s - 1, mb));

    case ActionType::kRecvB:
      if (s == last || Local(s + 1)) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": stage ", s, " receives no gradient from another rank"));
      }
      return post_recv(st.gradient_recvs, output_meta_[s][mb], RankOf(s + 1),
                       Tag(Payload::kGradient, s, mb));

    case ActionType::kForward: {
      torch::Tensor x;
      if (s == 0) {
        x = (*st.inputs)[mb];
        if (!(MetaOf(x) == input_meta_[0][mb])) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": input microbatch is ", MetaOf(x).ToString(), " but ",
                           input_meta_[0][mb].ToString(), " was agreed at set-up"));
        }
      } else if (Local(s - 1)) {
        auto it = st.handed_inputs.find(key);
        if (it == st.handed_inputs.end()) {
          return absl::FailedPreconditionError(absl::StrCat(
              where, ": stage ", s - 1, " has not run forward on microbatch ", mb, " yet"));
        }
        x = std::move(it->second);
        st.handed_inputs.erase(it);
      } else {
        ASSIGN_OR_RETURN(x, wait_recv(st.activation_recvs, "activation"));
      }
      if (st.stage_inputs.count(key) > 0) {
        return absl::FailedPreconditionError(absl::StrCat(where, ": forward ran twice"));
      }
      return GuardTorch(where, [&]() -> absl::Status {
        if (s > 0) x.requires_grad_(true);
        torch::Tensor y = model->Forward(x);
        st.stage_inputs[key] = x;
        if (s == last) {
          torch::Tensor loss = ComputeLoss(options_.loss, y, (*st.targets)[mb]);
          st.result.microbatch_losses[mb] = loss.item<double>();
          st.losses[key] = loss;
        } else {
          st.stage_outputs[key] = y;
          if (Local(s + 1)) st.handed_inputs[Key{s + 1, mb}] = y.detach();
        }
        return absl::OkStatus();
      });
    }

    case ActionType::kSendF: {
      if (s == last || Local(s + 1)) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": stage ", s + 1, " is not on another rank"));
      }
      auto it = st.stage_outputs.find(key);
      if (it == st.stage_outputs.end()) {
        return absl::FailedPreconditionError(absl::StrCat(where, ": no forward output of stage ", s,
                                                          " microbatch ", mb, " to send"));
      }
      return send(it->second, output_meta_[s][mb], RankOf(s + 1), Tag(Payload::kActivation, s, mb),
                  absl::StrCat("activation of stage ", s, " microbatch ", mb));
    }

    case ActionType::kFullBackward: {
      auto in = st.stage_inputs.find(key);
      if (in == st.stage_inputs.end()) {
        return absl::FailedPreconditionError(
            absl::StrCat(where, ": backward before forward of stage ", s, " microbatch ", mb));
      }
      torch::Tensor grad;
      if (s != last) {
        if (Local(s + 1)) {
          auto it = st.handed_grads.find(key);
          if (it == st.handed_grads.end()) {
            return absl::FailedPreconditionError(absl::StrCat(
                where, ": stage ", s + 1, " has not run backward on microbatch ", mb, " yet"));
          }
          grad = std::move(it->second);
          st.handed_grads.erase(it);
        } else {
          ASSIGN_OR_RETURN(grad, wait_recv(st.gradient_recvs, "output gradient"));
        }
      }
      RETURN_IF_ERROR(GuardTorch(where, [&]() -> absl::Status {
        if (s == last) {
          st.losses.at(key).backward();
        } else {
          torch::autograd::backward({st.stage_outputs.at(key)}, {grad});
        }
        return absl::OkStatus();
      }));
      if (s > 0) {
        torch::Tensor input_grad = in->second.grad();
        if (!input_grad.defined()) input_grad = torch::zeros_like(in->second);
        if (Local(s - 1)) {
          st.handed_grads[Key{s - 1, mb}] = input_grad;
        } else {
          st.input_grads[key] = input_grad;
        }
      }
      st.stage_inputs.erase(in);
      st.stage_outputs.erase(key);
      st.losses.erase(key);
      return absl::OkStatus();
    }

    case ActionType::kSendB: {
      if (s == 0 || Local(s - 1)) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": stage ", s - 1, " is not on another rank"));
      }
      auto it = st.input_grads.find(key);
      if (it == st.input_grads.end()) {
        return absl::FailedPreconditionError(absl::StrCat(where, ": no input gradient of stage ", s,
                                                          " microbatch ", mb, " to send"));
      }
      absl::Status sent =
          send(it->second, input_meta_[s][mb], RankOf(s - 1), Tag(Payload::kGradient, s - 1, mb),
               absl::StrCat("input gradient of stage ", s, " microbatch ", mb));
      st.input_grads.erase(it);
      return sent;
    }

    case ActionType::kReduceGrad:
      if (!options_.scale_grads || options_.num_microbatches == 1) return absl::OkStatus();
      return GuardTorch(where, [&]() -> absl::Status {
        torch::NoGradGuard no_grad;
        for (torch::Tensor& p : model->Parameters()) {
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
                                                   " is not supported by this worker yet"));
  }
}

}  // namespace stagecoach::runtime
