#include "worker/runtime/task/tensor_data.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/rpc/tensor_data.h"
#include "common/util/status_macros.h"

namespace stagecoach::runtime {
namespace {

// TensorData bytes are little-endian; they are copied as they are.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "TensorData needs a little-endian host");

absl::StatusOr<torch::ScalarType> ScalarTypeOf(absl::string_view dtype) {
  if (dtype == "float32") return torch::kFloat32;
  if (dtype == "float64") return torch::kFloat64;
  if (dtype == "int64") return torch::kInt64;
  if (dtype == "int32") return torch::kInt32;
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype '", dtype, "'"));
}

}  // namespace

absl::StatusOr<torch::Tensor> FromTensorData(const v1::TensorData& data, absl::string_view field) {
  RETURN_IF_ERROR(rpc::ValidateTensorData(data, field));
  ASSIGN_OR_RETURN(torch::ScalarType type, ScalarTypeOf(data.dtype()));
  std::vector<int64_t> shape(data.shape().begin(), data.shape().end());
  torch::Tensor out = torch::empty(shape, torch::TensorOptions().dtype(type));
  if (!data.data().empty()) std::memcpy(out.data_ptr(), data.data().data(), data.data().size());
  return out;
}

absl::StatusOr<v1::TensorData> ToTensorData(const torch::Tensor& tensor) {
  std::string dtype;
  switch (tensor.scalar_type()) {
    case torch::kFloat32:
      dtype = "float32";
      break;
    case torch::kFloat64:
      dtype = "float64";
      break;
    case torch::kInt64:
      dtype = "int64";
      break;
    case torch::kInt32:
      dtype = "int32";
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("tensor dtype ", c10::toString(tensor.scalar_type()),
                       " has no TensorData name (float32, float64, int64, int32)"));
  }
  const torch::Tensor cpu = tensor.detach().to(torch::kCPU).contiguous();
  v1::TensorData out;
  out.set_dtype(dtype);
  for (int64_t d : cpu.sizes()) out.add_shape(d);
  out.set_data(static_cast<const char*>(cpu.data_ptr()), cpu.nbytes());
  return out;
}

}  // namespace stagecoach::runtime
