#include "common/rpc/tensor_data.h"

#include <algorithm>

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

int64_t ReplicaRows(int64_t rows, int microbatches, int replicas, int replica) {
  const int64_t parts = static_cast<int64_t>(microbatches) * replicas;
  int64_t out = 0;
  for (int64_t i = static_cast<int64_t>(replica) * microbatches;
       i < static_cast<int64_t>(replica + 1) * microbatches; ++i) {
    out += rows / parts + (i < rows % parts ? 1 : 0);
  }
  return out;
}

absl::StatusOr<v1::TensorData> ConcatRows(const std::vector<v1::TensorData>& parts,
                                          absl::string_view field) {
  if (parts.empty()) return absl::InvalidArgumentError(absl::StrCat(field, ": nothing to join"));
  v1::TensorData out = parts.front();
  if (out.shape_size() < 1) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": a scalar has no rows to join"));
  }
  for (size_t i = 1; i < parts.size(); ++i) {
    const v1::TensorData& p = parts[i];
    const bool same = p.dtype() == out.dtype() && p.shape_size() == out.shape_size() &&
                      std::equal(p.shape().begin() + 1, p.shape().end(), out.shape().begin() + 1);
    if (!same) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": part ", i, " is ",
                                                     DescribeTensorData(p), ", part 0 is ",
                                                     DescribeTensorData(parts.front())));
    }
    out.set_shape(0, out.shape(0) + p.shape(0));
    out.mutable_data()->append(p.data());
  }
  return out;
}

}  // namespace stagecoach::rpc
