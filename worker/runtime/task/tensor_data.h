// Conversion between the API's torch-free tensor (v1::TensorData: dtype name, shape,
// little-endian row-major bytes) and torch::Tensor.
#pragma once

#include <torch/types.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "stagecoach/v1/types.pb.h"

namespace stagecoach::runtime {

// A CPU tensor holding a copy of `data`. INVALID_ARGUMENT starting with `field` when `data` is
// malformed (rpc::ValidateTensorData).
absl::StatusOr<torch::Tensor> FromTensorData(const v1::TensorData& data, absl::string_view field);

// A copy of `tensor` (any device; made contiguous). INVALID_ARGUMENT for a dtype other than
// float32, float64, int64 and int32.
absl::StatusOr<v1::TensorData> ToTensorData(const torch::Tensor& tensor);

}  // namespace stagecoach::runtime
