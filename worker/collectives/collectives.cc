#include "worker/collectives/collectives.h"

#include "absl/strings/str_cat.h"

namespace stagecoach::collectives {

size_t ElementBytes(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32:
      return 4;
    case DataType::kFloat64:
      return 8;
  }
  return 0;
}

absl::string_view DataTypeName(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32:
      return "float32";
    case DataType::kFloat64:
      return "float64";
  }
  return "?";
}

absl::string_view ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kMean:
      return "mean";
    case ReduceOp::kMax:
      return "max";
  }
  return "?";
}

absl::Status CheckCall(absl::string_view what, int64_t count, const void* a, const void* b,
                       int root, int size) {
  if (count < 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": count must be >= 0, got ", count));
  }
  if (count > 0 && (a == nullptr || b == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": a buffer of ", count, " elements is null"));
  }
  if (root != -1 && (root < 0 || root >= size)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": root ", root, " is outside the group of ", size, " ranks"));
  }
  return absl::OkStatus();
}

}  // namespace stagecoach::collectives
