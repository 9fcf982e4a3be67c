// Client-side gRPC plumbing shared by stagectl, the coordinator and the workers.
#pragma once

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>

#include <memory>
#include <string>

#include "absl/time/time.h"

namespace grpc {
class ChannelCredentials;
}  // namespace grpc

namespace stagecoach::rpc {

// Clients ping an idle connection this often (and give up after kKeepaliveTimeout more) so
// that a long call, such as a WatchJob stream, notices a peer that vanished.
inline constexpr absl::Duration kKeepaliveTime = absl::Seconds(20);
inline constexpr absl::Duration kKeepaliveTimeout = absl::Seconds(10);

// Largest gRPC message any of our services sends or accepts (specs, action lists, reports).
inline constexpr int kMaxMessageBytes = 64 << 20;

// How a channel is secured (common/rpc/tls.h builds the credentials from certificate files).
struct ChannelSecurity {
  // Transport credentials; null: plaintext.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // When set, the name the server's certificate must carry instead of the address's host.
  std::string server_name;
  // When set, every call on the channel carries "authorization: Bearer <bearer_token>"
  // metadata (stagectl's client token, a worker's token for the coordinator).
  std::string bearer_token;
};

// A channel to `address` (host:port) with our message size limits and keepalive, secured as
// `security` says (plaintext and no token by default). Connection is lazy.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address,
                                           const ChannelSecurity& security = {});

// Sets `ctx`'s deadline to now + `timeout`. Every client call sets one.
void SetDeadline(grpc::ClientContext* ctx, absl::Duration timeout);

}  // namespace stagecoach::rpc
