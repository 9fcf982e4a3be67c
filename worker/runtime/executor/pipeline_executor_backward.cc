// PipelineExecutor: B, I and W (a stage's backward on a microbatch, whole or split), the sends
// of its input gradients, and REDUCE_GRAD.
#include <torch/autograd.h>
#include <torch/torch.h>

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"
#include "worker/runtime/executor/fused_weight_grad.h"
#include "worker/runtime/executor/pipeline_executor.h"
#include "worker/runtime/executor/pipeline_executor_state.h"
#include "worker/runtime/executor/split_backward.h"

namespace stagecoach::runtime {

using executor_internal::EdgeKey;
using executor_internal::GuardTorch;
using executor_internal::Key;

absl::Status PipelineExecutor::OutputGradients(int s, int mb, const std::string& where,
                                               StepState& st, std::vector<torch::Tensor>& outputs,
                                               std::vector<torch::Tensor>& grads) {
  const Key key{s, mb};
  if (s == options_.num_stages - 1) {
    // The step loss is the mean of the microbatch losses: each microbatch's gradient is 1/m of
    // its loss's (scale_grads), seeded here rather than divided out of every gradient at
    // REDUCE_GRAD.
    // With tokens, the loss is already its share of the step's and the seed undoes the
    // replicas' averaging (TokenNormalization).
    const torch::Tensor& loss = st.losses.at(key);
    const bool mean = options_.scale_grads && options_.num_microbatches > 1;
    outputs.push_back(loss);
    if (st.tokens.has_value()) {
      grads.push_back(torch::full_like(loss, st.tokens->gradient_factor));
    } else {
      grads.push_back(mean ? torch::full_like(loss, 1.0 / options_.num_microbatches)
                           : torch::ones_like(loss));
    }
    return absl::OkStatus();
  }
  const std::vector<torch::Tensor>& ys = st.stage_outputs.at(key);
  for (size_t k = 0; k < ys.size(); ++k) {
    torch::Tensor grad;
    for (int e : edges_out_of_[s][k]) {
      if (!EdgeMeta(e, mb).requires_grad) continue;
      torch::Tensor g;
      if (Local(edges_[e].consumer)) {
        auto it = st.handed_grads.find(EdgeKey{e, mb});
        if (it == st.handed_grads.end()) {
          return absl::FailedPreconditionError(absl::StrCat(where, ": stage ", edges_[e].consumer,
                                                            " has not run backward on microbatch ",
                                                            mb, " yet"));
        }
        g = std::move(it->second);
        st.handed_grads.erase(it);
      } else {
        ASSIGN_OR_RETURN(g, WaitRecv(true, e, mb, where, st));
        RETURN_IF_ERROR(ReleaseActivationSend(e, mb, st));
      }
      grad = grad.defined() ? grad + g : g;
    }
    if (grad.defined() && ys[k].requires_grad()) {
      outputs.push_back(ys[k]);
      grads.push_back(std::move(grad));
    }
  }
  return absl::OkStatus();
}

absl::Status PipelineExecutor::Backward(int s, int mb, bool split, const std::string& where,
                                        StepState& st) {
  const Key key{s, mb};
  auto in = st.stage_inputs.find(key);
  if (in == st.stage_inputs.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat(where, ": backward before forward of stage ", s, " microbatch ", mb));
  }
  if (options_.recompute) RETURN_IF_ERROR(Recompute(s, mb, where, st));
  // The outputs to run backward from, and their gradients: the loss's own on the last stage,
  // else each output's gradients from its consumers, summed.
  std::vector<torch::Tensor> outputs;
  std::vector<torch::Tensor> grads;
  RETURN_IF_ERROR(OutputGradients(s, mb, where, st, outputs, grads));
  std::vector<torch::Tensor>& xs = in->second;
  std::vector<torch::Tensor> input_grads(xs.size());
  RETURN_IF_ERROR(GuardTorch(where, [&]() -> absl::Status {
    if (split) {
      PendingWeightGrad pending;
      input_grads = SplitBackward::BackwardInputs(outputs, grads, xs, &pending);
      st.pending_weights.emplace(key, std::move(pending));
      return absl::OkStatus();
    }
    if (options_.fuse_weight_grads) FuseWeightGradients(outputs);
    if (!outputs.empty()) torch::autograd::backward(outputs, grads);
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

absl::Status PipelineExecutor::BackwardWeight(int s, int mb, const std::string& where,
                                              StepState& st) {
  auto it = st.pending_weights.find(Key{s, mb});
  if (it == st.pending_weights.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat(where, ": W before the I of stage ", s, " microbatch ", mb));
  }
  PendingWeightGrad pending = std::move(it->second);
  st.pending_weights.erase(it);
  return GuardTorch(where, [&]() -> absl::Status {
    SplitBackward::BackwardWeight(std::move(pending), options_.fuse_weight_grads);
    return absl::OkStatus();
  });
}

absl::Status PipelineExecutor::ReduceGrad(int s) {
  // The gradients are already the mean over microbatches (OutputGradients seeds 1/m).
  if (options_.on_gradients_ready) options_.on_gradients_ready(s);
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
    RETURN_IF_ERROR(PostSend(
        it->second, StepEdgeMeta(e, mb, st), RankOf(edges_[e].producer), EdgeTag(true, e, mb),
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
