// Writing safetensors files (format.h): the tensors' bytes in the order given, after a header
// padded with spaces so that the data section starts at a multiple of 8 bytes (as HF's writers
// do). A file appears whole or not at all (common/util/durable_file.h). Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/safetensors/format.h"

namespace stagecoach::safetensors {

struct TensorToWrite {
  std::string name;
  Dtype dtype = Dtype::kF32;
  std::vector<int64_t> shape;
  // Row-major, little-endian; exactly the shape's elements times ElementSize(dtype) bytes.
  absl::string_view data;
};

// The file's first bytes: the 8-byte length and the padded JSON header. INVALID_ARGUMENT,
// naming `file_name` and the tensor, for an empty, reserved ("__metadata__") or repeated name, a
// negative dimension, or data whose size is not the shape's.
absl::StatusOr<std::string> EncodeHeader(const std::vector<TensorToWrite>& tensors,
                                         const std::map<std::string, std::string>& metadata,
                                         absl::string_view file_name);

// Writes `tensors` (and `metadata` as "__metadata__", when not empty) to `path` durably. Errors
// as EncodeHeader's, and WriteFileDurably's for the file.
absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

}  // namespace stagecoach::safetensors
