// A character vocabulary: how text becomes the tokens a built-in GPT trains on, and its tokens
// text again. Every distinct character (Unicode code point, UTF-8 encoded) of a text gets a token
// id, in code point order, so that id 0 is the smallest character. nanoGPT's character-level
// Shakespeare does the same; a vocabulary of a few dozen to a few hundred characters keeps the
// model's embedding and its output layer small.
//
// Files.
//  - The vocabulary, as JSON: {"format": "stagecoach-chars", "version": 1, "chars": [...]}, where
//    token i is chars[i], each a string of exactly one character.
//  - Tokens, as data.kind: tokens reads them (docs/spec.md): a flat little-endian uint16 file.
// At most 65,536 characters, so that every id fits a uint16.
//
// Errors name the origin (a file name, "--text") and, for text, the line and column of the
// offending byte or character; for tokens, the position of the offending token.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace stagecoach::text {

// The most characters a vocabulary may hold: token ids are uint16.
inline constexpr int kMaxVocabularyChars = 65536;

// A text and what errors call it (a file name, "--text").
struct Document {
  std::string origin;
  std::string text;
};

class CharVocabulary {
 public:
  // The characters of `text`. INVALID_ARGUMENT "<origin>: ..." when the text is empty, is not
  // valid UTF-8 (naming the line and column of the first bad byte) or has more than
  // kMaxVocabularyChars distinct characters.
  static absl::StatusOr<CharVocabulary> FromText(absl::string_view text, absl::string_view origin);

  // The characters of all `documents`, each checked apart so that an error names its origin
  // and the line in it; empty only when every document is.
  static absl::StatusOr<CharVocabulary> FromDocuments(absl::Span<const Document> documents);

  // A vocabulary file's contents (the JSON above). INVALID_ARGUMENT "<origin>: ..." naming what
  // is wrong: not JSON, another format or version, an entry that is not one character, a
  // character listed twice, too many or none.
  static absl::StatusOr<CharVocabulary> Parse(absl::string_view json, absl::string_view origin);

  // The vocabulary file's contents, one character per line for a reader.
  std::string ToJson() const;

  int size() const { return static_cast<int>(chars_.size()); }
  // Token `id`'s character (UTF-8); id < size().
  const std::string& Char(int id) const { return chars_[id]; }

  // The tokens of `text`. INVALID_ARGUMENT "<origin>: ..." for bytes that are not UTF-8, or for
  // a character the vocabulary lacks (naming it as U+XXXX, with its line and column).
  absl::StatusOr<std::vector<uint16_t>> Encode(absl::string_view text,
                                               absl::string_view origin) const;

  // The tokens of `documents`, one after another.
  absl::StatusOr<std::vector<uint16_t>> Encode(absl::Span<const Document> documents) const;

  // The text of `tokens`. INVALID_ARGUMENT "<origin>: token T at position P is not below the
  // vocabulary's N characters".
  absl::StatusOr<std::string> Decode(absl::Span<const uint16_t> tokens,
                                     absl::string_view origin) const;

 private:
  explicit CharVocabulary(std::vector<std::string> chars);

  std::vector<std::string> chars_;
  std::unordered_map<std::string, uint16_t> ids_;
};

// Tokens as a data.kind: tokens file holds them: each id as two bytes, little-endian.
std::string TokenBytes(absl::Span<const uint16_t> tokens);

// The tokens in `bytes`, a token file's contents. INVALID_ARGUMENT "<origin>: ..." when its
// size is odd.
absl::StatusOr<std::vector<uint16_t>> ParseTokenBytes(absl::string_view bytes,
                                                      absl::string_view origin);

}  // namespace stagecoach::text
