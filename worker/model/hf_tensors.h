// Parameters to and from safetensors files (common/safetensors): a stored tensor becomes a
// LibTorch tensor of the job's dtype, copied out of the file's mapping (a worker holds only the
// tensors it reads), and a LibTorch tensor becomes the bytes a writer stores. Floating-point
// dtypes only (F32, F16, BF16, F64): what parameters are stored in. Thread-safe.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <torch/types.h>

#include "absl/status/statusor.h"
#include "common/safetensors/model_dir.h"

namespace stagecoach::model {

// The LibTorch dtype of a stored floating-point dtype; nullopt for the others.
std::optional<torch::ScalarType> TorchDtype(safetensors::Dtype dtype);

// The tensor `name` of `dir`, which must have `shape`, as a CPU tensor of `dtype` (converted
// from its stored dtype as Tensor::to does). Errors name the directory and the tensor:
// NOT_FOUND when it is missing, INVALID_ARGUMENT for another shape or a dtype that is not
// floating-point.
absl::StatusOr<torch::Tensor> ReadParameter(const safetensors::ModelDir& dir,
                                            const std::string& name,
                                            const std::vector<int64_t>& shape,
                                            torch::ScalarType dtype);

// `tensor` as a writer stores it under `name`: its bytes on the CPU, contiguous, in its own
// dtype (which must be F32, F16, BF16 or F64). `*holder` keeps those bytes alive while the
// result is used. INVALID_ARGUMENT naming `name` for another dtype.
absl::StatusOr<safetensors::TensorToWrite> ParameterToWrite(const std::string& name,
                                                            const torch::Tensor& tensor,
                                                            torch::Tensor* holder);

}  // namespace stagecoach::model
