// host:port addresses as the command lines and the registry write them.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace stagecoach::rpc {

struct HostPort {
  std::string host;  // name, IPv4 literal or IPv6 literal without brackets
  int port = 0;      // 0..65535; 0 asks a server to pick a free port

  // "host:port", bracketing IPv6 literals.
  std::string ToString() const;
};

// Parses "host:port" or "[v6]:port". INVALID_ARGUMENT naming `what` (e.g. "--listen") on a
// missing host or port, or a port outside 0..65535.
absl::StatusOr<HostPort> ParseHostPort(absl::string_view text, absl::string_view what);

// True for 0.0.0.0, :: and the empty host: addresses that mean "every interface".
bool IsWildcardHost(absl::string_view host);

// The machine's host name (what peers should dial when a server listens on every interface).
std::string LocalHostName();

}  // namespace stagecoach::rpc
