#include "worker/runtime/training/replica_buffers.h"

#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace stagecoach::runtime {
namespace {

// The type a buffer travels as.
absl::StatusOr<torch::ScalarType> WireType(const torch::Tensor& buffer) {
  const torch::ScalarType type = buffer.scalar_type();
  if (type == torch::kFloat32 || type == torch::kFloat64) return type;
  if (at::isComplexType(type)) {
    return absl::InvalidArgumentError(absl::StrCat("a ", c10::toString(type),
                                                   " buffer cannot be broadcast"));
  }
  return at::isFloatingType(type) ? torch::kFloat32 : torch::kFloat64;
}

}  // namespace

absl::Status BroadcastReplicaBuffers(collectives::Collectives& group,
                                     const std::map<int, model::StageModel*>& stages,
                                     absl::Duration timeout) {
  for (const auto& [s, stage] : stages) {
    for (auto& [name, buffer] : stage->NamedBuffers()) {
      if (!buffer.defined() || buffer.numel() == 0) continue;
      const std::string where = absl::StrCat("stage ", s, " buffer '", name, "'");
      absl::StatusOr<torch::ScalarType> type = WireType(buffer);
      if (!type.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": ", type.status().message()));
      }
      torch::NoGradGuard no_grad;
      const torch::Device device =
          group.takes_device_memory() ? buffer.device() : torch::Device(torch::kCPU);
      torch::Tensor wire = buffer.to(device, *type).contiguous();
      const collectives::DataType dtype = *type == torch::kFloat32
                                              ? collectives::DataType::kFloat32
                                              : collectives::DataType::kFloat64;
      absl::Status sent = group.Broadcast(wire.data_ptr(), wire.numel(), dtype, /*root=*/0, timeout);
      if (!sent.ok()) {
        return absl::Status(sent.code(), absl::StrCat("broadcasting ", where,
                                                      " from replica 0: ", sent.message()));
      }
      if (!wire.is_same(buffer)) buffer.copy_(wire);
    }
  }
  return absl::OkStatus();
}

}  // namespace stagecoach::runtime
