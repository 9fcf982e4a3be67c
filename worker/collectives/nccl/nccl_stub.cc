// nccl/factory.h for builds without CUDA or NCCL (STAGECOACH_HAVE_NCCL=0).
#include "absl/status/status.h"
#include "worker/collectives/nccl/factory.h"

namespace stagecoach::collectives {

absl::StatusOr<std::unique_ptr<Collectives>> CreateNcclCollectives(
    const NcclCollectivesOptions& /*options*/, transport::RendezvousStore* /*store*/) {
  return absl::UnimplementedError("built without NCCL");
}

}  // namespace stagecoach::collectives
