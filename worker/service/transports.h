// The worker's data-plane factory over the registry of backends (worker/transport/registry.h):
// which backends this worker offers, and the transport a task asks for. Torch-free.
#pragma once

#include <string>
#include <vector>

#include "worker/runtime/task/task_runner.h"
#include "worker/transport/registry.h"

namespace stagecoach::worker {

struct TransportConfig {
  // Address peers reach this worker's TCP connections (Gloo's) at.
  std::string data_host = "127.0.0.1";
  // CUDA device of the worker (runtime::CudaIndex of its --device), -1 on a CPU worker.
  int cuda_device = -1;
  // The backends to choose from; null means TransportRegistry::Global(). Must outlive the
  // factory made from this config.
  const transport::TransportRegistry* registry = nullptr;
};

// The transports a worker with `config` offers, for its registration: every registered backend
// whose factory is available in this process, those that need CUDA only on a CUDA device (with
// the built-in ones: "gloo", and "nccl" when NCCL was built, a CUDA device is visible and the
// worker runs on one).
std::vector<std::string> AvailableTransports(const TransportConfig& config);

// Creates the transport a task asks for. A backend whose transfers are ordered per link
// (capabilities().matches_tags false, e.g. NCCL) is given the links the rank uses
// (runtime::LinksOfRank). INVALID_ARGUMENT naming `transport` for one this worker does not
// offer.
runtime::TransportFactory MakeTransportFactory(TransportConfig config);

// Creates a task's data-parallel group for the backend it names: NCCL's own collectives for a
// backend that takes device memory (nccl/factory.h), else ring collectives
// (ring/factory.h) over a transport of that backend spanning the group. INVALID_ARGUMENT
// naming the backend for one this worker does not offer; the factories' errors.
runtime::CollectivesFactory MakeCollectivesFactory(TransportConfig config);

}  // namespace stagecoach::worker
