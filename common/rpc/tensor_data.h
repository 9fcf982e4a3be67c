// Checks on v1::TensorData, the torch-free tensor of the API (a dtype name, a shape and
// little-endian row-major bytes). Used by the coordinator and stagectl, which have no LibTorch;
// the worker converts to and from torch::Tensor in worker/runtime/task/tensor_data.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "stagecoach/v1/types.pb.h"

namespace stagecoach::rpc {

// Bytes per element of a TensorData dtype: float32 4, float64 8, int64 8, int32 4; 0 for any
// other name.
int64_t DTypeSize(absl::string_view dtype);

// OK when `tensor` is well formed: a known dtype, no negative dimension, and exactly
// product(shape) * element size bytes of data (a tensor without dimensions is a scalar, one
// element). INVALID_ARGUMENT starting with `field` otherwise.
absl::Status ValidateTensorData(const v1::TensorData& tensor, absl::string_view field);

// "float32[10, 16]", for messages.
std::string DescribeTensorData(const v1::TensorData& tensor);

// The rows replica `replica` of `replicas` takes from a batch of `rows` rows that tensor_split
// cuts into replicas x microbatches microbatches (sizes differ by at most one, larger first),
// replica r taking microbatches [r * microbatches, (r + 1) * microbatches).
int64_t ReplicaRows(int64_t rows, int microbatches, int replicas, int replica);

// `parts` (well-formed, at least one) concatenated along dim 0, in order. INVALID_ARGUMENT
// starting with `field` when their dtypes or trailing dimensions differ or one is a scalar.
absl::StatusOr<v1::TensorData> ConcatRows(const std::vector<v1::TensorData>& parts,
                                          absl::string_view field);

}  // namespace stagecoach::rpc
