// `stagectl tokens` (tokens_command.h).
#include "client/tokens_command.h"

#include <fstream>
#include <ostream>
#include <sstream>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/text/char_vocabulary.h"
#include "common/util/byte_size.h"
#include "common/util/durable_file.h"
#include "common/util/status_macros.h"

namespace stagecoach::client {
namespace {

// The exit code of a usage error (stagectl_main.cc).
constexpr int kTokensUsage = 2;

absl::StatusOr<std::string> ReadWhole(const std::string& path, absl::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", what, " ", path));
  std::stringstream bytes;
  bytes << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("reading ", what, " ", path, " failed"));
  return bytes.str();
}

absl::Status Write(const std::string& path, absl::string_view contents, absl::string_view what) {
  DurableFileOptions options;
  options.what = std::string(what);
  return WriteFileDurably(path, contents, options);
}

// The input files, in order.
absl::StatusOr<std::vector<text::Document>> ReadDocuments(const std::vector<std::string>& paths) {
  std::vector<text::Document> docs;
  for (const std::string& path : paths) {
    ASSIGN_OR_RETURN(std::string contents, ReadWhole(path, "text file"));
    docs.push_back({path, std::move(contents)});
  }
  return docs;
}

absl::Status Build(const TokensCommandOptions& o, std::ostream& out) {
  ASSIGN_OR_RETURN(std::vector<text::Document> docs, ReadDocuments(o.inputs));
  ASSIGN_OR_RETURN(text::CharVocabulary vocab, text::CharVocabulary::FromDocuments(docs));
  ASSIGN_OR_RETURN(std::vector<uint16_t> tokens, vocab.Encode(docs));
  RETURN_IF_ERROR(Write(o.vocab_path, vocab.ToJson(), "vocabulary"));
  RETURN_IF_ERROR(Write(o.out_path, text::TokenBytes(tokens), "token file"));
  out << tokens.size() << " characters of " << o.inputs.size() << " file"
      << (o.inputs.size() == 1 ? "" : "s") << ", " << vocab.size() << " distinct: wrote "
      << o.vocab_path << " and " << o.out_path << " ("
      << util::FormatBytes(static_cast<double>(tokens.size() * 2)) << ")\n"
      << "Train a built-in GPT on it with model.builtin.vocab: " << vocab.size()
      << " (or more) and data: {kind: tokens, path: " << o.out_path << "}\n";
  return absl::OkStatus();
}

absl::Status Encode(const TokensCommandOptions& o, std::ostream& out) {
  ASSIGN_OR_RETURN(text::CharVocabulary vocab, ReadVocabularyFile(o.vocab_path));
  std::vector<text::Document> docs;
  if (o.text.has_value()) {
    docs.push_back({"--text", *o.text});
  } else {
    ASSIGN_OR_RETURN(docs, ReadDocuments(o.inputs));
  }
  ASSIGN_OR_RETURN(std::vector<uint16_t> tokens, vocab.Encode(docs));
  if (o.out_path.empty()) {
    out << absl::StrJoin(tokens, " ") << "\n";
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(Write(o.out_path, text::TokenBytes(tokens), "token file"));
  out << tokens.size() << " tokens: wrote " << o.out_path << "\n";
  return absl::OkStatus();
}

absl::Status Decode(const TokensCommandOptions& o, std::ostream& out) {
  ASSIGN_OR_RETURN(text::CharVocabulary vocab, ReadVocabularyFile(o.vocab_path));
  const std::string& path = o.inputs[0];
  ASSIGN_OR_RETURN(std::string bytes, ReadWhole(path, "token file"));
  ASSIGN_OR_RETURN(std::vector<uint16_t> tokens, text::ParseTokenBytes(bytes, path));
  ASSIGN_OR_RETURN(std::string decoded, vocab.Decode(tokens, path));
  if (o.out_path.empty()) {
    out << decoded;
    return absl::OkStatus();
  }
  return Write(o.out_path, decoded, "text file");
}

// The usage error of `o`, or "" when the arguments fit the action.
std::string UsageError(const TokensCommandOptions& o) {
  if (o.action != "build" && o.action != "encode" && o.action != "decode") {
    return absl::StrCat("'", o.action, "' is not an action: build, encode or decode");
  }
  if (o.vocab_path.empty()) return "--vocab FILE is required";
  if (o.action == "build") {
    if (o.inputs.empty()) return "build needs one or more text files";
    if (o.out_path.empty()) return "build needs --out FILE for the tokens";
    if (o.text.has_value()) return "--text goes with encode";
  } else if (o.action == "encode") {
    if (o.inputs.empty() == !o.text.has_value()) return "encode needs text files or --text, one";
  } else {
    if (o.inputs.size() != 1) return "decode needs one token file";
    if (o.text.has_value()) return "--text goes with encode";
  }
  return "";
}

}  // namespace

int RunTokens(const TokensCommandOptions& o, std::ostream& out, std::ostream& err) {
  if (const std::string usage = UsageError(o); !usage.empty()) {
    err << "stagectl tokens: " << usage << "\n";
    return kTokensUsage;
  }
  absl::Status done = o.action == "build"    ? Build(o, out)
                      : o.action == "encode" ? Encode(o, out)
                                             : Decode(o, out);
  if (!done.ok()) {
    err << "stagectl tokens " << o.action << ": " << done.message() << "\n";
    return 1;
  }
  return 0;
}

absl::StatusOr<text::CharVocabulary> ReadVocabularyFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string json, ReadWhole(path, "the vocabulary"));
  return text::CharVocabulary::Parse(json, path);
}

}  // namespace stagecoach::client
