#include "common/safetensors/file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/util/durable_file.h"

namespace stagecoach::safetensors {
namespace {

absl::Status SystemError(const std::string& path, absl::string_view step, int error) {
  return ErrnoStatus(error, absl::StrCat(path, ": ", step));
}

}  // namespace

absl::StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return SystemError(path, "cannot open", errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int error = errno;
    ::close(fd);
    return SystemError(path, "cannot stat", error);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  SafetensorsFile file;
  file.path_ = path;
  file.size_ = static_cast<uint64_t>(st.st_size);
  if (file.size_ > 0) {
    void* mapping = ::mmap(nullptr, file.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (mapping == MAP_FAILED) {
      const int error = errno;
      ::close(fd);
      return SystemError(path, "cannot map", error);
    }
    file.mapping_ = static_cast<const char*>(mapping);
  }
  ::close(fd);  // the mapping keeps the file
  absl::StatusOr<Header> header = ParseSafetensors(
      absl::string_view(file.mapping_ == nullptr ? "" : file.mapping_, file.size_), path);
  if (!header.ok()) return header.status();
  file.header_ = *std::move(header);
  return file;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept { *this = std::move(other); }

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    Unmap();
    path_ = std::move(other.path_);
    header_ = std::move(other.header_);
    mapping_ = std::exchange(other.mapping_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() { Unmap(); }

void SafetensorsFile::Unmap() {
  if (mapping_ != nullptr) ::munmap(const_cast<char*>(mapping_), size_);
  mapping_ = nullptr;
  size_ = 0;
}

absl::string_view SafetensorsFile::Data(const TensorInfo& tensor) const {
  if (tensor.NumBytes() == 0) return absl::string_view();
  return absl::string_view(mapping_ + header_.data_start + tensor.begin, tensor.NumBytes());
}

absl::StatusOr<absl::string_view> SafetensorsFile::Data(absl::string_view name) const {
  const TensorInfo* tensor = Find(name);
  if (tensor == nullptr) {
    return absl::NotFoundError(absl::StrCat(path_, ": no tensor '", name, "'"));
  }
  return Data(*tensor);
}

}  // namespace stagecoach::safetensors
