// CharVocabulary (char_vocabulary.h): characters of UTF-8 text to uint16 token ids and back.
#include "common/text/char_vocabulary.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/util/status_macros.h"
#include "common/util/utf8.h"
#include "nlohmann/json.hpp"

namespace stagecoach::text {
namespace {

constexpr char kFormat[] = "stagecoach-chars";
constexpr int kVersion = 1;

// The byte length of the character starting at `lead` in valid UTF-8.
size_t CharLength(char lead) {
  const auto b = static_cast<uint8_t>(lead);
  if (b < 0x80) return 1;
  if (b < 0xE0) return 2;
  if (b < 0xF0) return 3;
  return 4;
}

// "U+XXXX" for one valid UTF-8 character, and the character itself when it prints.
std::string Describe(absl::string_view ch) {
  uint32_t cp = static_cast<uint8_t>(ch[0]);
  if (ch.size() > 1) {
    cp &= 0x7F >> ch.size();
    for (size_t k = 1; k < ch.size(); ++k) cp = (cp << 6) | (static_cast<uint8_t>(ch[k]) & 0x3F);
  }
  std::string out = absl::StrFormat("U+%04X", cp);
  if (cp >= 0x20 && cp != 0x7F) absl::StrAppend(&out, " '", ch, "'");
  return out;
}

// "line L, column C" of byte `offset` of `text` (columns in characters).
std::string Position(absl::string_view text, size_t offset) {
  size_t line = 1, column = 1;
  for (size_t i = 0; i < offset;) {
    if (text[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
    i += CharLength(text[i]);
  }
  return absl::StrCat("line ", line, ", column ", column);
}

absl::Status CheckUtf8(absl::string_view text, absl::string_view origin) {
  if (auto bad = util::FirstInvalidUtf8(text); bad.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat(origin, ": not UTF-8 text: ", util::DescribeByteAt(text, *bad),
                     " does not start or continue a character"));
  }
  return absl::OkStatus();
}

absl::Status TooMany(absl::string_view origin, size_t count) {
  return absl::InvalidArgumentError(absl::StrCat(origin, ": ", count,
                                                 " distinct characters; a vocabulary holds at "
                                                 "most ",
                                                 kMaxVocabularyChars, " (token ids are uint16)"));
}

}  // namespace

CharVocabulary::CharVocabulary(std::vector<std::string> chars) : chars_(std::move(chars)) {
  for (size_t i = 0; i < chars_.size(); ++i) ids_.emplace(chars_[i], static_cast<uint16_t>(i));
}

absl::StatusOr<CharVocabulary> CharVocabulary::FromText(absl::string_view text,
                                                        absl::string_view origin) {
  return FromDocuments({Document{std::string(origin), std::string(text)}});
}

absl::StatusOr<CharVocabulary> CharVocabulary::FromDocuments(absl::Span<const Document> documents) {
  // Bytewise order of UTF-8 sequences is code point order.
  std::set<std::string> chars;
  for (const Document& doc : documents) {
    RETURN_IF_ERROR(CheckUtf8(doc.text, doc.origin));
    for (size_t i = 0; i < doc.text.size();) {
      const size_t n = CharLength(doc.text[i]);
      chars.emplace(doc.text.substr(i, n));
      if (chars.size() > static_cast<size_t>(kMaxVocabularyChars)) {
        return TooMany(doc.origin, chars.size());
      }
      i += n;
    }
  }
  if (chars.empty()) {
    std::vector<std::string> origins;
    for (const Document& doc : documents) origins.push_back(doc.origin);
    return absl::InvalidArgumentError(
        absl::StrCat(absl::StrJoin(origins, " + "), ": no text to build a vocabulary of"));
  }
  return CharVocabulary(std::vector<std::string>(chars.begin(), chars.end()));
}

absl::StatusOr<CharVocabulary> CharVocabulary::Parse(absl::string_view json,
                                                     absl::string_view origin) {
  const nlohmann::json doc = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(origin, ": not a vocabulary file (a JSON object with \"format\": \"", kFormat,
                     "\" and \"chars\")"));
  }
  const auto format = doc.find("format");
  if (format == doc.end() || !format->is_string() || *format != kFormat) {
    return absl::InvalidArgumentError(
        absl::StrCat(origin, ": \"format\" is not \"", kFormat, "\": not a character vocabulary"));
  }
  const auto version = doc.find("version");
  if (version == doc.end() || !version->is_number_integer() || *version != kVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat(origin, ": \"version\" must be ", kVersion, " (this stagectl reads only it)"));
  }
  const auto list = doc.find("chars");
  if (list == doc.end() || !list->is_array() || list->empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(origin, ": \"chars\" must be a non-empty list of characters"));
  }
  if (list->size() > static_cast<size_t>(kMaxVocabularyChars)) return TooMany(origin, list->size());
  std::vector<std::string> chars;
  std::set<std::string> seen;
  for (size_t i = 0; i < list->size(); ++i) {
    const nlohmann::json& entry = (*list)[i];
    const std::string where = absl::StrCat(origin, ": chars[", i, "]");
    if (!entry.is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(where, " is not a string"));
    }
    std::string ch = entry.get<std::string>();
    RETURN_IF_ERROR(CheckUtf8(ch, where));
    if (ch.empty() || CharLength(ch[0]) != ch.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " is \"", ch, "\": each entry is exactly one character"));
    }
    if (!seen.insert(ch).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " is ", Describe(ch), ", which is listed before"));
    }
    chars.push_back(std::move(ch));
  }
  return CharVocabulary(std::move(chars));
}

std::string CharVocabulary::ToJson() const {
  std::string out =
      absl::StrCat("{\"format\": \"", kFormat, "\", \"version\": ", kVersion, ", \"chars\": [\n");
  for (size_t i = 0; i < chars_.size(); ++i) {
    absl::StrAppend(&out, "  ", nlohmann::json(chars_[i]).dump(), i + 1 < chars_.size() ? "," : "",
                    "\n");
  }
  absl::StrAppend(&out, "]}\n");
  return out;
}

absl::StatusOr<std::vector<uint16_t>> CharVocabulary::Encode(absl::string_view text,
                                                             absl::string_view origin) const {
  RETURN_IF_ERROR(CheckUtf8(text, origin));
  std::vector<uint16_t> tokens;
  tokens.reserve(text.size());
  std::string ch;
  for (size_t i = 0; i < text.size();) {
    const size_t n = CharLength(text[i]);
    ch.assign(text.data() + i, n);
    const auto it = ids_.find(ch);
    if (it == ids_.end()) {
      return absl::InvalidArgumentError(absl::StrCat(origin, ": ", Position(text, i), ": ",
                                                     Describe(ch), " is not in the vocabulary (",
                                                     chars_.size(), " characters)"));
    }
    tokens.push_back(it->second);
    i += n;
  }
  return tokens;
}

absl::StatusOr<std::vector<uint16_t>> CharVocabulary::Encode(
    absl::Span<const Document> documents) const {
  std::vector<uint16_t> tokens;
  for (const Document& doc : documents) {
    ASSIGN_OR_RETURN(std::vector<uint16_t> part, Encode(doc.text, doc.origin));
    tokens.insert(tokens.end(), part.begin(), part.end());
  }
  return tokens;
}

absl::StatusOr<std::string> CharVocabulary::Decode(absl::Span<const uint16_t> tokens,
                                                   absl::string_view origin) const {
  std::string out;
  out.reserve(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] >= chars_.size()) {
      return absl::InvalidArgumentError(absl::StrCat(origin, ": token ", tokens[i], " at position ",
                                                     i, " is not below the vocabulary's ",
                                                     chars_.size(), " characters"));
    }
    out += chars_[tokens[i]];
  }
  return out;
}

std::string TokenBytes(absl::Span<const uint16_t> tokens) {
  std::string out(tokens.size() * 2, '\0');
  for (size_t i = 0; i < tokens.size(); ++i) {
    out[2 * i] = static_cast<char>(tokens[i] & 0xFF);
    out[2 * i + 1] = static_cast<char>(tokens[i] >> 8);
  }
  return out;
}

absl::StatusOr<std::vector<uint16_t>> ParseTokenBytes(absl::string_view bytes,
                                                      absl::string_view origin) {
  if (bytes.size() % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(origin, ": ", bytes.size(),
                     " bytes, an odd number: not a token file (two bytes per token)"));
  }
  std::vector<uint16_t> tokens(bytes.size() / 2);
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<uint16_t>(static_cast<uint8_t>(bytes[2 * i]) |
                                      (static_cast<uint8_t>(bytes[2 * i + 1]) << 8));
  }
  return tokens;
}

}  // namespace stagecoach::text
