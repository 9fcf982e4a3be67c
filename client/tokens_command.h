// `stagectl tokens`: text to the tokens a built-in GPT trains on, and back, with a character
// vocabulary (common/text/char_vocabulary.h). Works without a cluster.
//   build FILE... --vocab V --out T   the characters of the files (read in order, joined as they
//                                     are) become the vocabulary V; their text, tokens in T
//   encode FILE... | --text S --vocab V [--out T]
//                                     text to tokens with an existing vocabulary (T, or the ids
//                                     on stdout, space-separated)
//   decode T --vocab V [--out FILE]   tokens to text (FILE, or stdout)
#pragma once

#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/text/char_vocabulary.h"

namespace stagecoach::client {

struct TokensCommandOptions {
  std::string action;               // build, encode or decode
  std::vector<std::string> inputs;  // text files (build, encode) or one token file (decode)
  std::optional<std::string> text;  // encode: this text instead of files
  std::string vocab_path;
  std::string out_path;  // required for build
};

// Runs the command: results to `out` (or the --out file), errors to `err`. Returns 0 on success,
// 1 when a file cannot be read or written or its contents are refused, 2 for a usage error.
int RunTokens(const TokensCommandOptions& options, std::ostream& out, std::ostream& err);

// The vocabulary file at `path` (CharVocabulary::Parse's errors; NOT_FOUND-like errors name the
// file when it cannot be read).
absl::StatusOr<text::CharVocabulary> ReadVocabularyFile(const std::string& path);

}  // namespace stagecoach::client
