#include "common/schedule/csv.h"

#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace stagecoach::schedule {
namespace {

absl::Status FieldError(size_t line, size_t column, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("schedule CSV line ", line + 1, " (rank ", line,
                                                 "), column ", column + 1, " (step ", column,
                                                 "): ", why));
}

// Removes the double quotes around a field; nothing else may be quoted.
absl::StatusOr<absl::string_view> Unquote(absl::string_view field, size_t line, size_t column) {
  const size_t quote = field.find('"');
  if (quote == absl::string_view::npos) return field;
  if (field.size() >= 2 && field.front() == '"' && field.back() == '"' &&
      field.substr(1, field.size() - 2).find('"') == absl::string_view::npos) {
    return field.substr(1, field.size() - 2);
  }
  return FieldError(line, column,
                    absl::StrCat("stray double quote in field \"", field,
                                 "\" (a field may only be wrapped in quotes as a whole)"));
}

}  // namespace

absl::StatusOr<PipelineOrder> ParseScheduleCsv(absl::string_view text) {
  std::vector<absl::string_view> lines = absl::StrSplit(text, '\n');
  if (!lines.empty() && lines.back().empty()) lines.pop_back();  // final terminator
  PipelineOrder order;
  order.reserve(lines.size());
  for (size_t line = 0; line < lines.size(); ++line) {
    absl::string_view row = lines[line];
    if (!row.empty() && row.back() == '\r') row.remove_suffix(1);
    RankActions actions;
    if (!row.empty()) {
      std::vector<absl::string_view> fields = absl::StrSplit(row, ',');
      for (size_t column = 0; column < fields.size(); ++column) {
        auto field = Unquote(fields[column], line, column);
        if (!field.ok()) return field.status();
        auto action = ParseAction(*field);
        if (!action.ok()) return FieldError(line, column, action.status().message());
        actions.push_back(*std::move(action));
      }
    }
    order.push_back(std::move(actions));
  }
  return order;
}

std::string FormatScheduleCsv(const PipelineOrder& order) {
  std::string out;
  for (const RankActions& actions : order) {
    if (actions.size() == 1 && !actions[0].has_value()) {
      out += "\"\"\n";
      continue;
    }
    for (size_t i = 0; i < actions.size(); ++i) {
      if (i > 0) out += ',';
      if (actions[i].has_value()) out += actions[i]->ToString();
    }
    out += '\n';
  }
  return out;
}

}  // namespace stagecoach::schedule
