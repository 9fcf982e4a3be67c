// factory.h for builds without CUDA or NCCL (STAGECOACH_HAVE_NCCL=0).
#include "absl/status/status.h"
#include "worker/transport/nccl/factory.h"

namespace stagecoach::transport {

absl::StatusOr<std::unique_ptr<Transport>> CreateNcclTransport(const NcclOptions& /*options*/,
                                                               RendezvousStore* /*store*/) {
  return absl::UnimplementedError("built without NCCL");
}

bool NcclBuilt() { return false; }

int CudaDeviceCount() { return 0; }

bool NcclAvailable() { return false; }

}  // namespace stagecoach::transport
