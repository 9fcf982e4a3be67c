// PipelineExecutor: posting sends and receives on the transport, and waiting for receives.
#include <torch/torch.h>

#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"
#include "worker/runtime/executor/pipeline_executor.h"
#include "worker/runtime/executor/pipeline_executor_state.h"
#include "worker/runtime/executor/shape_header.h"

namespace stagecoach::runtime {

using executor_internal::EdgeKey;
using executor_internal::MetaOf;
using executor_internal::PendingRecv;
using executor_internal::PendingSend;

absl::Status PipelineExecutor::PostRecv(bool gradient, int e, int mb, const std::string& where,
                                        StepState& st) {
  std::map<EdgeKey, PendingRecv>& recvs = gradient ? st.gradient_recvs : st.activation_recvs;
  const EdgeKey key{e, mb};
  if (recvs.count(key) > 0) {
    return absl::FailedPreconditionError(absl::StrCat(where, ": the receive of the ",
                                                      EdgeName(gradient, e), " microbatch ", mb,
                                                      " was posted twice"));
  }
  PendingRecv recv;
  recv.peer = RankOf(gradient ? edges_[e].consumer : edges_[e].producer);
  if (options_.dynamic_shapes && !gradient) {
    if (FramesValues()) {
      // One receive of at most the header and the planned (largest) value: the value travels
      // as soon as it is sent.
      const TensorMeta& planned = EdgeMeta(e, mb);
      int64_t planned_bytes = static_cast<int64_t>(c10::elementSize(planned.dtype));
      for (int64_t d : planned.shape) planned_bytes *= d;
      recv.framed = true;
      recv.buffer = torch::empty({kShapeHeaderBytes + planned_bytes},
                                 torch::TensorOptions(torch::kUInt8).device(TransferDevice()));
      ASSIGN_OR_RETURN(recv.work, transport_->RecvUpTo(recv.buffer.data_ptr(), recv.buffer.nbytes(),
                                                       recv.peer, EdgeTag(false, e, mb)));
    } else {
      // The value's shape comes first; its buffer is allocated when the header is in.
      recv.header = torch::empty({kShapeHeaderWords},
                                 torch::TensorOptions(torch::kInt64).device(TransferDevice()));
      ASSIGN_OR_RETURN(
          recv.header_work,
          transport_->Recv(recv.header.data_ptr(), recv.header.nbytes(), recv.peer,
                           ShapeHeaderTag(edges_[e].producer, edges_[e].consumer, mb)));
    }
    recvs.emplace(key, std::move(recv));
    return absl::OkStatus();
  }
  // A gradient has the shape of the activation this rank sent for it.
  const TensorMeta& meta = gradient ? StepEdgeMeta(e, mb, st) : EdgeMeta(e, mb);
  recv.buffer = torch::empty(meta.shape, torch::TensorOptions(meta.dtype).device(TransferDevice()));
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
  if (it->second.header_work != nullptr) RETURN_IF_ERROR(ReceiveAfterHeader(e, mb, where, st));
  const absl::Time before = absl::Now();
  if (options_.progress != nullptr) {
    options_.progress->BeginWait(gradient ? "RECV_B" : "RECV_F",
                                 gradient ? edge.producer : edge.consumer, mb, it->second.peer,
                                 EdgeTag(gradient, e, mb));
  }
  absl::Status waited = it->second.work->Wait(options_.comm_timeout);
  if (options_.progress != nullptr) options_.progress->EndWait();
  st.action_wait += absl::Now() - before;
  if (!waited.ok()) {
    return absl::Status(
        waited.code(),
        absl::StrCat(where, ": waiting for the ", EdgeName(gradient, e), " microbatch ", mb,
                     " from rank ", it->second.peer, ": ", waited.message()));
  }
  torch::Tensor t = std::move(it->second.buffer);
  if (it->second.framed) {
    absl::StatusOr<UnframedValue> unframed = UnframeValue(t);
    RETURN_IF_ERROR(AcceptReceivedMeta(
        e, mb, where, it->second.peer,
        unframed.ok() ? absl::StatusOr<TensorMeta>(unframed->meta) : unframed.status(), st));
    t = std::move(unframed->value);
  }
  st.result.bytes_received_from[it->second.peer] += static_cast<int64_t>(t.nbytes());
  recvs.erase(it);
  if (t.device() != options_.device) t = t.to(options_.device);
  return t;
}

absl::Status PipelineExecutor::ReceiveAfterHeader(int e, int mb, const std::string& where,
                                                  StepState& st) {
  PendingRecv& recv = st.activation_recvs.at(EdgeKey{e, mb});
  const std::string what = absl::StrCat(EdgeName(false, e), " microbatch ", mb);
  const absl::Time before = absl::Now();
  if (options_.progress != nullptr) {
    options_.progress->BeginWait("RECV_F header", edges_[e].consumer, mb, recv.peer,
                                 ShapeHeaderTag(edges_[e].producer, edges_[e].consumer, mb));
  }
  absl::Status waited = recv.header_work->Wait(options_.comm_timeout);
  if (options_.progress != nullptr) options_.progress->EndWait();
  st.action_wait += absl::Now() - before;
  if (!waited.ok()) {
    return absl::Status(waited.code(),
                        absl::StrCat(where, ": waiting for the shape header of the ", what,
                                     " from rank ", recv.peer, ": ", waited.message()));
  }
  recv.header_work.reset();
  RETURN_IF_ERROR(AcceptReceivedMeta(e, mb, where, recv.peer, DecodeShapeHeader(recv.header), st));
  const TensorMeta& meta = st.step_metas.at(EdgeKey{e, mb});
  recv.buffer = torch::empty(meta.shape, torch::TensorOptions(meta.dtype).device(TransferDevice()));
  ASSIGN_OR_RETURN(recv.work, transport_->Recv(recv.buffer.data_ptr(), recv.buffer.nbytes(),
                                               recv.peer, EdgeTag(false, e, mb)));
  return absl::OkStatus();
}

absl::Status PipelineExecutor::AcceptReceivedMeta(int e, int mb, const std::string& where, int peer,
                                                  absl::StatusOr<TensorMeta> meta, StepState& st) {
  const std::string what =
      absl::StrCat(where, ": the ", EdgeName(false, e), " microbatch ", mb, " from rank ", peer);
  if (!meta.ok()) {
    return absl::Status(meta.status().code(), absl::StrCat(what, ": ", meta.status().message()));
  }
  const TensorMeta& agreed = EdgeMeta(e, mb);
  RETURN_IF_ERROR(FitsPlanned(*meta, agreed, what));
  meta->requires_grad = agreed.requires_grad;
  st.step_metas[EdgeKey{e, mb}] = *std::move(meta);
  return absl::OkStatus();
}

absl::StatusOr<TensorMeta> PipelineExecutor::SentMeta(int e, int mb, const torch::Tensor& t,
                                                      const std::string& what,
                                                      const std::string& where, StepState& st) {
  const TensorMeta& agreed = EdgeMeta(e, mb);
  TensorMeta meta = MetaOf(t);
  RETURN_IF_ERROR(FitsPlanned(meta, agreed, absl::StrCat(where, ": the ", what)));
  meta.requires_grad = agreed.requires_grad;
  st.step_metas[EdgeKey{e, mb}] = meta;
  return meta;
}

absl::Status PipelineExecutor::PostShapeHeader(int e, int mb, const torch::Tensor& t,
                                               const std::string& what, const std::string& where,
                                               StepState& st) {
  ASSIGN_OR_RETURN(const TensorMeta meta, SentMeta(e, mb, t, what, where, st));
  PendingSend header;
  ASSIGN_OR_RETURN(header.buffer, EncodeShapeHeader(meta));
  if (TransportTakesDeviceMemory()) header.buffer = header.buffer.to(TransferDevice());
  const int peer = RankOf(edges_[e].consumer);
  header.what = absl::StrCat(where, ": sending the shape header of the ", what, " to rank ", peer);
  header.peer = peer;
  header.tag = ShapeHeaderTag(edges_[e].producer, edges_[e].consumer, mb);
  ASSIGN_OR_RETURN(header.work,
                   transport_->Send(header.buffer.data_ptr(), header.buffer.nbytes(), peer,
                                    ShapeHeaderTag(edges_[e].producer, edges_[e].consumer, mb)));
  st.sends.push_back(std::move(header));
  return absl::OkStatus();
}

absl::Status PipelineExecutor::PostFramedValue(int e, int mb, const torch::Tensor& t,
                                               const std::string& what, const std::string& where,
                                               StepState& st) {
  ASSIGN_OR_RETURN(const TensorMeta meta, SentMeta(e, mb, t, what, where, st));
  const int peer = RankOf(edges_[e].consumer);
  PendingSend framed;
  ASSIGN_OR_RETURN(framed.buffer, FrameWithHeader(t.detach().to(TransferDevice()), meta));
  framed.what = absl::StrCat(where, ": sending the ", what, " to rank ", peer);
  framed.peer = peer;
  framed.tag = EdgeTag(false, e, mb);
  ASSIGN_OR_RETURN(framed.work, transport_->Send(framed.buffer.data_ptr(), framed.buffer.nbytes(),
                                                 peer, EdgeTag(false, e, mb)));
  st.result.bytes_sent_to[peer] += static_cast<int64_t>(framed.buffer.nbytes()) - kShapeHeaderBytes;
  // A copy: released once written (ReleaseFinishedSends), not held until its gradient is back.
  st.sends.push_back(std::move(framed));
  return absl::OkStatus();
}

bool PipelineExecutor::FramesValues() const {
  return options_.dynamic_shapes && transport_->capabilities().shorter_receives;
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
  pending.peer = peer;
  pending.tag = tag;
  ASSIGN_OR_RETURN(pending.work,
                   transport_->Send(pending.buffer.data_ptr(), pending.buffer.nbytes(), peer, tag));
  st.result.bytes_sent_to[peer] += static_cast<int64_t>(pending.buffer.nbytes());
  st.sends.push_back(std::move(pending));
  return absl::OkStatus();
}

namespace {

// The error of a send that failed: "rank r: <what>: <why>".
absl::Status SendFailed(int rank, const PendingSend& send, const absl::Status& status) {
  return absl::Status(status.code(),
                      absl::StrCat("rank ", rank, ": ", send.what, ": ", status.message()));
}

}  // namespace

absl::Status PipelineExecutor::ReleaseActivationSend(int e, int mb, StepState& st) {
  auto it = st.activation_sends.find(EdgeKey{e, mb});
  if (it == st.activation_sends.end()) return absl::OkStatus();
  // Its gradient came back, so the consumer received it: the wait returns at once.
  absl::Status sent = it->second.work->Wait(options_.comm_timeout);
  if (!sent.ok()) return SendFailed(options_.rank, it->second, sent);
  st.activation_sends.erase(it);
  return absl::OkStatus();
}

absl::Status PipelineExecutor::ReleaseFinishedSends(StepState& st) {
  size_t kept = 0;
  for (size_t i = 0; i < st.sends.size(); ++i) {
    PendingSend& send = st.sends[i];
    if (send.work->Done()) {
      const absl::Status sent = send.work->Wait(absl::ZeroDuration());
      if (!sent.ok()) return SendFailed(options_.rank, send, sent);
      continue;  // its buffer is freed below, with the entry
    }
    if (kept != i) st.sends[kept] = std::move(send);
    ++kept;
  }
  st.sends.resize(kept);
  return absl::OkStatus();
}

absl::Status PipelineExecutor::WaitSends(StepState& st) {
  if (options_.progress != nullptr) options_.progress->SetPhase(v1::RANK_PHASE_SENDS);
  auto wait = [&](PendingSend& send) {
    if (options_.progress != nullptr && !send.work->Done()) {
      options_.progress->BeginWait("SEND", -1, -1, send.peer, send.tag);
    }
    const absl::Status sent = send.work->Wait(options_.comm_timeout);
    if (options_.progress != nullptr) options_.progress->EndWait();
    return sent.ok() ? sent : SendFailed(options_.rank, send, sent);
  };
  for (PendingSend& send : st.sends) RETURN_IF_ERROR(wait(send));
  for (auto& [key, send] : st.activation_sends) RETURN_IF_ERROR(wait(send));
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

}  // namespace stagecoach::runtime
