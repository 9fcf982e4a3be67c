#include "worker/runtime/training/job_reduction.h"

#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"
#include "worker/runtime/executor/message_tags.h"

namespace stagecoach::runtime {
namespace {

constexpr int kUp = 0;    // partial sums, rank r -> r+1
constexpr int kDown = 1;  // the sum, rank r+1 -> r

absl::Status Annotate(const absl::Status& status, absl::string_view what, int peer) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat("job reduction: ", what, " rank ", peer, ": ",
                                                  status.message()));
}

}  // namespace

absl::Status JobReduction::SendTo(const torch::Tensor& t, int peer, int edge, int direction) {
  const uint64_t tag = MessageTag(Payload::kJobReduction, edge, direction);
  auto work = transport_->Send(t.data_ptr(), t.nbytes(), peer, tag);
  if (!work.ok()) return Annotate(work.status(), "sending to", peer);
  if (progress_ != nullptr) progress_->BeginWait("JOB_REDUCTION send", -1, -1, peer, tag);
  const absl::Status sent = (*work)->Wait(timeout_);
  if (progress_ != nullptr) progress_->EndWait();
  return Annotate(sent, "sending to", peer);
}

absl::Status JobReduction::RecvFrom(torch::Tensor& t, int peer, int edge, int direction) {
  const uint64_t tag = MessageTag(Payload::kJobReduction, edge, direction);
  auto work = transport_->Recv(t.data_ptr(), t.nbytes(), peer, tag);
  if (!work.ok()) return Annotate(work.status(), "receiving from", peer);
  if (progress_ != nullptr) progress_->BeginWait("JOB_REDUCTION receive", -1, -1, peer, tag);
  const absl::Status received = (*work)->Wait(timeout_);
  if (progress_ != nullptr) progress_->EndWait();
  return Annotate(received, "receiving from", peer);
}

absl::StatusOr<std::vector<double>> JobReduction::SumOverRanks(const std::vector<double>& values) {
  const int rank = transport_->rank();
  const int ranks = transport_->world_size();
  if (ranks == 1 || values.empty()) return values;
  const bool on_device = transport_->capabilities().takes_device_memory;
  const auto options =
      torch::TensorOptions().dtype(torch::kFloat64).device(on_device ? device_ : torch::kCPU);
  const int64_t n = static_cast<int64_t>(values.size());
  torch::Tensor mine = torch::tensor(values, torch::kFloat64).to(options.device());
  torch::Tensor sum = mine;
  if (rank > 0) {
    torch::Tensor partial = torch::empty({n}, options);
    RETURN_IF_ERROR(RecvFrom(partial, rank - 1, rank - 1, kUp));
    sum = partial + mine;
  }
  if (rank + 1 < ranks) {
    RETURN_IF_ERROR(SendTo(sum, rank + 1, rank, kUp));
    sum = torch::empty({n}, options);
    RETURN_IF_ERROR(RecvFrom(sum, rank + 1, rank, kDown));
  }
  if (rank > 0) RETURN_IF_ERROR(SendTo(sum, rank - 1, rank - 1, kDown));
  const torch::Tensor host = sum.to(torch::kCPU).contiguous();
  const double* data = host.data_ptr<double>();
  return std::vector<double>(data, data + n);
}

}  // namespace stagecoach::runtime
