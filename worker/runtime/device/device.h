// The compute device a worker runs its stages on (--device, placement.device). Torch-free
// header: the worker's main and service code include it.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace stagecoach::runtime {

// Checks a device name against what this process can use: "cpu", "cuda" (CUDA device 0) or
// "cuda:N". Returns the canonical name ("cpu", "cuda:0"); INVALID_ARGUMENT naming `field` for a
// malformed name, FAILED_PRECONDITION when LibTorch was built without CUDA or the device does
// not exist.
absl::StatusOr<std::string> CheckDevice(const std::string& name, const std::string& field);

// The CUDA device index of a canonical name from CheckDevice; -1 for "cpu".
int CudaIndex(const std::string& canonical);

}  // namespace stagecoach::runtime
