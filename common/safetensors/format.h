// The safetensors file format (Hugging Face's, https://huggingface.co/docs/safetensors), read and
// checked without trusting the file. A file is
//   8 bytes   N, the header's length, an unsigned little-endian 64-bit integer;
//   N bytes   the header: a UTF-8 JSON object starting with '{' (trailing spaces allowed, which
//             writers use to align the data), mapping each tensor's name to
//             {"dtype": "F32", "shape": [2, 3], "data_offsets": [BEGIN, END]}, and optionally
//             "__metadata__" to an object of strings;
//   the rest  the data section: each tensor's bytes, row-major and little-endian, at
//             [BEGIN, END) relative to the section's start.
// As HF's reference reader does, ParseSafetensors refuses a header past the file or over
// kMaxHeaderBytes, invalid UTF-8 or JSON, a duplicated name, an unknown dtype or field, a shape
// that is not a list of non-negative integers or whose bytes overflow, offsets whose length is
// not the shape's bytes, and a data section not covered exactly: tensors that overlap, a gap
// between two, or bytes past the last. Every error is INVALID_ARGUMENT and names the file and,
// where one is at fault, the tensor. Pure functions; thread-safe; no LibTorch.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace stagecoach::safetensors {

// The element types of the format, by their names in the header.
enum class Dtype {
  kBool,     // BOOL
  kU8,       // U8
  kI8,       // I8
  kF8E5M2,   // F8_E5M2
  kF8E4M3,   // F8_E4M3
  kI16,      // I16
  kU16,      // U16
  kF16,      // F16
  kBF16,     // BF16
  kI32,      // I32
  kU32,      // U32
  kF32,      // F32
  kF64,      // F64
  kI64,      // I64
  kU64,      // U64
};

// "F32" for kF32, and so on.
absl::string_view DtypeName(Dtype dtype);
// The dtype named `name` (case-sensitive, as the format spells it); nullopt for any other.
std::optional<Dtype> ParseDtype(absl::string_view name);
// Bytes per element: 1, 2, 4 or 8.
int ElementSize(Dtype dtype);
// Every name ParseDtype knows, comma-separated, for messages.
std::string KnownDtypes();
// The bytes of a tensor of `shape` in `dtype`; nullopt when a dimension is negative or they
// exceed 2^64 - 1 (no file holds them).
std::optional<uint64_t> ShapeBytes(Dtype dtype, const std::vector<int64_t>& shape);

// The largest header read (HF's readers refuse more too): 100 MiB.
inline constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

struct TensorInfo {
  std::string name;
  Dtype dtype = Dtype::kF32;
  std::vector<int64_t> shape;
  // [begin, end) in the data section; end - begin == NumBytes().
  uint64_t begin = 0;
  uint64_t end = 0;

  int64_t NumElements() const;
  uint64_t NumBytes() const { return end - begin; }
};

struct Header {
  // In the order of their data (by begin, then name).
  std::vector<TensorInfo> tensors;
  std::map<std::string, std::string> metadata;  // "__metadata__"
  // Where the data section starts in the file (8 + N) and its length.
  uint64_t data_start = 0;
  uint64_t data_size = 0;

  // The tensor called `name`, or nullptr.
  const TensorInfo* Find(absl::string_view name) const;
};

// Parses and checks the header of `file`, a whole safetensors file's bytes (the data section is
// not read, only its length). `file_name` names it in errors.
absl::StatusOr<Header> ParseSafetensors(absl::string_view file, absl::string_view file_name);

// The same from the file's first bytes: `prefix` holds at least its first 8 + N bytes (or all of
// them) and `file_size` is its length.
absl::StatusOr<Header> ParseSafetensorsHeader(absl::string_view prefix, uint64_t file_size,
                                              absl::string_view file_name);

}  // namespace stagecoach::safetensors
