#include "common/safetensors/format.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/util/utf8.h"
#include "nlohmann/json.hpp"

namespace stagecoach::safetensors {
namespace {

using nlohmann::json;

struct DtypeEntry {
  Dtype dtype;
  absl::string_view name;
  int size;
};

constexpr std::array<DtypeEntry, 15> kDtypes = {{
    {Dtype::kBool, "BOOL", 1},
    {Dtype::kU8, "U8", 1},
    {Dtype::kI8, "I8", 1},
    {Dtype::kF8E5M2, "F8_E5M2", 1},
    {Dtype::kF8E4M3, "F8_E4M3", 1},
    {Dtype::kI16, "I16", 2},
    {Dtype::kU16, "U16", 2},
    {Dtype::kF16, "F16", 2},
    {Dtype::kBF16, "BF16", 2},
    {Dtype::kI32, "I32", 4},
    {Dtype::kU32, "U32", 4},
    {Dtype::kF32, "F32", 4},
    {Dtype::kF64, "F64", 8},
    {Dtype::kI64, "I64", 8},
    {Dtype::kU64, "U64", 8},
}};

const DtypeEntry& Entry(Dtype dtype) {
  for (const DtypeEntry& e : kDtypes) {
    if (e.dtype == dtype) return e;
  }
  return kDtypes[11];  // unreachable: every enumerator is in the table
}

uint64_t ReadLittleEndian64(absl::string_view bytes) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | static_cast<uint8_t>(bytes[i]);
  return value;
}

// A JSON number that is a non-negative integer, as uint64; nullopt otherwise.
std::optional<uint64_t> NonNegativeInteger(const json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return static_cast<uint64_t>(v.get<int64_t>());
  return std::nullopt;
}

class HeaderParser {
 public:
  HeaderParser(absl::string_view file_name, uint64_t data_size)
      : file_name_(file_name), data_size_(data_size) {}

  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(file_name_, ": ", what));
  }
  absl::Status TensorError(absl::string_view name, absl::string_view what) const {
    return Error(absl::StrCat("tensor '", name, "': ", what));
  }

  absl::Status Metadata(const json& value, Header& header) const {
    if (!value.is_object()) return Error("__metadata__ is not an object of strings");
    for (const auto& [key, v] : value.items()) {
      if (!v.is_string()) {
        return Error(absl::StrCat("__metadata__ '", key, "' is not a string: ", v.dump()));
      }
      header.metadata[key] = v.get<std::string>();
    }
    return absl::OkStatus();
  }

  absl::StatusOr<TensorInfo> Tensor(const std::string& name, const json& value) const {
    if (name.empty()) return Error("a tensor has an empty name");
    if (!value.is_object()) {
      return TensorError(name, "is not an object with dtype, shape and data_offsets");
    }
    for (const auto& [key, v] : value.items()) {
      if (key != "dtype" && key != "shape" && key != "data_offsets") {
        return TensorError(name, absl::StrCat("unknown field '", key,
                                              "' (a tensor has dtype, shape and data_offsets)"));
      }
    }
    TensorInfo t;
    t.name = name;
    const auto dtype = value.find("dtype");
    if (dtype == value.end() || !dtype->is_string()) {
      return TensorError(name, "has no dtype string");
    }
    const std::optional<Dtype> parsed = ParseDtype(dtype->get<std::string>());
    if (!parsed) {
      return TensorError(name, absl::StrCat("unknown dtype '", dtype->get<std::string>(),
                                            "' (known: ", KnownDtypes(), ")"));
    }
    t.dtype = *parsed;
    const auto shape = value.find("shape");
    if (shape == value.end() || !shape->is_array()) return TensorError(name, "has no shape list");
    for (size_t d = 0; d < shape->size(); ++d) {
      const std::optional<uint64_t> dim = NonNegativeInteger((*shape)[d]);
      if (!dim || *dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return TensorError(name, absl::StrCat("dimension ", d, " of its shape is ",
                                              (*shape)[d].dump(),
                                              ", not an integer in [0, 2^63)"));
      }
      t.shape.push_back(static_cast<int64_t>(*dim));
    }
    const auto offsets = value.find("data_offsets");
    if (offsets == value.end() || !offsets->is_array() || offsets->size() != 2) {
      return TensorError(name, "has no data_offsets [begin, end]");
    }
    const std::optional<uint64_t> begin = NonNegativeInteger((*offsets)[0]);
    const std::optional<uint64_t> end = NonNegativeInteger((*offsets)[1]);
    if (!begin || !end || *begin > *end) {
      return TensorError(name, absl::StrCat("data_offsets ", offsets->dump(),
                                            " are not integers begin <= end"));
    }
    if (*end > data_size_) {
      return TensorError(name, absl::StrCat("data_offsets ", offsets->dump(),
                                            " end past the data section (", data_size_,
                                            " bytes)"));
    }
    t.begin = *begin;
    t.end = *end;
    const std::optional<uint64_t> bytes = ShapeBytes(t.dtype, t.shape);
    if (bytes != t.end - t.begin) {
      return TensorError(
          name, absl::StrCat("shape ", shape->dump(), " of ", DtypeName(t.dtype), " needs ",
                             bytes ? absl::StrCat(*bytes) : std::string("more than 2^64"),
                             " bytes, but data_offsets ", offsets->dump(), " hold ",
                             t.end - t.begin));
    }
    return t;
  }

  // The tensors must cover the data section exactly, without overlaps, gaps or a tail.
  absl::Status Coverage(std::vector<TensorInfo>& tensors) const {
    std::sort(tensors.begin(), tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
      return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
    });
    uint64_t covered = 0;
    const TensorInfo* previous = nullptr;
    for (const TensorInfo& t : tensors) {
      if (t.begin < covered) {
        return Error(absl::StrCat("tensors '", previous->name, "' [", previous->begin, ", ",
                                  previous->end, ") and '", t.name, "' [", t.begin, ", ", t.end,
                                  ") overlap"));
      }
      if (t.begin > covered) {
        return Error(absl::StrCat("bytes [", covered, ", ", t.begin,
                                  ") of the data section belong to no tensor (before '", t.name,
                                  "')"));
      }
      covered = t.end;
      if (t.end > t.begin) previous = &t;
    }
    if (covered != data_size_) {
      return Error(absl::StrCat("bytes [", covered, ", ", data_size_,
                                ") of the data section belong to no tensor (past the last)"));
    }
    return absl::OkStatus();
  }

 private:
  absl::string_view file_name_;
  uint64_t data_size_;
};

}  // namespace

absl::string_view DtypeName(Dtype dtype) { return Entry(dtype).name; }

std::optional<Dtype> ParseDtype(absl::string_view name) {
  for (const DtypeEntry& e : kDtypes) {
    if (e.name == name) return e.dtype;
  }
  return std::nullopt;
}

int ElementSize(Dtype dtype) { return Entry(dtype).size; }

std::string KnownDtypes() {
  std::vector<absl::string_view> names;
  for (const DtypeEntry& e : kDtypes) names.push_back(e.name);
  return absl::StrJoin(names, ", ");
}

std::optional<uint64_t> ShapeBytes(Dtype dtype, const std::vector<int64_t>& shape) {
  unsigned __int128 bytes = static_cast<unsigned>(ElementSize(dtype));
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    // Past 2^64 no file holds it; stop there so that the product cannot overflow (a later zero
    // still makes it 0).
    bytes = std::min(bytes * static_cast<uint64_t>(d), static_cast<unsigned __int128>(1) << 64);
  }
  if (bytes > std::numeric_limits<uint64_t>::max()) return std::nullopt;
  return static_cast<uint64_t>(bytes);
}

int64_t TensorInfo::NumElements() const {
  // A zero anywhere makes it empty, however large the others (their product may overflow).
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const TensorInfo* Header::Find(absl::string_view name) const {
  for (const TensorInfo& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

absl::StatusOr<Header> ParseSafetensors(absl::string_view file, absl::string_view file_name) {
  return ParseSafetensorsHeader(file, file.size(), file_name);
}

absl::StatusOr<Header> ParseSafetensorsHeader(absl::string_view prefix, uint64_t file_size,
                                              absl::string_view file_name) {
  auto error = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(file_name, ": ", what));
  };
  if (file_size < 8 || prefix.size() < 8) {
    return error(absl::StrCat("not a safetensors file: ", file_size,
                              " bytes, fewer than the 8 that give the header's length"));
  }
  const uint64_t n = ReadLittleEndian64(prefix);
  if (n > kMaxHeaderBytes) {
    return error(absl::StrCat("the header's length is ", n, " bytes, over the ",
                              kMaxHeaderBytes, " a safetensors header may have"));
  }
  if (n > file_size - 8) {
    return error(absl::StrCat("the header's length is ", n, " bytes, past the end of the file (",
                              file_size, " bytes)"));
  }
  if (prefix.size() < 8 + n) {
    return error(absl::StrCat("only ", prefix.size(), " of the header's ", 8 + n,
                              " bytes were read"));
  }
  const absl::string_view text = prefix.substr(8, n);
  if (text.empty() || text[0] != '{') {
    return error("the header does not start with '{' (not a safetensors file?)");
  }
  if (const std::optional<size_t> bad = util::FirstInvalidUtf8(text)) {
    return error(absl::StrCat("the header is not UTF-8: ", util::DescribeByteAt(text, *bad)));
  }
  std::set<std::string> names;
  std::string duplicate;
  json::parser_callback_t callback = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth == 1 && parsed.is_string() &&
        !names.insert(parsed.get<std::string>()).second && duplicate.empty()) {
      duplicate = parsed.get<std::string>();
    }
    return true;
  };
  const json root = json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) {
    return error("the header is not a JSON object");
  }
  if (!duplicate.empty()) return error(absl::StrCat("the header names '", duplicate, "' twice"));
  Header header;
  header.data_start = 8 + n;
  header.data_size = file_size - header.data_start;
  HeaderParser parser(file_name, header.data_size);
  for (const auto& [key, value] : root.items()) {
    if (key == "__metadata__") {
      if (absl::Status s = parser.Metadata(value, header); !s.ok()) return s;
      continue;
    }
    absl::StatusOr<TensorInfo> tensor = parser.Tensor(key, value);
    if (!tensor.ok()) return tensor.status();
    header.tensors.push_back(*std::move(tensor));
  }
  if (absl::Status s = parser.Coverage(header.tensors); !s.ok()) return s;
  return header;
}

}  // namespace stagecoach::safetensors
