// The Gloo backend of Transport (factory.h): point-to-point transfers with gloo's TCP transport,
// unbound buffers on a gloo context of its own with one connection per pair of ranks.
//
// What this Gloo (Debian libgloo 0.0~git20220518) does, found by experiment, and what it means
// for the design:
//  - Byte counts: gloo pairs a send with a receive by (peer, slot) alone. A send larger than
//    its receive trips a GLOO_ENFORCE on gloo's event-loop thread, where nothing catches it:
//    std::terminate, the process aborts. A smaller send completes the receive as if it were
//    whole: silent truncation. Hence the protocol below.
//  - Timeouts: when waitSend/waitRecv times out, gloo closes every connection of the context
//    ("Application timeout caused pair closure"): one late transfer would kill the transport.
//    So no gloo wait here has a timeout; deadlines are enforced by interrupting waits.
//  - Peer death: a send or receive posted on the connection to a peer that died fails within a
//    millisecond with gloo::IoException "Connection closed by peer"; posting on a failed
//    connection throws at once. A receive from any rank is not woken, so this file never uses
//    one.
//  - Interrupts: abortWaitSend/abortWaitRecv wake the buffer's waiter. The flag stays set until
//    a wait consumes it, and then wins even over a completed transfer (the next wait returns
//    the completion). closeConnections() resets every connection (peers read "Connection reset
//    by peer") but wakes no local waiter.
//  - Slots: the TCP transport accepts the whole uint64 range and reserves no bits; only gloo's
//    collectives carve prefixes out of it (gloo/types.h), and none run on this context.
//  - Closed connections: gloo writes with writev, which raises SIGPIPE when the peer has
//    closed the connection; unless ignored, that ends the whole process before the transfer
//    can fail. CreateGlooTransport ignores SIGPIPE process-wide (IgnoreSigpipe).
//  - Addresses: tcp::CreateDevice segfaults on a host name that does not resolve (it checks
//    getaddrinfo's result against -1 only), so it is only ever given numeric addresses.
//
//
// The Endpoint (endpoint.h) carries the transfers; this file makes the TCP device and the gloo
// context and wraps them.
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "common/process/signals.h"
#include "common/util/status_macros.h"
#include "worker/transport/adapter.h"
#include "worker/transport/gloo/endpoint.h"
#include "worker/transport/gloo/factory.h"
#include "worker/transport/gloo/store_adapter.h"

namespace stagecoach::transport {
namespace {

// The numeric addresses `hostname` resolves to, in getaddrinfo's order. gloo resolves names
// itself, but when a name does not resolve it reads an uninitialized result and crashes; given
// a numeric address, its lookup cannot fail.
absl::StatusOr<std::vector<std::string>> NumericAddresses(const std::string& hostname) {
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  const int rv = getaddrinfo(hostname.c_str(), nullptr, &hints, &result);
  if (rv != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("cannot resolve \"%s\": %s", hostname, gai_strerror(rv)));
  }
  std::vector<std::string> addresses;
  for (const addrinfo* info = result; info != nullptr; info = info->ai_next) {
    char host[NI_MAXHOST];
    if (getnameinfo(info->ai_addr, info->ai_addrlen, host, sizeof(host), nullptr, 0,
                    NI_NUMERICHOST) == 0) {
      addresses.emplace_back(host);
    }
  }
  freeaddrinfo(result);
  if (addresses.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat("\"%s\" has no address", hostname));
  }
  return addresses;
}

// A TCP device bound to the first address of `hostname` that can be bound.
absl::StatusOr<std::shared_ptr<::gloo::transport::Device>> CreateDevice(
    const std::string& hostname) {
  ASSIGN_OR_RETURN(const std::vector<std::string> addresses, NumericAddresses(hostname));
  std::string errors;
  for (const std::string& address : addresses) {
    try {
      ::gloo::transport::tcp::attr attr;
      attr.hostname = address;
      return ::gloo::transport::tcp::CreateDevice(attr);
    } catch (const std::exception& e) {
      absl::StrAppend(&errors, errors.empty() ? "" : "; ", address, ": ", e.what());
    }
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("cannot bind to an address of \"%s\": %s", hostname, errors));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Transport>> CreateGlooTransport(const GlooOptions& options,
                                                               RendezvousStore* store) {
  RETURN_IF_ERROR(ValidateConnectOptions("CreateGlooTransport", options, store));
  IgnoreSigpipe();

  absl::StatusOr<std::shared_ptr<::gloo::transport::Device>> device =
      CreateDevice(options.hostname);
  if (!device.ok()) {
    return absl::Status(device.status().code(),
                        absl::StrFormat("rank %d: %s", options.rank, device.status().message()));
  }

  auto context = std::make_shared<::gloo::rendezvous::Context>(options.rank, options.world_size);
  // gloo waits up to five times its context timeout for a TCP connection to open (and uses
  // the timeout for nothing else here: every wait on a buffer passes its own).
  const auto connect_wait = std::max(std::chrono::milliseconds(1),
                                     absl::ToChronoMilliseconds(options.connect_timeout) / 5);
  context->setTimeout(connect_wait);
  gloo_internal::StoreAdapter adapter(store, options.key_prefix,
                                      absl::Now() + options.connect_timeout);
  try {
    context->connectFullMesh(adapter, *device);
  } catch (const std::exception& e) {
    const absl::Status& store_error = adapter.status();
    if (!store_error.ok()) {
      return absl::Status(
          store_error.code(),
          absl::StrFormat("rank %d: gloo rendezvous (connect_timeout %s) failed: %s", options.rank,
                          absl::FormatDuration(options.connect_timeout), store_error.message()));
    }
    return absl::UnavailableError(absl::StrFormat(
        "rank %d: connecting to the other ranks failed: %s", options.rank, e.what()));
  }

  auto endpoint = std::make_shared<gloo_internal::Endpoint>(options.rank, options.world_size,
                                                            std::move(context));
  endpoint->Start();
  return std::unique_ptr<Transport>(
      new adapter::EndpointTransport<gloo_internal::Endpoint, gloo_internal::Op>(
          GlooDescriptor(), std::move(endpoint)));
}

}  // namespace stagecoach::transport
