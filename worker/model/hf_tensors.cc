#include "worker/model/hf_tensors.h"

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace stagecoach::model {

std::optional<torch::ScalarType> TorchDtype(safetensors::Dtype dtype) {
  switch (dtype) {
    case safetensors::Dtype::kF32:
      return torch::kFloat32;
    case safetensors::Dtype::kF16:
      return torch::kFloat16;
    case safetensors::Dtype::kBF16:
      return torch::kBFloat16;
    case safetensors::Dtype::kF64:
      return torch::kFloat64;
    default:
      return std::nullopt;
  }
}

absl::StatusOr<torch::Tensor> ReadParameter(const safetensors::ModelDir& dir,
                                            const std::string& name,
                                            const std::vector<int64_t>& shape,
                                            torch::ScalarType dtype) {
  const safetensors::SafetensorsFile* file = nullptr;
  const safetensors::TensorInfo* info = dir.Find(name, &file);
  if (info == nullptr) {
    return absl::NotFoundError(absl::StrCat(dir.dir(), ": no tensor '", name, "'"));
  }
  if (info->shape != shape) {
    return absl::InvalidArgumentError(absl::StrCat(
        file->path(), ": tensor '", name, "' has shape [", absl::StrJoin(info->shape, ", "),
        "], the model expects [", absl::StrJoin(shape, ", "), "]"));
  }
  const std::optional<torch::ScalarType> stored = TorchDtype(info->dtype);
  if (!stored) {
    return absl::InvalidArgumentError(
        absl::StrCat(file->path(), ": tensor '", name, "' is ",
                     safetensors::DtypeName(info->dtype),
                     ", not a floating-point dtype a parameter is stored in (F32, F16, BF16, "
                     "F64)"));
  }
  // Copied out of the mapping (whose offsets need not be aligned), then converted.
  torch::Tensor out = torch::empty(shape, torch::TensorOptions().dtype(*stored));
  const absl::string_view bytes = file->Data(*info);
  if (!bytes.empty()) std::memcpy(out.data_ptr(), bytes.data(), bytes.size());
  return out.to(dtype);
}

absl::StatusOr<safetensors::TensorToWrite> ParameterToWrite(const std::string& name,
                                                            const torch::Tensor& tensor,
                                                            torch::Tensor* holder) {
  safetensors::TensorToWrite out;
  out.name = name;
  switch (tensor.scalar_type()) {
    case torch::kFloat32:
      out.dtype = safetensors::Dtype::kF32;
      break;
    case torch::kFloat16:
      out.dtype = safetensors::Dtype::kF16;
      break;
    case torch::kBFloat16:
      out.dtype = safetensors::Dtype::kBF16;
      break;
    case torch::kFloat64:
      out.dtype = safetensors::Dtype::kF64;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter '", name, "' is ", std::string(c10::toString(tensor.scalar_type())),
          ": only float32, float16, bfloat16 and float64 are written"));
  }
  *holder = tensor.detach().to(torch::kCPU).contiguous();
  out.shape.assign(holder->sizes().begin(), holder->sizes().end());
  out.data = absl::string_view(static_cast<const char*>(holder->data_ptr()), holder->nbytes());
  return out;
}

}  // namespace stagecoach::model
