// UTF-8 checks for text that crosses the wire as a protobuf `string` (which must be valid UTF-8:
// a request carrying anything else is not even parsed by the server).
#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace stagecoach::util {

// The offset of the first byte of `text` that does not start or continue a valid UTF-8
// sequence (overlong forms, surrogates and code points past U+10FFFF are invalid); nullopt when
// all of it is valid.
std::optional<size_t> FirstInvalidUtf8(absl::string_view text);

// "line L, column C (byte B): 0xNN" for the byte at `offset` of `text` (lines and columns from
// 1, columns in bytes), for error messages.
std::string DescribeByteAt(absl::string_view text, size_t offset);

// The longest prefix of `text` of at most `max_bytes` that does not end inside a UTF-8 sequence.
absl::string_view Utf8Prefix(absl::string_view text, size_t max_bytes);

}  // namespace stagecoach::util
