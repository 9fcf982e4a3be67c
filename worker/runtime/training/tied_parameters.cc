#include "worker/runtime/training/tied_parameters.h"

#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/spec/builtin_model.h"
#include "common/util/status_macros.h"
#include "worker/runtime/checkpoint/checkpoint.h"
#include "worker/runtime/executor/message_tags.h"

namespace stagecoach::runtime {
namespace {

// The named parameter `name` of `stage`; undefined when it has none.
torch::Tensor ParameterOf(model::StageModel& stage, const std::string& name) {
  for (auto& [n, p] : stage.NamedParameters()) {
    if (n == name) return p;
  }
  return torch::Tensor();
}

torch::Tensor GradOrZeros(const torch::Tensor& p) {
  return p.grad().defined() ? p.grad() : torch::zeros_like(p);
}

}  // namespace

std::optional<TiedPair> TiedPairOf(const spec::JobSpec& spec, int num_stages) {
  const auto& builtin = spec.model.builtin;
  if (!builtin.has_value() || !spec::IsDecoder(*builtin) || !builtin->tie_embeddings ||
      num_stages < 2) {
    return std::nullopt;
  }
  return TiedPair{0, spec::TiedEmbeddingName(*builtin), num_stages - 1, "head.weight"};
}

absl::Status RestoreTiedCopy(const TiedPair& pair, const v1::ResumeTask& resume,
                             const StateFiles& files, int stage,
                             const std::pair<std::string, torch::Tensor>& copy,
                             torch::optim::Optimizer* optimizer) {
  if (stage != pair.second_stage) return absl::OkStatus();
  ASSIGN_OR_RETURN(const v1::StageCheckpointFile file,
                   FindStageStateFile(resume, pair.first_stage));
  return RestoreParameterCopy(files, file, pair.first_stage, pair.first_name, copy, optimizer);
}

absl::StatusOr<std::unique_ptr<TiedGradients>> TiedGradients::Create(
    const TiedPair& pair, const std::vector<int>& stage_to_rank, int rank,
    const std::map<int, model::StageModel*>& stages, transport::Transport* transport,
    torch::Device device, absl::Duration timeout) {
  std::unique_ptr<TiedGradients> tied(new TiedGradients());
  tied->pair_ = pair;
  tied->rank_ = rank;
  tied->transport_ = transport;
  tied->device_ = device;
  tied->timeout_ = timeout;
  const int first_rank = stage_to_rank.at(pair.first_stage);
  const int second_rank = stage_to_rank.at(pair.second_stage);
  if (first_rank != rank && second_rank != rank) return std::unique_ptr<TiedGradients>();
  auto find = [&](int stage, const std::string& name) -> absl::StatusOr<torch::Tensor> {
    torch::Tensor p = ParameterOf(*stages.at(stage), name);
    if (!p.defined()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.builtin.tie_embeddings: stage ", stage, " has no ", name));
    }
    return p;
  };
  if (first_rank == rank) {
    ASSIGN_OR_RETURN(tied->first_, find(pair.first_stage, pair.first_name));
  }
  if (second_rank == rank) {
    ASSIGN_OR_RETURN(tied->second_, find(pair.second_stage, pair.second_name));
  }
  if (tied->first_.defined() && tied->second_.defined() &&
      tied->first_.sizes() != tied->second_.sizes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.builtin.tie_embeddings: ", pair.first_name, " is [",
                     absl::StrJoin(tied->first_.sizes(), ", "), "] but ", pair.second_name,
                     " is [", absl::StrJoin(tied->second_.sizes(), ", "), "]"));
  }
  if (first_rank != second_rank) tied->peer_ = first_rank == rank ? second_rank : first_rank;
  return tied;
}

std::map<int, std::string> TiedGradients::Omitted() const {
  if (!second_.defined()) return {};
  return {{pair_.second_stage, pair_.second_name}};
}

absl::Status TiedGradients::SumGradients() {
  torch::NoGradGuard no_grad;
  if (peer_ < 0) {
    // Both copies here.
    const torch::Tensor sum = GradOrZeros(first_) + GradOrZeros(second_);
    first_.mutable_grad() = sum;
    second_.mutable_grad() = sum.clone();
    return absl::OkStatus();
  }
  const torch::Tensor& mine = first_.defined() ? first_ : second_;
  const bool on_device = transport_->capabilities().takes_device_memory;
  const torch::Device where = on_device ? device_ : torch::Device(torch::kCPU);
  const torch::Tensor out = GradOrZeros(mine).to(where).contiguous();
  torch::Tensor in = torch::empty_like(out);
  const uint64_t tag = MessageTag(Payload::kTiedGradients, 0, 0);
  auto send = [&]() -> absl::Status {
    auto work = transport_->Send(out.data_ptr(), out.nbytes(), peer_, tag);
    if (!work.ok()) return work.status();
    return (*work)->Wait(timeout_);
  };
  auto recv = [&]() -> absl::Status {
    auto work = transport_->Recv(in.data_ptr(), in.nbytes(), peer_, tag);
    if (!work.ok()) return work.status();
    return (*work)->Wait(timeout_);
  };
  absl::Status status = rank_ < peer_ ? send() : recv();
  if (status.ok()) status = rank_ < peer_ ? recv() : send();
  if (!status.ok()) {
    return absl::Status(status.code(), absl::StrCat("tied embeddings with rank ", peer_, ": ",
                                                    status.message()));
  }
  // The first copy's gradient plus the second's, on both ranks.
  const torch::Tensor theirs = in.to(mine.device());
  const torch::Tensor own = GradOrZeros(mine);
  mine.mutable_grad() = first_.defined() ? own + theirs : theirs + own;
  return absl::OkStatus();
}

}  // namespace stagecoach::runtime
