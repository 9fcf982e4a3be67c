#include "common/rpc/auth.h"

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace stagecoach::rpc {

absl::Status ValidateToken(absl::string_view token, absl::string_view where) {
  if (token.empty()) return absl::InvalidArgumentError(absl::StrCat(where, ": the token is empty"));
  if (token.size() > kMaxTokenBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": the token is longer than ", kMaxTokenBytes, " bytes"));
  }
  for (char c : token) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(
          absl::StrCat(where,
                       ": the token must be printable ASCII without spaces (it travels as gRPC "
                       "metadata)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path, absl::string_view flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": cannot read '", path, "' (missing or not readable)"));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad())
    return absl::InvalidArgumentError(absl::StrCat(flag, ": error reading '", path, "'"));
  std::string token(absl::StripAsciiWhitespace(text.str()));
  if (absl::Status s = ValidateToken(token, absl::StrCat(flag, " '", path, "'")); !s.ok()) return s;
  return token;
}

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  volatile unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i]) ^ static_cast<unsigned char>(b[i]);
  }
  return diff == 0;
}

absl::Status CheckBearer(const grpc::ServerContext& ctx, const std::string& expected,
                         absl::string_view what) {
  const auto& metadata = ctx.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) {
    return absl::UnauthenticatedError(absl::StrCat(what, " (no authorization metadata)"));
  }
  absl::string_view value(it->second.data(), it->second.size());
  constexpr absl::string_view kScheme = "Bearer ";
  if (!absl::StartsWithIgnoreCase(value, kScheme)) {
    return absl::UnauthenticatedError(
        absl::StrCat(what, " (authorization metadata is not \"Bearer <token>\")"));
  }
  value.remove_prefix(kScheme.size());
  if (expected.empty() || !ConstantTimeEquals(value, expected)) {
    return absl::UnauthenticatedError(absl::StrCat(what, " (the bearer token does not match)"));
  }
  return absl::OkStatus();
}

}  // namespace stagecoach::rpc
