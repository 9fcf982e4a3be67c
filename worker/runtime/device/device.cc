#include "worker/runtime/device/device.h"

#include <torch/cuda.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace stagecoach::runtime {

absl::StatusOr<std::string> CheckDevice(const std::string& name, const std::string& field) {
  if (name == "cpu") return name;
  int index = 0;
  if (name != "cuda" && !(absl::StartsWith(name, "cuda:") &&
                          absl::SimpleAtoi(name.substr(5), &index) && index >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": '", name, "' is not a device (cpu, cuda or cuda:N)"));
  }
  if (!torch::cuda::is_available()) {
    return absl::FailedPreconditionError(
        absl::StrCat(field, ": '", name, "', but this process sees no CUDA device (LibTorch built ",
                     "without CUDA, no driver, or no GPU)"));
  }
  const int64_t count = static_cast<int64_t>(torch::cuda::device_count());
  if (index >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat(field, ": '", name, "', but only ", count, " CUDA device(s) are visible"));
  }
  return absl::StrCat("cuda:", index);
}

int CudaIndex(const std::string& canonical) {
  int index = -1;
  if (absl::StartsWith(canonical, "cuda:")) (void)absl::SimpleAtoi(canonical.substr(5), &index);
  return index;
}

}  // namespace stagecoach::runtime
