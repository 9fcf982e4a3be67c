#include "common/rpc/address.h"

#include <unistd.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace stagecoach::rpc {

std::string HostPort::ToString() const {
  if (host.find(':') != std::string::npos) return absl::StrCat("[", host, "]:", port);
  return absl::StrCat(host, ":", port);
}

absl::StatusOr<HostPort> ParseHostPort(absl::string_view text, absl::string_view what) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": invalid address '", text, "': ", why, " (expected HOST:PORT)"));
  };
  HostPort out;
  absl::string_view port_text;
  if (!text.empty() && text.front() == '[') {
    size_t close = text.find(']');
    if (close == absl::string_view::npos) return bad("unbalanced '['");
    out.host = std::string(text.substr(1, close - 1));
    if (close + 1 >= text.size() || text[close + 1] != ':') return bad("missing port");
    port_text = text.substr(close + 2);
  } else {
    size_t colon = text.rfind(':');
    if (colon == absl::string_view::npos) return bad("missing port");
    out.host = std::string(text.substr(0, colon));
    port_text = text.substr(colon + 1);
    if (out.host.find(':') != std::string::npos) return bad("write IPv6 hosts as [addr]:port");
  }
  if (out.host.empty()) return bad("missing host");
  if (!absl::SimpleAtoi(port_text, &out.port) || out.port < 0 || out.port > 65535) {
    return bad(absl::StrCat("port '", port_text, "' is not a number in 0..65535"));
  }
  return out;
}

bool IsWildcardHost(absl::string_view host) {
  return host.empty() || host == "0.0.0.0" || host == "::" || host == "[::]";
}

std::string LocalHostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

}  // namespace stagecoach::rpc
