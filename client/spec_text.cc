#include "client/spec_text.h"

#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/util/utf8.h"

namespace stagecoach::client {
namespace {

// `text` as a YAML double-quoted scalar, on one line.
std::string DoubleQuoted(absl::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
          out += absl::StrFormat("\\x%02x", static_cast<unsigned char>(c));
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

}  // namespace

std::string Utf8Problem(absl::string_view text, absl::string_view what) {
  const std::optional<size_t> bad = util::FirstInvalidUtf8(text);
  if (!bad.has_value()) return "";
  return absl::StrCat(what, " is not UTF-8 text: the byte at ", util::DescribeByteAt(text, *bad),
                      " is not valid UTF-8");
}

absl::StatusOr<std::string> InlineScheduleCsv(const std::string& spec_text,
                                              const std::string& spec_path) {
  YAML::Node root;
  try {
    root = YAML::Load(spec_text);
  } catch (const YAML::Exception&) {
    return spec_text;
  }
  if (!root.IsMap()) return spec_text;
  const YAML::Node& const_root = root;
  const YAML::Node schedule = const_root["schedule"];
  if (!schedule.IsDefined() || !schedule.IsMap()) return spec_text;
  std::optional<YAML::Node> key;
  std::string csv;
  for (auto it = schedule.begin(); it != schedule.end(); ++it) {
    if (!it->first.IsScalar()) continue;
    if (it->first.Scalar() == "csv_text") return spec_text;
    if (it->first.Scalar() == "csv" && !key.has_value() && it->second.IsScalar()) {
      key = it->first;
      csv = it->second.Scalar();
    }
  }
  if (!key.has_value() || csv.empty()) return spec_text;

  std::filesystem::path file(csv);
  if (file.is_relative()) file = std::filesystem::path(spec_path).parent_path() / file;
  std::error_code error;
  std::ifstream in;
  if (std::filesystem::is_regular_file(file, error)) in.open(file, std::ios::binary);
  std::stringstream contents;
  if (in) contents << in.rdbuf();
  if (!in.is_open() || in.bad()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read schedule.csv '", file.string(), "' (named in ", spec_path,
                     (std::filesystem::path(csv).is_relative()
                          ? "; a relative path is read from the spec file's directory)"
                          : ")")));
  }
  if (contents.str().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("schedule.csv '", file.string(), "' is empty (named in ", spec_path, ")"));
  }

  // yaml-cpp's marks count bytes, after a UTF-8 byte order mark.
  size_t at = key->Mark().pos;
  if (spec_text.rfind("\xEF\xBB\xBF", 0) == 0) at += 3;
  const absl::string_view rest =
      absl::string_view(spec_text).substr(std::min(at, spec_text.size()));
  const bool at_key = absl::StartsWith(rest, "csv") || absl::StartsWith(rest, "\"csv\"") ||
                      absl::StartsWith(rest, "'csv'");
  const std::string entry = absl::StrCat("csv_text: ", DoubleQuoted(contents.str()));
  std::string out = spec_text;
  if (at_key && schedule.Style() == YAML::EmitterStyle::Flow) {
    out.insert(at, absl::StrCat(entry, ", "));
    return out;
  }
  const size_t line_start = spec_text.rfind('\n', at == 0 ? 0 : at - 1);
  const size_t indent_from = line_start == std::string::npos ? 0 : line_start + 1;
  const absl::string_view indent =
      absl::string_view(spec_text).substr(indent_from, at - std::min(at, indent_from));
  if (at_key && at >= indent_from && indent.find_first_not_of(' ') == absl::string_view::npos) {
    out.insert(at, absl::StrCat(entry, "\n", indent));
    return out;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("cannot add the contents of schedule.csv to ", spec_path,
                   "; write it as a plain `csv: PATH` entry of the schedule mapping"));
}

bool HasBuiltinModel(const std::string& spec_text) {
  try {
    const YAML::Node root = YAML::Load(spec_text);
    if (!root.IsMap()) return false;
    const YAML::Node model = root["model"];
    return model.IsDefined() && model.IsMap() && model["builtin"].IsDefined();
  } catch (const YAML::Exception&) {
    return false;
  }
}

}  // namespace stagecoach::client
