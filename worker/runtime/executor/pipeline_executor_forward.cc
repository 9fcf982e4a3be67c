// PipelineExecutor: F (a stage's forward on a microbatch) and the sends of its outputs.
#include <torch/torch.h>

#include <mutex>
#include <stdexcept>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"
#include "worker/runtime/executor/pipeline_executor.h"
#include "worker/runtime/executor/pipeline_executor_state.h"
#include "worker/runtime/executor/shape_header.h"
#include "worker/runtime/executor/side_effect_guard.h"

namespace stagecoach::runtime {

using executor_internal::EdgeKey;
using executor_internal::GuardTorch;
using executor_internal::Key;
using executor_internal::MetaOf;

torch::Tensor PipelineExecutor::SegmentsOf(int mb, const StepState& st) const {
  return st.segments != nullptr ? (*st.segments)[mb] : torch::Tensor();
}

namespace {

// Sets a stage's segments for the forwards in its scope and clears them after, however the
// forward ends.
class SegmentsScope {
 public:
  SegmentsScope(model::StageModel& stage, int s, const torch::Tensor& segments) : stage_(stage) {
    if (!stage_.SetSegments(segments)) {
      throw std::invalid_argument(
          absl::StrCat("stage ", s,
                       " cannot keep a packed row's documents apart (data.packing: pack needs a "
                       "built-in gpt or llama)"));
    }
  }
  ~SegmentsScope() { stage_.SetSegments(torch::Tensor()); }
  SegmentsScope(const SegmentsScope&) = delete;
  SegmentsScope& operator=(const SegmentsScope&) = delete;

 private:
  model::StageModel& stage_;
};

}  // namespace

std::vector<torch::Tensor> PipelineExecutor::RunStage(int s, const std::vector<torch::Tensor>& xs,
                                                      const torch::Tensor& segments) {
  std::vector<torch::Tensor> ys;
  {
    model::AutocastGuard autocast(options_.precision, options_.device);
    SegmentsScope scope(*stages_.at(s), s, segments);
    ys = stages_.at(s)->ForwardValues(xs);
  }
  for (torch::Tensor& y : ys) {
    y = s == options_.num_stages - 1 ? model::ToFloat32(y) : model::ToWire(y, options_.precision);
  }
  return ys;
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
      if (options_.dynamic_shapes) {
        RETURN_IF_ERROR(FitsPlanned(MetaOf(x), meta, absl::StrCat(where, ": input microbatch")));
      } else if (!(MetaOf(x) == meta)) {
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
    std::vector<torch::Tensor> ys;
    {
      // Recomputation records no graph here: B runs the forward again with it, from the random
      // state this forward started in (a dropout draws the same mask).
      torch::AutoGradMode grad_mode(!options_.forward_only && !options_.recompute);
      if (options_.recompute && !options_.forward_only) {
        st.rng_states[key] = RngState(options_.device);
      }
      ys = RunStage(s, xs, SegmentsOf(mb, st));
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
        torch::Tensor loss = LastStageLoss(ys[0], mb, st);
        st.result.microbatch_losses[mb] = loss.item<double>();
        st.last_stage_forwards.insert(mb);
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

absl::Status PipelineExecutor::Recompute(int s, int mb, const std::string& where, StepState& st) {
  const Key key{s, mb};
  auto in = st.stage_inputs.find(key);
  if (in == st.stage_inputs.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat(where, ": backward before forward of stage ", s, " microbatch ", mb));
  }
  return GuardTorch(where, [&]() -> absl::Status {
    torch::AutoGradMode grad_mode(true);
    std::vector<torch::Tensor> ys;
    {
      // The forward's random state for the recomputation; afterwards the generator's own again,
      // and the stage's buffers as the forward left them (a BatchNorm updates its running
      // statistics once per microbatch, not again when recomputed).
      SideEffectGuard once(*stages_.at(s), options_.device);
      auto saved = st.rng_states.find(key);
      if (saved != st.rng_states.end()) {
        SetRngState(options_.device, saved->second);
        st.rng_states.erase(saved);
      }
      ys = RunStage(s, in->second, SegmentsOf(mb, st));
    }
    if (s == options_.num_stages - 1) {
      st.losses[key] = LastStageLoss(ys[0], mb, st);
    } else {
      st.stage_outputs[key] = std::move(ys);
    }
    return absl::OkStatus();
  });
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
    const int ei = static_cast<int>(e);
    const torch::Tensor& value = it->second[edge.output];
    const std::string what = absl::StrCat(EdgeName(false, ei), " microbatch ", mb);
    if (FramesValues()) {
      RETURN_IF_ERROR(PostFramedValue(ei, mb, value, what, where, st));
      continue;
    }
    if (options_.dynamic_shapes) RETURN_IF_ERROR(PostShapeHeader(ei, mb, value, what, where, st));
    RETURN_IF_ERROR(PostSend(value, StepEdgeMeta(ei, mb, st), RankOf(edge.consumer),
                             EdgeTag(false, ei, mb), what, where, st));
    if (!options_.forward_only && EdgeMeta(ei, mb).requires_grad) {
      st.activation_sends[EdgeKey{static_cast<int>(e), mb}] = std::move(st.sends.back());
      st.sends.pop_back();
    }
  }
  // Forward-only steps keep no graph; training steps keep the outputs for the backward, unless
  // it recomputes them (the send holds the bytes until it is done).
  if (options_.forward_only || options_.recompute) st.stage_outputs.erase(it);
  return absl::OkStatus();
}

}  // namespace stagecoach::runtime
