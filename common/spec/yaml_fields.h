// Reading one YAML document field by field, for the job spec parser (spec_parser.cc): typed
// reads of optional fields (integers in a range, numbers, bools, strings, one of a set) and
// mappings whose keys are checked against the valid ones, with every error collected, each
// naming its path ("training.batch_size: must be >= 1, got 0") and, for an unknown key, the
// closest valid one.
//
// Contract: a Validator collects the errors of one document; nothing throws and nothing stops
// at the first error. Integers follow YAML 1.2's core schema (decimal, 0o, 0x; a quoted "4" is a
// string, and says so), numbers must be finite, bools are true/false in three spellings. Not
// thread-safe: one Validator and its Fields belong to one parse.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace stagecoach::spec::yaml_fields {

// "path.key", or "key" at the top.
std::string Join(absl::string_view path, absl::string_view key);

// A scalar as it appears in a message: single-quoted, control characters escaped, long text cut.
std::string Quote(absl::string_view text);

// What a node is, for "got ..." in messages.
std::string Describe(const YAML::Node& node);

// "; did you mean 'x'?" for the closest candidate when it is within distance 2, closer than the
// word's own length (so that short words are not matched to anything) and the only one that
// close; else "".
std::string Suggestion(absl::string_view word, const std::vector<std::string>& candidates);

// How a read of one optional field went.
// The scalar value of a mapping's key, if it is a scalar ("" otherwise), for choosing which
// keys the rest of the mapping may have (a family, a kind).
std::string PeekScalar(const YAML::Node& node, const char* key);

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

// Collects every error of one document.
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
                                                                         const std::string& path);

  // Opens a mapping whose keys must be in `valid`; `foreign` are keys that exist elsewhere in
  // the document but not here, each with its reason. Absent or null: an empty Fields. Not a
  // mapping: error, nullopt.
  std::optional<Fields> Open(const YAML::Node& node, const std::string& path,
                             const std::vector<std::string>& valid,
                             const std::vector<std::pair<std::string, std::string>>& foreign = {});

  // Element readers: `node` is present (maybe null); nullopt after reporting an error.
  std::optional<int64_t> Int(const YAML::Node& node, const std::string& path, int64_t min,
                             int64_t max);
  std::optional<uint64_t> Uint(const YAML::Node& node, const std::string& path);
  std::optional<double> Number(const YAML::Node& node, const std::string& path);
  std::optional<bool> Bool(const YAML::Node& node, const std::string& path);
  std::optional<std::string> String(const YAML::Node& node, const std::string& path);
  std::optional<std::string> Enum(const YAML::Node& node, const std::string& path,
                                  const std::vector<std::string>& options);

 private:
  std::vector<std::string> errors_;
};

template <typename T>
Read Fields::Int(absl::string_view key, int64_t min, int64_t max, T* out) const {
  if (!Has(key)) return Read::kAbsent;
  auto value = v_->Int(Get(key), Path(key), min, max);
  if (!value) return Read::kInvalid;
  *out = static_cast<T>(*value);
  return Read::kOk;
}

}  // namespace stagecoach::spec::yaml_fields
