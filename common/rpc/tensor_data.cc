#include "common/rpc/tensor_data.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace stagecoach::rpc {

int64_t DTypeSize(absl::string_view dtype) {
  if (dtype == "float32" || dtype == "int32") return 4;
  if (dtype == "float64" || dtype == "int64") return 8;
  return 0;
}

absl::Status ValidateTensorData(const v1::TensorData& tensor, absl::string_view field) {
  const int64_t element = DTypeSize(tensor.dtype());
  if (element == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".dtype: must be float32, float64, int64 or int32, got '", tensor.dtype(), "'"));
  }
  int64_t bytes = element;
  for (int i = 0; i < tensor.shape_size(); ++i) {
    const int64_t dim = tensor.shape(i);
    if (dim < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".shape[", i, "]: must be >= 0, got ", dim));
    }
    if (__builtin_mul_overflow(bytes, dim, &bytes)) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".shape: [", absl::StrJoin(tensor.shape(), ", "), "] is too large"));
    }
  }
  if (static_cast<int64_t>(tensor.data().size()) != bytes) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".data: ", DescribeTensorData(tensor),
                                                   " needs ", bytes, " bytes, got ",
                                                   tensor.data().size()));
  }
  return absl::OkStatus();
}

std::string DescribeTensorData(const v1::TensorData& tensor) {
  return absl::StrCat(tensor.dtype(), "[", absl::StrJoin(tensor.shape(), ", "), "]");
}

}  // namespace stagecoach::rpc
