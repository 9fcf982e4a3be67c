// NumPy .npy files as v1::TensorData, so that stagectl reads and writes tensors without
// LibTorch (users write them with numpy.save and read them with numpy.load).
//
// Supported: format versions 1.0, 2.0 and 3.0; dtypes '<f4' (float32), '<f8' (float64), '<i8'
// (int64) and '<i4' (int32); C order (Fortran order only where it is the same layout: fewer
// than two dimensions). Anything else is refused with an error naming the file and saying
// why: not an .npy file, a big-endian or unsupported dtype, Fortran order, a malformed header,
// or data shorter or longer than the header's shape needs. Written files are version 1.0
// (2.0 when the header needs it) with numpy's 64-byte header alignment.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "stagecoach/v1/types.pb.h"

namespace stagecoach::client {

// An .npy file's header, checked (magic, version, the dict's three keys), and its data.
struct NpyHeader {
  std::string descr;  // "<f4", "|O", ...
  bool fortran_order = false;
  std::vector<int64_t> shape;
  absl::string_view data;  // the bytes after the header (a view of the parsed bytes)
};
absl::StatusOr<NpyHeader> ParseNpyHeader(absl::string_view bytes, absl::string_view name);

// Parses the contents of an .npy file; `name` (the file's path) starts every error message.
// INVALID_ARGUMENT for what the file comment lists.
absl::StatusOr<v1::TensorData> ParseNpy(absl::string_view bytes, absl::string_view name);

// The .npy file contents for `tensor`. INVALID_ARGUMENT when the tensor is malformed
// (rpc::ValidateTensorData).
absl::StatusOr<std::string> SerializeNpy(const v1::TensorData& tensor);

// Reads and parses `path`; NOT_FOUND when it cannot be read.
absl::StatusOr<v1::TensorData> ReadNpy(const std::string& path);

// Writes `tensor` to `path`, replacing it; INTERNAL naming the path when writing fails.
absl::Status WriteNpy(const std::string& path, const v1::TensorData& tensor);

}  // namespace stagecoach::client
