#include "client/npy.h"

#include <cctype>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/rpc/tensor_data.h"
#include "common/util/status_macros.h"

namespace stagecoach::client {
namespace {

constexpr absl::string_view kMagic = "\x93NUMPY";
constexpr size_t kAlignment = 64;  // numpy pads the header so the data starts 64-aligned

struct DType {
  absl::string_view descr;
  absl::string_view name;  // TensorData dtype
};
constexpr DType kDTypes[] = {
    {"<f4", "float32"}, {"<f8", "float64"}, {"<i8", "int64"}, {"<i4", "int32"}};

// A value of the header's Python dict literal: a string, a bool, a tuple of integers, or a
// list (a structured dtype's descr, which is skipped).
struct HeaderValue {
  enum Kind { kString, kBool, kTuple, kList } kind = kString;
  std::string text;
  bool flag = false;
  std::vector<int64_t> ints;
};

// Reads the header dict, e.g. "{'descr': '<f4', 'fortran_order': False, 'shape': (10, 16), }".
class HeaderParser {
 public:
  explicit HeaderParser(absl::string_view text) : text_(text) {}

  absl::Status Parse(std::vector<std::pair<std::string, HeaderValue>>* out) {
    Skip();
    if (!Eat('{')) return Error("expected '{'");
    while (true) {
      Skip();
      if (Eat('}')) break;
      std::string key;
      RETURN_IF_ERROR(String(&key));
      Skip();
      if (!Eat(':')) return Error("expected ':'");
      Skip();
      HeaderValue value;
      RETURN_IF_ERROR(Value(&value));
      out->emplace_back(std::move(key), std::move(value));
      Skip();
      if (Eat(',')) continue;
      Skip();
      if (Eat('}')) break;
      return Error("expected ',' or '}'");
    }
    Skip();
    if (pos_ != text_.size()) return Error("unexpected text after the dict");
    return absl::OkStatus();
  }

 private:
  absl::Status Error(absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(what, " at offset ", pos_));
  }
  void Skip() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }
  bool Eat(char c) {
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool EatWord(absl::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }
  absl::Status String(std::string* out) {
    if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"')) {
      return Error("expected a quoted string");
    }
    const char quote = text_[pos_++];
    const size_t end = text_.find(quote, pos_);
    if (end == absl::string_view::npos) return Error("unterminated string");
    *out = std::string(text_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return absl::OkStatus();
  }
  absl::Status Value(HeaderValue* out) {
    if (pos_ < text_.size() && (text_[pos_] == '\'' || text_[pos_] == '"')) {
      out->kind = HeaderValue::kString;
      return String(&out->text);
    }
    if (EatWord("True") || EatWord("False")) {
      out->kind = HeaderValue::kBool;
      out->flag = text_[pos_ - 1] == 'e' && text_[pos_ - 2] == 'u';
      return absl::OkStatus();
    }
    if (Eat('(')) {
      out->kind = HeaderValue::kTuple;
      while (true) {
        Skip();
        if (Eat(')')) return absl::OkStatus();
        const size_t start = pos_;
        while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) {
          ++pos_;
        }
        int64_t dim = 0;
        if (!absl::SimpleAtoi(text_.substr(start, pos_ - start), &dim)) {
          pos_ = start;
          return Error("expected a non-negative integer in the shape");
        }
        Eat('L');  // Python 2 longs
        out->ints.push_back(dim);
        Skip();
        if (Eat(',')) continue;
        if (Eat(')')) return absl::OkStatus();
        return Error("expected ',' or ')' in the shape");
      }
    }
    if (pos_ < text_.size() && text_[pos_] == '[') {
      out->kind = HeaderValue::kList;
      return SkipList();
    }
    return Error("expected a string, True, False or a tuple");
  }
  // Skips a bracketed list with nested brackets, parentheses and quoted strings.
  absl::Status SkipList() {
    int depth = 0;
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c == '\'' || c == '"') {
        std::string ignored;
        RETURN_IF_ERROR(String(&ignored));
        continue;
      }
      ++pos_;
      if (c == '[' || c == '(') ++depth;
      if ((c == ']' || c == ')') && --depth == 0) return absl::OkStatus();
    }
    return Error("unterminated list");
  }

  absl::string_view text_;
  size_t pos_ = 0;
};

uint32_t LittleEndian(absl::string_view bytes) {
  uint32_t v = 0;
  for (size_t i = bytes.size(); i-- > 0;) v = (v << 8) | static_cast<unsigned char>(bytes[i]);
  return v;
}

}  // namespace

absl::StatusOr<NpyHeader> ParseNpyHeader(absl::string_view bytes, absl::string_view name) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": ", why));
  };
  if (bytes.size() < kMagic.size() + 2 || bytes.substr(0, kMagic.size()) != kMagic) {
    return bad("not a NumPy .npy file (no \\x93NUMPY magic)");
  }
  const int major = static_cast<unsigned char>(bytes[6]);
  const int minor = static_cast<unsigned char>(bytes[7]);
  size_t length_bytes = 0;
  if (major == 1 && minor == 0) {
    length_bytes = 2;
  } else if ((major == 2 || major == 3) && minor == 0) {
    length_bytes = 4;
  } else {
    return bad(absl::StrCat(".npy format version ", major, ".", minor,
                            " is not supported (supported: 1.0, 2.0, 3.0)"));
  }
  const size_t prefix = 8 + length_bytes;
  if (bytes.size() < prefix) return bad("truncated header");
  const size_t header_length = LittleEndian(bytes.substr(8, length_bytes));
  if (bytes.size() < prefix + header_length) {
    return bad(absl::StrCat("truncated header: it says ", header_length, " bytes, the file has ",
                            bytes.size() - prefix));
  }
  const absl::string_view header = bytes.substr(prefix, header_length);
  std::vector<std::pair<std::string, HeaderValue>> fields;
  if (absl::Status parsed = HeaderParser(header).Parse(&fields); !parsed.ok()) {
    return bad(absl::StrCat("malformed header: ", parsed.message()));
  }
  const HeaderValue* descr = nullptr;
  const HeaderValue* fortran = nullptr;
  const HeaderValue* shape = nullptr;
  for (const auto& [key, value] : fields) {
    if (key == "descr") descr = &value;
    if (key == "fortran_order") fortran = &value;
    if (key == "shape") shape = &value;
  }
  if (descr == nullptr || descr->kind != HeaderValue::kString) {
    return bad(
        "header: 'descr' must be a dtype string such as '<f4' (structured dtypes are not "
        "supported)");
  }
  if (fortran == nullptr || fortran->kind != HeaderValue::kBool) {
    return bad("header: 'fortran_order' must be True or False");
  }
  if (shape == nullptr || shape->kind != HeaderValue::kTuple) {
    return bad("header: 'shape' must be a tuple of integers");
  }
  NpyHeader out;
  out.descr = descr->text;
  out.fortran_order = fortran->flag;
  out.shape = shape->ints;
  out.data = bytes.substr(prefix + header_length);
  return out;
}

absl::StatusOr<v1::TensorData> ParseNpy(absl::string_view bytes, absl::string_view name) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": ", why));
  };
  ASSIGN_OR_RETURN(const NpyHeader h, ParseNpyHeader(bytes, name));
  const std::string& descr = h.descr;
  if (descr == "|O") {
    return bad(
        "an object array (dtype '|O', pickled): stagectl reads one only as ragged rows of "
        "token ids (`stagectl step --inputs`, client/ragged_rows.h)");
  }
  std::optional<absl::string_view> dtype;
  for (const DType& d : kDTypes) {
    if (descr == d.descr) dtype = d.name;
  }
  if (!dtype.has_value()) {
    if (!descr.empty() && descr[0] == '>') {
      return bad(absl::StrCat("dtype '", descr,
                              "' is big-endian; save a little-endian array (arr.astype('<",
                              descr.substr(1), "'))"));
    }
    return bad(absl::StrCat("dtype '", descr,
                            "' is not supported (supported: <f4 float32, <f8 float64, <i8 int64, "
                            "<i4 int32)"));
  }
  if (h.fortran_order && h.shape.size() >= 2) {
    return bad(
        "Fortran-order arrays are not supported; save a C-order array "
        "(np.ascontiguousarray)");
  }
  v1::TensorData out;
  out.set_dtype(std::string(*dtype));
  for (int64_t d : h.shape) out.add_shape(d);
  int64_t want = rpc::DTypeSize(*dtype);
  for (int64_t d : h.shape) {
    if (__builtin_mul_overflow(want, d, &want)) return bad("header: the shape is too large");
  }
  if (static_cast<int64_t>(h.data.size()) != want) {
    return bad(
        absl::StrCat(static_cast<int64_t>(h.data.size()) < want ? "truncated data" : "extra data",
                     ": ", descr, " shape (", absl::StrJoin(h.shape, ", "), ") needs ", want,
                     " bytes after the header, the file has ", h.data.size()));
  }
  out.set_data(std::string(h.data));
  return out;
}

absl::StatusOr<std::string> SerializeNpy(const v1::TensorData& tensor) {
  RETURN_IF_ERROR(rpc::ValidateTensorData(tensor, "tensor"));
  absl::string_view descr;
  for (const DType& d : kDTypes) {
    if (tensor.dtype() == d.name) descr = d.descr;
  }
  std::string shape = absl::StrJoin(tensor.shape(), ", ");
  if (tensor.shape_size() == 1) shape += ",";
  std::string header =
      absl::StrCat("{'descr': '", descr, "', 'fortran_order': False, 'shape': (", shape, "), }");
  // Version 1.0 stores the header length in 2 bytes, 2.0 in 4.
  const bool v2 = header.size() + 1 + 10 + kAlignment > 0xffff;
  const size_t prefix = v2 ? 12 : 10;
  const size_t padded = (prefix + header.size() + 1 + kAlignment - 1) / kAlignment * kAlignment;
  header.append(padded - prefix - header.size() - 1, ' ');
  header.push_back('\n');
  std::string out(kMagic);
  out.push_back(static_cast<char>(v2 ? 2 : 1));
  out.push_back(0);
  const uint32_t length = static_cast<uint32_t>(header.size());
  for (size_t i = 0; i < prefix - 8; ++i)
    out.push_back(static_cast<char>((length >> (8 * i)) & 0xff));
  out += header;
  out += tensor.data();
  return out;
}

absl::StatusOr<v1::TensorData> ReadNpy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot read the file"));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return absl::NotFoundError(absl::StrCat(path, ": cannot read the file"));
  return ParseNpy(bytes, path);
}

absl::Status WriteNpy(const std::string& path, const v1::TensorData& tensor) {
  ASSIGN_OR_RETURN(std::string bytes, SerializeNpy(tensor));
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) return absl::InternalError(absl::StrCat(path, ": cannot write the file"));
  return absl::OkStatus();
}

}  // namespace stagecoach::client
