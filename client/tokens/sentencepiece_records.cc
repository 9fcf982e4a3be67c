#include "client/tokens/sentencepiece_records.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <ostream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/util/status_macros.h"
#include "nlohmann/json.hpp"

namespace stagecoach::client {
namespace {

absl::Status LineError(const std::string& path, int64_t line, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("'", path, "' line ", line, ": ", what));
}

// The record's string field `key`.
absl::StatusOr<std::string> RecordField(const nlohmann::json& record, const std::string& key,
                                        const std::string& path, int64_t line) {
  auto it = record.find(key);
  if (it == record.end() || !it->is_string()) {
    return LineError(path, line, absl::StrCat("no string \"", key, "\""));
  }
  return it->get<std::string>();
}

}  // namespace

absl::Status WriteRecordIds(const TokensCommandOptions& o, const text::SentencePieceTokenizer& t,
                            std::ostream& out) {
  const std::string& path = o.inputs[0];
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot open '", path, "': ", std::strerror(errno)));
  }
  out << "tokenizer " << t.vocab_size() << " " << t.bos_id() << " " << t.eos_id() << "\n";
  std::string text;
  for (int64_t line = 1; std::getline(in, text); ++line) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    const nlohmann::json record = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (record.is_discarded() || !record.is_object()) {
      return LineError(path, line, "not a JSON object");
    }
    ASSIGN_OR_RETURN(const std::string prompt, RecordField(record, o.prompt_field, path, line));
    ASSIGN_OR_RETURN(const std::string response, RecordField(record, o.response_field, path, line));
    const std::string origin = absl::StrCat(path, " line ", line);
    ASSIGN_OR_RETURN(const std::vector<int64_t> p, t.Encode(prompt, origin));
    ASSIGN_OR_RETURN(const std::vector<int64_t> r, t.Encode(response, origin));
    out << line << "\t" << absl::StrJoin(p, " ") << "\t" << absl::StrJoin(r, " ") << "\n";
  }
  if (in.bad()) return absl::InvalidArgumentError(absl::StrCat("cannot read '", path, "'"));
  return absl::OkStatus();
}

}  // namespace stagecoach::client
