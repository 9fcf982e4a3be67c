// One safetensors file on disk, memory-mapped read-only: its header is parsed and checked once
// (format.h) and each tensor's bytes are a view into the mapping, so a reader that needs a few
// tensors of a large file touches only their pages. Move-only; the views are valid while the
// object lives. Thread-safe for reading.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/safetensors/format.h"

namespace stagecoach::safetensors {

class SafetensorsFile {
 public:
  // Opens, maps and checks `path`. NOT_FOUND when it does not exist, PERMISSION_DENIED when it
  // cannot be read, INVALID_ARGUMENT (naming the path and the tensor) when its header is bad.
  static absl::StatusOr<SafetensorsFile> Open(const std::string& path);

  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  const Header& header() const { return header_; }
  // The tensor called `name`, or nullptr.
  const TensorInfo* Find(absl::string_view name) const { return header_.Find(name); }
  // `tensor`'s bytes (one of header().tensors).
  absl::string_view Data(const TensorInfo& tensor) const;
  // The bytes of the tensor called `name`; NOT_FOUND naming the file and the tensor.
  absl::StatusOr<absl::string_view> Data(absl::string_view name) const;

 private:
  SafetensorsFile() = default;
  void Unmap();

  std::string path_;
  Header header_;
  const char* mapping_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace stagecoach::safetensors
