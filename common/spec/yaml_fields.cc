#include "common/spec/yaml_fields.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"

namespace stagecoach::spec::yaml_fields {
namespace {

constexpr uint64_t kUint64Max = std::numeric_limits<uint64_t>::max();

// An unquoted, untagged scalar: the only kind that can be an integer, a number or a bool.
bool IsPlainScalar(const YAML::Node& node) { return node.IsScalar() && node.Tag() == "?"; }

// Describe() for a scalar that has the wrong type, saying when it was quoted.
std::string DescribeNonPlain(const YAML::Node& node) {
  if (node.IsScalar() && !IsPlainScalar(node)) {
    return absl::StrCat(Quote(node.Scalar()), " (a quoted string)");
  }
  return Describe(node);
}

// Optimal string alignment distance (Levenshtein plus adjacent transpositions).
size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

// A YAML 1.2 core-schema integer: sign and magnitude; `overflow` when the magnitude does not fit
// in 64 bits.
struct ParsedInt {
  bool negative = false;
  uint64_t magnitude = 0;
  bool overflow = false;
};

// [-+]?[0-9]+ | 0o[0-7]+ | 0x[0-9a-fA-F]+, or nullopt.
std::optional<ParsedInt> ParseYamlInt(absl::string_view text) {
  ParsedInt out;
  int base = 10;
  if (absl::StartsWith(text, "0x")) {
    base = 16;
    text.remove_prefix(2);
  } else if (absl::StartsWith(text, "0o")) {
    base = 8;
    text.remove_prefix(2);
  } else if (!text.empty() && (text[0] == '-' || text[0] == '+')) {
    out.negative = text[0] == '-';
    text.remove_prefix(1);
  }
  if (text.empty()) return std::nullopt;
  for (char c : text) {
    int digit;
    if (c >= '0' && c <= '9') {
      digit = c - '0';
    } else if (base == 16 && c >= 'a' && c <= 'f') {
      digit = c - 'a' + 10;
    } else if (base == 16 && c >= 'A' && c <= 'F') {
      digit = c - 'A' + 10;
    } else {
      return std::nullopt;
    }
    if (digit >= base) return std::nullopt;
    if (out.magnitude > (kUint64Max - digit) / base) out.overflow = true;
    if (!out.overflow) out.magnitude = out.magnitude * base + digit;
  }
  return out;
}

// The magnitude of a negative int64 as uint64 (well defined for INT64_MIN).
uint64_t NegativeMagnitude(int64_t value) { return static_cast<uint64_t>(-(value + 1)) + 1; }

// -1, 0 or 1 as `value` is below, equal to or above `bound`.
int Compare(const ParsedInt& value, int64_t bound) {
  const bool value_negative = value.negative && (value.overflow || value.magnitude != 0);
  if (value_negative) {
    if (bound >= 0 || value.overflow) return -1;
    const uint64_t bound_magnitude = NegativeMagnitude(bound);
    return value.magnitude > bound_magnitude ? -1 : value.magnitude == bound_magnitude ? 0 : 1;
  }
  if (bound < 0 || value.overflow) return 1;
  const uint64_t b = static_cast<uint64_t>(bound);
  return value.magnitude < b ? -1 : value.magnitude == b ? 0 : 1;
}

// [-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?
bool IsYamlDecimalNumber(absl::string_view text) {
  size_t i = 0;
  auto digits = [&]() {
    const size_t start = i;
    while (i < text.size() && absl::ascii_isdigit(static_cast<unsigned char>(text[i]))) ++i;
    return i - start;
  };
  if (i < text.size() && (text[i] == '-' || text[i] == '+')) ++i;
  const size_t integer_digits = digits();
  size_t fraction_digits = 0;
  if (i < text.size() && text[i] == '.') {
    ++i;
    fraction_digits = digits();
  }
  if (integer_digits == 0 && fraction_digits == 0) return false;
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    if (i < text.size() && (text[i] == '-' || text[i] == '+')) ++i;
    if (digits() == 0) return false;
  }
  return i == text.size();
}

// .inf, .nan and their spellings in the YAML 1.2 core schema.
bool IsYamlInfOrNan(absl::string_view text) {
  if (!text.empty() && (text[0] == '-' || text[0] == '+')) text.remove_prefix(1);
  for (absl::string_view special : {".inf", ".Inf", ".INF", ".nan", ".NaN", ".NAN"}) {
    if (text == special) return true;
  }
  return false;
}

// The integer `node` spells (present, maybe null); nullopt after reporting an error to `v`.
std::optional<ParsedInt> IntText(Validator& v, const YAML::Node& node, const std::string& path) {
  std::optional<ParsedInt> parsed;
  if (IsPlainScalar(node)) parsed = ParseYamlInt(node.Scalar());
  if (!parsed) v.Error(path, absl::StrCat("must be an integer, got ", DescribeNonPlain(node)));
  return parsed;
}

template <typename T>
Read Store(std::optional<T> value, T* out) {
  if (!value) return Read::kInvalid;
  *out = *std::move(value);
  return Read::kOk;
}

}  // namespace

std::string Join(absl::string_view path, absl::string_view key) {
  return path.empty() ? std::string(key) : absl::StrCat(path, ".", key);
}

// A scalar as it appears in a message: single-quoted, control characters escaped, long text cut.
std::string Quote(absl::string_view text) {
  constexpr size_t kMaxShown = 60;
  std::string shown = absl::StrReplaceAll(text, {{"\n", "\\n"}, {"\t", "\\t"}, {"\r", "\\r"}});
  if (shown.size() > kMaxShown) shown = absl::StrCat(shown.substr(0, kMaxShown), "...");
  return absl::StrCat("'", shown, "'");
}

// What a node is, for "got ..." in messages.
std::string Describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Scalar:
      return Quote(node.Scalar());
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      break;
  }
  return "null";
}

// "; did you mean 'x'?" for the closest candidate when it is within distance 2, closer than the
// word's own length (so that short words are not matched to anything) and the only one that
// close; else "".
std::string Suggestion(absl::string_view word, const std::vector<std::string>& candidates) {
  const std::string lower = absl::AsciiStrToLower(word);
  const std::string* best = nullptr;
  size_t best_distance = 3;
  int tied = 0;
  for (const std::string& candidate : candidates) {
    const size_t distance = EditDistance(lower, candidate);
    if (distance >= word.size()) continue;
    if (distance < best_distance) {
      best = &candidate;
      best_distance = distance;
      tied = 1;
    } else if (distance == best_distance) {
      ++tied;
    }
  }
  return best == nullptr || tied > 1 ? "" : absl::StrCat("; did you mean '", *best, "'?");
}

// The entries of a mapping in document order. Reports (and skips) non-scalar, empty and
// duplicate keys. Null or undefined `node`: no entries. Not a mapping: error, nullopt.
std::optional<std::vector<std::pair<std::string, YAML::Node>>> Validator::Entries(
    const YAML::Node& node, const std::string& path) {
  std::vector<std::pair<std::string, YAML::Node>> out;
  if (!node.IsDefined() || node.IsNull()) return out;
  if (!node.IsMap()) {
    Error(path.empty() ? "spec" : path, absl::StrCat("must be a mapping, got ", Describe(node)));
    return std::nullopt;
  }
  std::set<std::string> seen;
  for (const auto& entry : node) {
    if (!entry.first.IsScalar()) {
      Error(path.empty() ? "spec" : path,
            absl::StrCat("keys must be strings, got ", Describe(entry.first)));
      continue;
    }
    const std::string& key = entry.first.Scalar();
    if (key.empty()) {
      Error(path.empty() ? "spec" : path, "keys must be non-empty");
      continue;
    }
    if (!seen.insert(key).second) {
      Error(Join(path, key), "duplicate key");
      continue;
    }
    out.emplace_back(key, entry.second);
  }
  return out;
}

std::optional<Fields> Validator::Open(
    const YAML::Node& node, const std::string& path, const std::vector<std::string>& valid,
    const std::vector<std::pair<std::string, std::string>>& foreign) {
  auto entries = Entries(node, path);
  if (!entries) return std::nullopt;
  Fields fields(this, path);
  for (auto& [key, value] : *entries) {
    if (std::find(valid.begin(), valid.end(), key) != valid.end()) {
      fields.entries_.emplace(key, value);
      continue;
    }
    auto it = std::find_if(foreign.begin(), foreign.end(),
                           [&key = key](const auto& f) { return f.first == key; });
    if (it != foreign.end()) {
      Error(Join(path, key), it->second);
    } else {
      Error(Join(path, key), absl::StrCat("unknown key (valid keys: ", absl::StrJoin(valid, ", "),
                                          ")", Suggestion(key, valid)));
    }
  }
  return fields;
}

std::optional<int64_t> Validator::Int(const YAML::Node& node, const std::string& path, int64_t min,
                                      int64_t max) {
  auto parsed = IntText(*this, node, path);
  if (!parsed) return std::nullopt;
  if (Compare(*parsed, min) < 0) {
    Error(path, absl::StrCat("must be >= ", min, ", got ", node.Scalar()));
    return std::nullopt;
  }
  if (Compare(*parsed, max) > 0) {
    Error(path, absl::StrCat("must be <= ", max, ", got ", node.Scalar()));
    return std::nullopt;
  }
  // In [min, max], so it fits in int64.
  if (parsed->negative && parsed->magnitude != 0) {
    return -static_cast<int64_t>(parsed->magnitude - 1) - 1;
  }
  return static_cast<int64_t>(parsed->magnitude);
}

std::optional<uint64_t> Validator::Uint(const YAML::Node& node, const std::string& path) {
  auto parsed = IntText(*this, node, path);
  if (!parsed) return std::nullopt;
  if (parsed->negative && (parsed->overflow || parsed->magnitude != 0)) {
    Error(path, absl::StrCat("must be >= 0, got ", node.Scalar()));
    return std::nullopt;
  }
  if (parsed->overflow) {
    Error(path, absl::StrCat("must be <= ", kUint64Max, ", got ", node.Scalar()));
    return std::nullopt;
  }
  return parsed->magnitude;
}

std::optional<double> Validator::Number(const YAML::Node& node, const std::string& path) {
  if (IsPlainScalar(node)) {
    const std::string& text = node.Scalar();
    if (IsYamlDecimalNumber(text)) {
      double value = 0;
      absl::string_view digits = text;
      if (absl::StartsWith(digits, "+")) digits.remove_prefix(1);
      if (absl::SimpleAtod(digits, &value) && std::isfinite(value)) return value;
      Error(path, absl::StrCat("must be a finite number, got ", text));
      return std::nullopt;
    }
    if (auto parsed = ParseYamlInt(text); parsed && !parsed->overflow) {
      return static_cast<double>(parsed->magnitude);  // 0x / 0o forms: never signed
    }
    if (IsYamlInfOrNan(text)) {
      Error(path, absl::StrCat("must be a finite number, got ", text));
      return std::nullopt;
    }
  }
  Error(path, absl::StrCat("must be a number, got ", DescribeNonPlain(node)));
  return std::nullopt;
}

std::optional<bool> Validator::Bool(const YAML::Node& node, const std::string& path) {
  if (IsPlainScalar(node)) {
    const std::string& text = node.Scalar();
    if (text == "true" || text == "True" || text == "TRUE") return true;
    if (text == "false" || text == "False" || text == "FALSE") return false;
  }
  Error(path, absl::StrCat("must be true or false, got ", DescribeNonPlain(node)));
  return std::nullopt;
}

std::optional<std::string> Validator::String(const YAML::Node& node, const std::string& path) {
  if (node.IsScalar()) return node.Scalar();
  Error(path, absl::StrCat("must be a string, got ", Describe(node)));
  return std::nullopt;
}

std::optional<std::string> Validator::Enum(const YAML::Node& node, const std::string& path,
                                           const std::vector<std::string>& options) {
  if (node.IsScalar() &&
      std::find(options.begin(), options.end(), node.Scalar()) != options.end()) {
    return node.Scalar();
  }
  Error(path,
        absl::StrCat("must be one of ", absl::StrJoin(options, ", "), ", got ", Describe(node)));
  return std::nullopt;
}

Read Fields::Uint(absl::string_view key, uint64_t* out) const {
  if (!Has(key)) return Read::kAbsent;
  return Store(v_->Uint(Get(key), Path(key)), out);
}

Read Fields::Number(absl::string_view key, double* out) const {
  if (!Has(key)) return Read::kAbsent;
  return Store(v_->Number(Get(key), Path(key)), out);
}

Read Fields::Bool(absl::string_view key, bool* out) const {
  if (!Has(key)) return Read::kAbsent;
  return Store(v_->Bool(Get(key), Path(key)), out);
}

Read Fields::String(absl::string_view key, std::string* out) const {
  if (!Has(key)) return Read::kAbsent;
  return Store(v_->String(Get(key), Path(key)), out);
}

Read Fields::Enum(absl::string_view key, const std::vector<std::string>& options,
                  std::string* out) const {
  if (!Has(key)) return Read::kAbsent;
  return Store(v_->Enum(Get(key), Path(key), options), out);
}

std::string PeekScalar(const YAML::Node& node, const char* key) {
  if (!node.IsMap()) return "";
  const YAML::Node& map = node;
  const YAML::Node value = map[key];
  return value.IsDefined() && value.IsScalar() ? value.Scalar() : "";
}

}  // namespace stagecoach::spec::yaml_fields
