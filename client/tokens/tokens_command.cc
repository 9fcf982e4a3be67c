// `stagectl tokens` (tokens_command.h).
#include "client/tokens/tokens_command.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <sstream>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/tokens/file_io.h"
#include "client/tokens/sentencepiece_process.h"
#include "common/text/char_vocabulary.h"
#include "common/util/byte_size.h"
#include "common/util/status_macros.h"

namespace stagecoach::client {
namespace {

// The exit code of a usage error (stagectl_main.cc).
constexpr int kTokensUsage = 2;

constexpr char kSentencePieceTool[] = "stagecoach-sentencepiece";

// The input files, in order.
absl::StatusOr<std::vector<text::Document>> ReadDocuments(const std::vector<std::string>& paths) {
  std::vector<text::Document> docs;
  for (const std::string& path : paths) {
    ASSIGN_OR_RETURN(std::string contents, ReadWholeFile(path, "text file"));
    docs.push_back({path, std::move(contents)});
  }
  return docs;
}

absl::Status Build(const TokensCommandOptions& o, std::ostream& out) {
  ASSIGN_OR_RETURN(std::vector<text::Document> docs, ReadDocuments(o.inputs));
  ASSIGN_OR_RETURN(text::CharVocabulary vocab, text::CharVocabulary::FromDocuments(docs));
  ASSIGN_OR_RETURN(std::vector<uint16_t> tokens, vocab.Encode(docs));
  RETURN_IF_ERROR(WriteWholeFile(o.vocab_path, vocab.ToJson(), "vocabulary"));
  RETURN_IF_ERROR(WriteWholeFile(o.out_path, text::TokenBytes(tokens), "token file"));
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
  RETURN_IF_ERROR(WriteWholeFile(o.out_path, text::TokenBytes(tokens), "token file"));
  out << tokens.size() << " tokens: wrote " << o.out_path << "\n";
  return absl::OkStatus();
}

absl::Status Decode(const TokensCommandOptions& o, std::ostream& out) {
  ASSIGN_OR_RETURN(text::CharVocabulary vocab, ReadVocabularyFile(o.vocab_path));
  const std::string& path = o.inputs[0];
  ASSIGN_OR_RETURN(std::string bytes, ReadWholeFile(path, "token file"));
  ASSIGN_OR_RETURN(std::vector<uint16_t> tokens, text::ParseTokenBytes(bytes, path));
  ASSIGN_OR_RETURN(std::string decoded, vocab.Decode(tokens, path));
  if (o.out_path.empty()) {
    out << decoded;
    return absl::OkStatus();
  }
  return WriteWholeFile(o.out_path, decoded, "text file");
}

// The usage error of `o`, or "" when the arguments fit the action.
std::string UsageError(const TokensCommandOptions& o) {
  if (o.action != "build" && o.action != "encode" && o.action != "decode") {
    return absl::StrCat("'", o.action, "' is not an action: build, encode or decode");
  }
  if (o.vocab_path.empty()) return "--vocab FILE (or --tokenizer FILE) is required";
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
  if (UsesSentencePiece(o)) {
    err << "stagectl tokens: --tokenizer and train run in stagecoach-sentencepiece "
           "(ExecSentencePiece)\n";
    return kTokensUsage;
  }
  if (o.bos || o.eos || o.vocab_size > 0 || o.dtype != "uint16") {
    err << "stagectl tokens: --bos, --eos, --vocab-size and --dtype go with --tokenizer\n";
    return kTokensUsage;
  }
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

bool UsesSentencePiece(const TokensCommandOptions& o) {
  return !o.tokenizer_path.empty() || o.action == "train";
}

int ExecSentencePiece(const TokensCommandOptions& o, std::ostream& err) {
  if (!o.vocab_path.empty()) {
    err << "stagectl tokens: --vocab (a character vocabulary) and --tokenizer (SentencePiece) are "
           "two kinds of tokenizer; give one\n";
    return kTokensUsage;
  }
  std::vector<std::string> args = {kSentencePieceTool, o.action};
  args.insert(args.end(), o.inputs.begin(), o.inputs.end());
  auto option = [&](const char* name, const std::string& value) {
    if (!value.empty()) args.insert(args.end(), {name, value});
  };
  if (o.text.has_value()) args.insert(args.end(), {"--text", *o.text});
  option("--tokenizer", o.tokenizer_path);
  if (o.vocab_size != 0) option("--vocab-size", absl::StrCat(o.vocab_size));
  if (o.bos) args.push_back("--bos");
  if (o.eos) args.push_back("--eos");
  option("--dtype", o.dtype);
  option("--out", o.out_path);
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::string tool = SentencePieceToolPath();
  if (tool.find('/') != std::string::npos) {
    ::execv(tool.c_str(), argv.data());
  } else {
    ::execvp(tool.c_str(), argv.data());
  }
  err << "stagectl tokens: cannot run " << kSentencePieceTool << " (beside stagectl or on PATH): "
      << std::strerror(errno) << "\n";
  return 1;
}

absl::StatusOr<text::CharVocabulary> ReadVocabularyFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string json, ReadWholeFile(path, "the vocabulary"));
  return text::CharVocabulary::Parse(json, path);
}

}  // namespace stagecoach::client
