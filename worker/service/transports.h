// The worker's data-plane factory: Gloo always, NCCL where it was built and the worker runs on a
// GPU. Torch-free.
#pragma once

#include <string>
#include <vector>

#include "worker/runtime/task_runner.h"

namespace stagecoach::worker {

struct TransportConfig {
  // Address peers reach this worker's Gloo connections at.
  std::string data_host = "127.0.0.1";
  // CUDA device of the worker (runtime::CudaIndex of its --device), -1 on a CPU worker.
  int cuda_device = -1;
};

// The transports a worker with `config` offers, for its registration: "gloo", and "nccl" when
// NCCL was built, a CUDA device is visible and the worker runs on one.
std::vector<std::string> AvailableTransports(const TransportConfig& config);

// Creates the transport a task asks for. "nccl" gets one communicator per link the rank uses
// (runtime::LinksOfRank). INVALID_ARGUMENT naming `transport` for one this worker does not
// offer.
runtime::TransportFactory MakeTransportFactory(TransportConfig config);

}  // namespace stagecoach::worker
