#include "common/spec/spec_parser.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "common/checkpoint/layout.h"
#include "common/transport/backends.h"

namespace stagecoach::spec {
namespace {

constexpr int64_t kIntMax = std::numeric_limits<int>::max();
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr uint64_t kUint64Max = std::numeric_limits<uint64_t>::max();
constexpr size_t kMaxNameLength = 63;

const std::vector<std::string>& TopLevelKeys() {
  static const auto* keys = new std::vector<std::string>{
      "name", "model", "split", "schedule", "placement", "training", "data", "restart"};
  return *keys;
}

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

std::string FormatRange(double lo, bool lo_inclusive, double hi, bool hi_inclusive) {
  return absl::StrCat(lo_inclusive ? "[" : "(", lo, ", ", hi, hi_inclusive ? "]" : ")");
}

// How a read of one optional field went.
enum class Read { kAbsent, kOk, kInvalid };

class Validator;

// The entries of one YAML mapping, looked up by key (the first occurrence of a duplicate).
class Fields {
 public:
  Fields(Validator* validator, std::string path) : v_(validator), path_(std::move(path)) {}

  std::string Path(absl::string_view key) const { return Join(path_, key); }

  // True when `key` is there with a non-null value.
  bool Has(absl::string_view key) const {
    auto it = entries_.find(std::string(key));
    return it != entries_.end() && !it->second.IsNull();
  }
  // The value of `key`; a null node when absent.
  YAML::Node Get(absl::string_view key) const {
    auto it = entries_.find(std::string(key));
    return it == entries_.end() ? YAML::Node() : it->second;
  }

  // Typed reads of an optional field: kAbsent (output untouched) when the key is missing or
  // null, kInvalid (error reported, output untouched) when the value breaks the rule.
  template <typename T>
  Read Int(absl::string_view key, int64_t min, int64_t max, T* out) const;
  Read Uint(absl::string_view key, uint64_t* out) const;
  Read Number(absl::string_view key, double* out) const;
  Read Bool(absl::string_view key, bool* out) const;
  Read String(absl::string_view key, std::string* out) const;
  Read Enum(absl::string_view key, const std::vector<std::string>& options, std::string* out) const;

 private:
  friend class Validator;
  Validator* v_;
  std::string path_;
  std::map<std::string, YAML::Node> entries_;
};

// Collects every error of one spec.
class Validator {
 public:
  void Error(absl::string_view path, absl::string_view reason) {
    errors_.push_back(absl::StrCat(path, ": ", reason));
  }
  const std::vector<std::string>& errors() const { return errors_; }
  size_t error_count() const { return errors_.size(); }

  // The entries of a mapping in document order. Reports (and skips) non-scalar, empty and
  // duplicate keys. Null or undefined `node`: no entries. Not a mapping: error, nullopt.
  std::optional<std::vector<std::pair<std::string, YAML::Node>>> Entries(const YAML::Node& node,
                                                                         const std::string& path) {
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

  // Opens a mapping whose keys must be in `valid`; `foreign` are keys that exist elsewhere in
  // the spec but not here, each with its reason. Absent or null: an empty Fields. Not a
  // mapping: error, nullopt.
  std::optional<Fields> Open(const YAML::Node& node, const std::string& path,
                             const std::vector<std::string>& valid,
                             const std::vector<std::pair<std::string, std::string>>& foreign = {}) {
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

  // Element readers: `node` is present (maybe null); nullopt after reporting an error.
  std::optional<ParsedInt> IntText(const YAML::Node& node, const std::string& path) {
    std::optional<ParsedInt> parsed;
    if (IsPlainScalar(node)) parsed = ParseYamlInt(node.Scalar());
    if (!parsed) Error(path, absl::StrCat("must be an integer, got ", DescribeNonPlain(node)));
    return parsed;
  }

  std::optional<int64_t> Int(const YAML::Node& node, const std::string& path, int64_t min,
                             int64_t max) {
    auto parsed = IntText(node, path);
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

  std::optional<uint64_t> Uint(const YAML::Node& node, const std::string& path) {
    auto parsed = IntText(node, path);
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

  std::optional<double> Number(const YAML::Node& node, const std::string& path) {
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

  std::optional<bool> Bool(const YAML::Node& node, const std::string& path) {
    if (IsPlainScalar(node)) {
      const std::string& text = node.Scalar();
      if (text == "true" || text == "True" || text == "TRUE") return true;
      if (text == "false" || text == "False" || text == "FALSE") return false;
    }
    Error(path, absl::StrCat("must be true or false, got ", DescribeNonPlain(node)));
    return std::nullopt;
  }

  std::optional<std::string> String(const YAML::Node& node, const std::string& path) {
    if (node.IsScalar()) return node.Scalar();
    Error(path, absl::StrCat("must be a string, got ", Describe(node)));
    return std::nullopt;
  }

  std::optional<std::string> Enum(const YAML::Node& node, const std::string& path,
                                  const std::vector<std::string>& options) {
    if (node.IsScalar() &&
        std::find(options.begin(), options.end(), node.Scalar()) != options.end()) {
      return node.Scalar();
    }
    Error(path,
          absl::StrCat("must be one of ", absl::StrJoin(options, ", "), ", got ", Describe(node)));
    return std::nullopt;
  }

 private:
  std::vector<std::string> errors_;
};

template <typename T>
Read Store(std::optional<T> value, T* out) {
  if (!value) return Read::kInvalid;
  *out = *std::move(value);
  return Read::kOk;
}

template <typename T>
Read Fields::Int(absl::string_view key, int64_t min, int64_t max, T* out) const {
  if (!Has(key)) return Read::kAbsent;
  auto value = v_->Int(Get(key), Path(key), min, max);
  if (!value) return Read::kInvalid;
  *out = static_cast<T>(*value);
  return Read::kOk;
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

// The name of layer `i` of a built-in model (0 <= i < BuiltinLayerCount).
std::string LayerName(const BuiltinModel& model, int64_t i) {
  if (model.family == "mlp") return absl::StrCat(i);
  if (i == 0) return "embed";
  if (i <= model.layers) return absl::StrCat("blocks.", i - 1);
  return i == model.layers + 1 ? "norm" : "head";
}

// Whether `name` is one of BuiltinLayerNames(model), without listing them (a model may have
// very many layers).
bool IsLayerName(const BuiltinModel& model, absl::string_view name) {
  auto index_below = [](absl::string_view digits, int64_t limit) {
    int64_t index = 0;
    if (digits.empty() || (digits.size() > 1 && digits[0] == '0')) return false;
    if (!std::all_of(digits.begin(), digits.end(),
                     [](char c) { return absl::ascii_isdigit(static_cast<unsigned char>(c)); })) {
      return false;
    }
    return absl::SimpleAtoi(digits, &index) && index < limit;
  };
  if (model.family == "mlp") return index_below(name, BuiltinLayerCount(model));
  if (model.family != "gpt") return false;
  if (name == "embed" || name == "norm" || name == "head") return true;
  return absl::ConsumePrefix(&name, "blocks.") && index_below(name, model.layers);
}

// The layer names for an error message: all of them, or the first and last few of a long list.
std::string DescribeLayerNames(const BuiltinModel& model) {
  constexpr int64_t kHead = 5, kTail = 3;
  const int64_t count = BuiltinLayerCount(model);
  std::vector<std::string> shown;
  for (int64_t i = 0; i < count; ++i) {
    if (count > kHead + kTail + 2 && i == kHead) {
      shown.push_back("...");
      i = count - kTail;
    }
    shown.push_back(LayerName(model, i));
  }
  return absl::StrJoin(shown, ", ");
}

// The family-specific scalar value of a mapping's key, if it is a scalar, for choosing which
// keys the rest of the mapping may have.
std::string PeekScalar(const YAML::Node& node, const char* key) {
  if (!node.IsMap()) return "";
  const YAML::Node& map = node;
  const YAML::Node value = map[key];
  return value.IsDefined() && value.IsScalar() ? value.Scalar() : "";
}

class SpecParser {
 public:
  JobSpec Parse(const YAML::Node& root) {
    auto top = v_.Open(root, "", TopLevelKeys());
    if (!top) return spec_;
    ParseName(*top);
    ParseModel(top->Get("model"));
    ParseSplit(top->Get("split"));
    ParseSchedule(top->Get("schedule"));
    ParsePlacement(top->Get("placement"));
    ParseTraining(top->Get("training"));
    ParseData(top->Get("data"));
    ParseRestart(top->Get("restart"));
    if (microbatches_ok_ && batch_size_ok_ &&
        spec_.schedule.microbatches > spec_.training.batch_size) {
      v_.Error("schedule.microbatches",
               absl::StrCat("must be <= training.batch_size (", spec_.training.batch_size,
                            "), got ", spec_.schedule.microbatches));
    }
    return spec_;
  }

  const std::vector<std::string>& errors() const { return v_.errors(); }

 private:
  void ParseName(const Fields& top) {
    switch (top.String("name", &spec_.name)) {
      case Read::kAbsent:
        v_.Error("name", "required");
        return;
      case Read::kInvalid:
        return;
      case Read::kOk:
        break;
    }
    const std::string& name = spec_.name;
    if (name.size() > kMaxNameLength) {
      v_.Error("name",
               absl::StrCat("must be at most ", kMaxNameLength, " characters, got ", name.size()));
      return;
    }
    auto alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
    bool ok = !name.empty() && alnum(name.front()) && alnum(name.back()) &&
              std::all_of(name.begin(), name.end(), [&](char c) { return alnum(c) || c == '-'; });
    if (!ok) {
      v_.Error("name", absl::StrCat("must match [a-z0-9]([a-z0-9-]*[a-z0-9])? (lowercase letters, "
                                    "digits and '-'), got ",
                                    Quote(name)));
    }
  }

  void ParseModel(const YAML::Node& node) {
    auto model = v_.Open(node, "model", {"torchscript", "builtin"});
    if (!model) return;
    const bool has_torchscript = model->Has("torchscript");
    const bool has_builtin = model->Has("builtin");
    if (has_torchscript == has_builtin) {
      v_.Error("model", "exactly one of 'torchscript' or 'builtin' is required");
    }
    std::string torchscript;
    if (model->String("torchscript", &torchscript) == Read::kOk) {
      if (torchscript.empty()) {
        v_.Error("model.torchscript", "must be a non-empty path");
      } else {
        spec_.model.torchscript = torchscript;
      }
    }
    if (has_builtin) {
      const size_t errors_before = v_.error_count();
      BuiltinModel builtin;
      ParseBuiltin(model->Get("builtin"), &builtin);
      spec_.model.builtin = builtin;
      builtin_ok_ = !has_torchscript && v_.error_count() == errors_before;
    }
  }

  void ParseBuiltin(const YAML::Node& node, BuiltinModel* builtin) {
    static const std::vector<std::string> kMlpKeys = {"family", "sizes", "seed"};
    static const std::vector<std::string> kGptKeys = {"family", "vocab", "d_model", "layers",
                                                      "heads",  "seq",   "seed"};
    static const std::vector<std::string> kAllKeys = {"family", "sizes", "vocab", "d_model",
                                                      "layers", "heads", "seq",   "seed"};
    const std::string path = "model.builtin";
    const std::string family = PeekScalar(node, "family");
    std::optional<Fields> fields;
    if (family == "mlp") {
      std::vector<std::pair<std::string, std::string>> foreign;
      for (const char* key : {"vocab", "d_model", "layers", "heads", "seq"}) {
        foreign.emplace_back(key, "not a key of family mlp");
      }
      fields = v_.Open(node, path, kMlpKeys, foreign);
    } else if (family == "gpt") {
      fields = v_.Open(node, path, kGptKeys, {{"sizes", "not a key of family gpt"}});
    } else {
      fields = v_.Open(node, path, kAllKeys);
    }
    if (!fields) return;

    if (fields->Enum("family", {"mlp", "gpt"}, &builtin->family) == Read::kAbsent) {
      v_.Error(fields->Path("family"), "required (mlp or gpt)");
    }
    fields->Uint("seed", &builtin->seed);
    if (builtin->family == "mlp") {
      ParseMlpSizes(*fields, builtin);
    } else if (builtin->family == "gpt") {
      bool all_ok = true;
      const std::pair<const char*, int64_t*> dims[] = {{"vocab", &builtin->vocab},
                                                       {"d_model", &builtin->d_model},
                                                       {"layers", &builtin->layers},
                                                       {"heads", &builtin->heads},
                                                       {"seq", &builtin->seq}};
      for (const auto& [key, out] : dims) {
        const Read read = fields->Int(key, 1, kIntMax, out);
        if (read == Read::kAbsent) v_.Error(fields->Path(key), "required for family gpt");
        all_ok = all_ok && read == Read::kOk;
      }
      if (all_ok && builtin->d_model % builtin->heads != 0) {
        v_.Error(fields->Path("d_model"),
                 absl::StrCat("must be divisible by model.builtin.heads (", builtin->heads,
                              "), got ", builtin->d_model));
      }
    }
  }

  void ParseMlpSizes(const Fields& fields, BuiltinModel* builtin) {
    const std::string path = fields.Path("sizes");
    if (!fields.Has("sizes")) {
      v_.Error(path, "required for family mlp");
      return;
    }
    const YAML::Node sizes = fields.Get("sizes");
    if (!sizes.IsSequence()) {
      v_.Error(path, absl::StrCat("must be a list of at least 2 integers, got ", Describe(sizes)));
      return;
    }
    if (sizes.size() < 2) {
      v_.Error(path, absl::StrCat("must be a list of at least 2 integers, got ", sizes.size(),
                                  sizes.size() == 1 ? " item" : " items"));
    }
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (auto size = v_.Int(sizes[i], absl::StrCat(path, "[", i, "]"), 1, kInt64Max)) {
        builtin->sizes.push_back(*size);
      }
    }
  }

  void ParseSplit(const YAML::Node& node) {
    auto split = v_.Open(node, "split", {"stages", "points", "policy"});
    if (!split) return;
    const BuiltinModel* builtin = builtin_ok_ ? &*spec_.model.builtin : nullptr;
    const int64_t layer_count = builtin ? BuiltinLayerCount(*builtin) : 0;

    if (split->Int("stages", 1, kIntMax, &spec_.split.stages) == Read::kOk && builtin &&
        spec_.split.stages > layer_count) {
      v_.Error(split->Path("stages"),
               absl::StrCat("must be <= ", layer_count, " (the model's layers), got ",
                            spec_.split.stages));
    }
    if (split->Has("stages") && split->Has("points")) {
      v_.Error("split", "'stages' and 'points' are mutually exclusive");
    }
    if (split->Has("points")) {
      const std::string path = split->Path("points");
      if (auto points = v_.Entries(split->Get("points"), path)) {
        if (split->Get("points").size() == 0) v_.Error(path, "must name at least one layer");
        for (const auto& [name, value] : *points) {
          const std::string point_path = Join(path, name);
          if (!value.IsScalar() || (value.Scalar() != "beginning" && value.Scalar() != "end")) {
            v_.Error(point_path,
                     absl::StrCat("must be 'beginning' or 'end', got ", Describe(value)));
            continue;
          }
          if (builtin && !IsLayerName(*builtin, name)) {
            constexpr int64_t kMaxSuggestionCandidates = 1000;
            const std::string suggestion = layer_count <= kMaxSuggestionCandidates
                                               ? Suggestion(name, BuiltinLayerNames(*builtin))
                                               : "";
            v_.Error(point_path, absl::StrCat("not a layer of the builtin model (its layers: ",
                                              DescribeLayerNames(*builtin), ")", suggestion));
            continue;
          }
          spec_.split.points[name] = value.Scalar();
        }
      }
    }
    split->Enum("policy", {"equal-layers", "equal-params", "profiled"}, &spec_.split.policy);
  }

  void ParseSchedule(const YAML::Node& node) {
    auto schedule =
        v_.Open(node, "schedule", {"kind", "microbatches", "csv", "csv_format", "csv_text"});
    if (!schedule) return;
    ScheduleSpec& out = spec_.schedule;
    const bool has_kind = schedule->Has("kind");
    const bool has_csv = schedule->Has("csv");
    if (has_kind == has_csv) {
      v_.Error("schedule", "exactly one of 'kind' or 'csv' is required");
    }
    if (schedule->String("kind", &out.kind) == Read::kOk && out.kind.empty()) {
      v_.Error(schedule->Path("kind"), "must be a non-empty generator name");
    }
    if (schedule->String("csv", &out.csv) == Read::kOk && out.csv.empty()) {
      v_.Error(schedule->Path("csv"), "must be a non-empty path");
    }
    microbatches_ok_ =
        schedule->Int("microbatches", 1, kIntMax, &out.microbatches) != Read::kInvalid;
    if (schedule->Enum("csv_format", {"compute_only", "compute_comms"}, &out.csv_format) !=
            Read::kAbsent &&
        !has_csv) {
      v_.Error(schedule->Path("csv_format"), "only valid with schedule.csv");
    }
    if (schedule->String("csv_text", &out.csv_text) != Read::kAbsent && !has_csv) {
      v_.Error(schedule->Path("csv_text"), "only valid with schedule.csv");
    }
  }

  void ParsePlacement(const YAML::Node& node) {
    auto placement = v_.Open(node, "placement", {"workers", "device", "style", "transport"});
    if (!placement) return;
    placement->Int("workers", 1, kIntMax, &spec_.placement.workers);
    const Read device = placement->Enum("device", {"cpu", "cuda"}, &spec_.placement.device);
    placement->Enum("style", {"loop", "v"}, &spec_.placement.style);
    // "auto" or a registered backend; one that needs CUDA only with device cuda.
    const transport::BackendRegistry& backends = transport::BackendRegistry::Global();
    std::vector<std::string> transports = {"auto"};
    for (std::string& name : backends.Names()) transports.push_back(std::move(name));
    if (placement->Enum("transport", transports, &spec_.placement.transport) == Read::kOk &&
        device != Read::kInvalid) {
      const absl::Status usable =
          backends.CheckDevice(spec_.placement.transport, spec_.placement.device);
      if (!usable.ok()) v_.Error(placement->Path("transport"), usable.message());
    }
  }

  void ParseTraining(const YAML::Node& node) {
    auto training = v_.Open(
        node, "training",
        {"batch_size", "steps", "loss", "scale_grads", "optimizer", "checkpoint", "resume_from"});
    if (!training) return;
    TrainingSpec& out = spec_.training;
    switch (training->Int("batch_size", 1, kInt64Max, &out.batch_size)) {
      case Read::kAbsent:
        v_.Error(training->Path("batch_size"), "required");
        break;
      case Read::kOk:
        batch_size_ok_ = true;
        break;
      case Read::kInvalid:
        break;
    }
    training->Int("steps", 1, kInt64Max, &out.steps);
    training->Enum("loss", {"mse", "cross_entropy"}, &out.loss);
    training->Bool("scale_grads", &out.scale_grads);
    ParseOptimizer(training->Get("optimizer"));
    ParseCheckpoint(training->Get("checkpoint"));
    // The coordinator verifies the checkpoint itself (manifest, checksums, stage layout).
    if (training->String("resume_from", &out.resume_from) == Read::kOk && out.resume_from.empty()) {
      v_.Error(training->Path("resume_from"), "must be a non-empty path");
    }
    // A checkpoint's manifest names its directory.
    const std::string manifest = absl::StrCat("/", checkpoint::kManifestFileName);
    if (absl::EndsWith(out.resume_from, manifest)) {
      out.resume_from.resize(out.resume_from.size() - manifest.size());
    }
  }

  void ParseOptimizer(const YAML::Node& node) {
    const std::string path = "training.optimizer";
    const std::string kind = PeekScalar(node, "kind");
    std::optional<Fields> optimizer;
    if (kind == "adamw") {
      optimizer = v_.Open(node, path, {"kind", "lr", "weight_decay", "betas", "eps"},
                          {{"momentum", "not a key of optimizer adamw"}});
    } else if (kind == "sgd" || kind.empty()) {
      optimizer =
          v_.Open(node, path, {"kind", "lr", "weight_decay", "momentum"},
                  {{"betas", "not a key of optimizer sgd"}, {"eps", "not a key of optimizer sgd"}});
    } else {
      optimizer = v_.Open(node, path, {"kind", "lr", "weight_decay", "momentum", "betas", "eps"});
    }
    if (!optimizer) return;
    OptimizerSpec& out = spec_.training.optimizer;
    optimizer->Enum("kind", {"sgd", "adamw"}, &out.kind);
    if (out.kind == "adamw") {
      out.lr = 0.001;
      out.weight_decay = 0.01;
    }
    auto check = [&](const char* key, double* value, double lo, bool lo_inclusive, double hi,
                     bool hi_inclusive) {
      if (optimizer->Number(key, value) != Read::kOk) return;
      const bool above = lo_inclusive ? *value >= lo : *value > lo;
      const bool below = hi_inclusive ? *value <= hi : *value < hi;
      if (above && below) return;
      const std::string got = optimizer->Get(key).Scalar();
      if (std::isinf(hi)) {
        v_.Error(optimizer->Path(key),
                 absl::StrCat("must be ", lo_inclusive ? ">= " : "> ", lo, ", got ", got));
      } else {
        v_.Error(optimizer->Path(key),
                 absl::StrCat("must be in ", FormatRange(lo, lo_inclusive, hi, hi_inclusive),
                              ", got ", got));
      }
    };
    constexpr double kInf = std::numeric_limits<double>::infinity();
    check("lr", &out.lr, 0, false, kInf, false);
    check("weight_decay", &out.weight_decay, 0, true, kInf, false);
    check("momentum", &out.momentum, 0, true, 1, false);
    check("eps", &out.eps, 0, false, kInf, false);
    if (optimizer->Has("betas")) {
      const std::string betas_path = optimizer->Path("betas");
      const YAML::Node betas = optimizer->Get("betas");
      if (!betas.IsSequence()) {
        v_.Error(betas_path, absl::StrCat("must be a list of two numbers, got ", Describe(betas)));
      } else if (betas.size() != 2) {
        v_.Error(betas_path, absl::StrCat("must be a list of two numbers, got ", betas.size(),
                                          betas.size() == 1 ? " item" : " items"));
      } else {
        double* outs[2] = {&out.beta1, &out.beta2};
        for (size_t i = 0; i < 2; ++i) {
          const std::string element_path = absl::StrCat(betas_path, "[", i, "]");
          auto beta = v_.Number(betas[i], element_path);
          if (!beta) continue;
          if (*beta < 0 || *beta >= 1) {
            v_.Error(element_path, absl::StrCat("must be in [0, 1), got ", betas[i].Scalar()));
            continue;
          }
          *outs[i] = *beta;
        }
      }
    }
  }

  void ParseCheckpoint(const YAML::Node& node) {
    auto checkpoint = v_.Open(node, "training.checkpoint", {"dir", "every_steps"});
    if (!checkpoint) return;
    CheckpointSpec& out = spec_.training.checkpoint;
    checkpoint->String("dir", &out.dir);
    if (checkpoint->Int("every_steps", 0, kInt64Max, &out.every_steps) == Read::kOk &&
        !checkpoint->Has("dir")) {
      v_.Error(checkpoint->Path("every_steps"), "only valid with training.checkpoint.dir");
    }
  }

  void ParseData(const YAML::Node& node) {
    auto data = v_.Open(node, "data", {"kind", "path", "seed", "seq"});
    if (!data) return;
    DataSpec& out = spec_.data;
    const Read kind = data->Enum("kind", {"synthetic", "tokens", "tensors"}, &out.kind);
    const Read path = data->String("path", &out.path);
    if (path == Read::kOk && out.path.empty()) {
      v_.Error(data->Path("path"), "must be a non-empty path");
    }
    if (kind != Read::kInvalid) {
      if (out.kind == "synthetic" && path != Read::kAbsent) {
        v_.Error(data->Path("path"),
                 "not used by data.kind synthetic (use kind tokens or tensors)");
      } else if (out.kind != "synthetic" && path == Read::kAbsent) {
        v_.Error(data->Path("path"), absl::StrCat("required for data.kind ", out.kind));
      }
    }
    data->Uint("seed", &out.seed);
    const Read seq = data->Int("seq", 1, kIntMax, &out.seq);
    if (seq == Read::kOk && kind != Read::kInvalid && out.kind != "tokens") {
      v_.Error(data->Path("seq"), "only used by data.kind tokens");
    }
  }

  void ParseRestart(const YAML::Node& node) {
    auto restart = v_.Open(node, "restart", {"max_restarts"});
    if (!restart) return;
    restart->Int("max_restarts", 0, kIntMax, &spec_.restart.max_restarts);
  }

  Validator v_;
  JobSpec spec_;
  bool builtin_ok_ = false;       // model.builtin is the model and is valid
  bool microbatches_ok_ = false;  // schedule.microbatches is valid or defaulted
  bool batch_size_ok_ = false;    // training.batch_size is given and valid
};

absl::Status Invalid(absl::string_view message) { return absl::InvalidArgumentError(message); }

}  // namespace

absl::StatusOr<JobSpec> ParseJobSpec(absl::string_view yaml_text, absl::string_view origin) {
  std::vector<YAML::Node> documents;
  try {
    documents = YAML::LoadAll(std::string(yaml_text));
  } catch (const YAML::Exception& e) {
    if (e.mark.is_null()) return Invalid(absl::StrCat(origin, ": invalid YAML: ", e.msg));
    return Invalid(absl::StrCat(origin, ":", e.mark.line + 1, ":", e.mark.column + 1,
                                ": invalid YAML: ", e.msg));
  }
  const std::string expected =
      absl::StrCat("a mapping with keys ", absl::StrJoin(TopLevelKeys(), ", "));
  if (documents.size() > 1) {
    return Invalid(absl::StrCat(origin, ": expected one YAML document, got ", documents.size()));
  }
  if (documents.empty() || documents[0].IsNull()) {
    return Invalid(absl::StrCat(origin, ": the spec is empty; expected ", expected));
  }
  if (!documents[0].IsMap()) {
    return Invalid(
        absl::StrCat(origin, ": the spec must be ", expected, "; got ", Describe(documents[0])));
  }
  SpecParser parser;
  JobSpec spec;
  try {
    spec = parser.Parse(documents[0]);
  } catch (const YAML::Exception& e) {
    // Not expected: node types are checked before every access.
    return Invalid(absl::StrCat(origin, ": invalid YAML: ", e.msg));
  }
  if (!parser.errors().empty()) return Invalid(absl::StrJoin(parser.errors(), "\n"));
  return spec;
}

int64_t BuiltinLayerCount(const BuiltinModel& model) {
  if (model.family == "mlp") {
    return model.sizes.size() < 2 ? 0 : static_cast<int64_t>(model.sizes.size()) - 1;
  }
  if (model.family == "gpt") return model.layers + 3;
  return 0;
}

std::vector<std::string> BuiltinLayerNames(const BuiltinModel& model) {
  std::vector<std::string> names;
  if (model.family == "mlp") {
    for (int64_t i = 0; i < BuiltinLayerCount(model); ++i) names.push_back(absl::StrCat(i));
  } else if (model.family == "gpt") {
    names.push_back("embed");
    for (int64_t i = 0; i < model.layers; ++i) names.push_back(absl::StrCat("blocks.", i));
    names.push_back("norm");
    names.push_back("head");
  }
  return names;
}

}  // namespace stagecoach::spec
