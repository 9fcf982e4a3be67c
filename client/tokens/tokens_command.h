// `stagectl tokens`: text to the tokens a built-in decoder trains on, and back, with a character
// vocabulary (common/text/char_vocabulary.h) or, with --tokenizer, a SentencePiece model
// (sentencepiece_tokens.h says what each action then does). Works without a cluster.
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
#include "client/tokens/tokens_options.h"
#include "common/text/char_vocabulary.h"

namespace stagecoach::client {


// ExecSentencePiece: with --tokenizer, or for train, stagectl becomes stagecoach-sentencepiece
// (sentencepiece_tokens.h) with the same options: Debian's libsentencepiece carries its own
// protobuf 3.14, which cannot share a process with the protobuf 3.21 stagectl's gRPC uses. Its
// path: beside stagectl's executable, else on PATH. Returns only when the exec fails (1, the
// reason on `err`).
bool UsesSentencePiece(const TokensCommandOptions& options);
int ExecSentencePiece(const TokensCommandOptions& options, std::ostream& err);

// Runs the command with a character vocabulary: results to `out` (or the --out file), errors to
// `err`. Returns 0 on success,
// 1 when a file cannot be read or written or its contents are refused, 2 for a usage error.
int RunTokens(const TokensCommandOptions& options, std::ostream& out, std::ostream& err);

// The vocabulary file at `path` (CharVocabulary::Parse's errors; NOT_FOUND-like errors name the
// file when it cannot be read).
absl::StatusOr<text::CharVocabulary> ReadVocabularyFile(const std::string& path);

}  // namespace stagecoach::client
