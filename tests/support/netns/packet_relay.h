// A userspace Ethernet switch with per-port latency, loss and cuts, for hosts in network
// namespaces on kernels without netem (hosts.h starts it when a link asks for delay or loss, or
// when links must be cut by dropping their packets).
//
// Each port is a network interface (the switch's end of a host's veth pair) in the switch's
// namespace. The relay reads every frame that arrives on a port with an AF_PACKET socket, learns
// the sender's MAC address, and forwards the frame to the port that address was learned on
// (every other port for broadcast, multicast and unknown addresses) after the source port's delay
// plus the destination port's delay, unless it drops it: with each port's loss probability, or
// always while either port is cut. A frame that a port cannot take (its link down, its queue
// full) is dropped, as a switch would.
//
// The ports and the hosts' ends must have their offloads off (no TSO/GSO/GRO, no checksum
// offload; hosts.h does this), so that each frame read is a wire frame of at most the MTU with
// its checksums filled in; a larger one is counted as dropped.
//
// Thread-safe: SetShape and counters may be called from any thread while the relay forwards on
// a thread of its own.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace stagecoach::testing::netns {

// What a port does to the frames that pass through it (in either direction).
struct PortShape {
  absl::Duration delay = absl::ZeroDuration();  // added to each frame, each way
  double loss = 0;                              // probability that a frame is dropped, each way
  bool cut = false;                             // every frame dropped
};

struct RelayCounters {
  int64_t forwarded = 0;
  int64_t lost = 0;           // dropped by a port's loss probability
  int64_t cut = 0;            // dropped because a port was cut
  int64_t undeliverable = 0;  // the destination port refused it, or it exceeded the MTU
};

class PacketRelay {
 public:
  // Opens a socket on each of `ports` (interface names in the network namespace at
  // `netns_path`, e.g. /run/netns/NAME; empty: the caller's) and starts forwarding. `seed` makes
  // the losses repeatable for a given sequence of frames.
  static absl::StatusOr<std::unique_ptr<PacketRelay>> Start(const std::string& netns_path,
                                                            const std::vector<std::string>& ports,
                                                            uint64_t seed);
  // Stops forwarding (frames still delayed are dropped) and closes the sockets.
  ~PacketRelay();
  PacketRelay(const PacketRelay&) = delete;
  PacketRelay& operator=(const PacketRelay&) = delete;

  // NOT_FOUND when `port` is not one of the relay's; INVALID_ARGUMENT for a negative delay or a
  // loss outside [0, 1].
  absl::Status SetShape(const std::string& port, const PortShape& shape);
  RelayCounters counters() const;

  struct State;

 private:
  explicit PacketRelay(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace stagecoach::testing::netns
