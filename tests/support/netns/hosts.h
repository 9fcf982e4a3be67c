// Hosts as network namespaces, so that multi-process tests run across a network with real
// links that can be slowed, made lossy and cut, instead of loopback.
//
// NetnsHosts::Create makes N hosts. Each is a network namespace, "stagecoach-<pid>-<name>", with
// its loopback and one link, eth0 (a veth pair), to a switch namespace of its own, and the
// address 10.77.0.<2+i>/24; a daemon started behind Launcher(i) runs in that namespace under the
// host name `name` (a UTS namespace of its own). The switch is the kernel's bridge; when a link
// needs latency or loss, or a cut that drops packets, and the kernel has no netem, it is a
// PacketRelay (packet_relay.h) running in this process instead. latency_by() says which ran.
//
// With `attach_self`, this process gets a link to the switch too (10.77.0.1), so that its own
// gRPC clients and the commands it runs reach the hosts' daemons. That needs this process in a
// network namespace of its own (EnterOwnNetworkNamespace, first thing in main, before any thread
// exists): addresses and links are only ever made in namespaces made here, never in the machine's.
//
// Links: a link's shape is its bandwidth (tbf, on both ends), and the latency and loss each
// frame meets crossing it, each way (netem on both ends where the kernel has it, else the
// relay): a frame from host A to host B crosses A's link and B's link, so 1 ms per link makes
// 2 ms between hosts. Cut(i, kLinkDown) takes the switch's end of the link down (the host sees
// no carrier); Cut(i, kDrop) drops every frame on the link while it stays up (a partition the
// host cannot see); Heal(i) restores either.
//
// The destructor kills what still runs in the hosts and deletes every namespace it made (their
// links and the relay go with them); Create first deletes namespaces left behind by a process
// that died. Needs root, iproute2 (ip, tc), util-linux (unshare) and ethtool for the relay's
// links; Available() says what is missing. Not thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tests/support/netns/packet_relay.h"

namespace stagecoach::testing::netns {

struct LinkShape {
  int64_t rate_bits_per_second = 0;             // 0: unlimited
  absl::Duration delay = absl::ZeroDuration();  // each way
  double loss = 0;                              // probability a frame is dropped, each way
};

struct HostsOptions {
  std::vector<std::string> names;  // host names: letters, digits and '-', at most 20 characters
  LinkShape shape;                 // every link's at the start
  bool attach_self = true;
  // The switch can drop packets (Cut(i, kDrop)) even when no link asks for latency or loss.
  bool droppable = false;
  uint64_t seed = 1;  // the relay's losses
};

enum class CutKind { kLinkDown, kDrop };

class NetnsHosts {
 public:
  // OK where hosts can be made here; otherwise why not (not root, a tool missing).
  static absl::Status Available();
  // Moves this process into a network namespace of its own (with its loopback up). Call it before
  // any thread exists: threads started earlier stay in the namespace they had.
  static absl::Status EnterOwnNetworkNamespace();
  // After EnterOwnNetworkNamespace: OK when a named namespace and a veth pair can be made here
  // (made and deleted again), otherwise what refused.
  static absl::Status Probe();

  static absl::StatusOr<std::unique_ptr<NetnsHosts>> Create(const HostsOptions& options);
  ~NetnsHosts();
  NetnsHosts(const NetnsHosts&) = delete;
  NetnsHosts& operator=(const NetnsHosts&) = delete;

  int size() const { return static_cast<int>(hosts_.size()); }
  const std::string& name(int host) const { return hosts_[host].name; }
  const std::string& address(int host) const { return hosts_[host].address; }
  const std::string& netns(int host) const { return hosts_[host].netns; }
  static std::string SelfAddress() { return "10.77.0.1"; }

  // The command line before a daemon's that runs it in the host's namespace under its name
  // (exec all the way, so the daemon keeps the launcher's pid and its signals).
  std::vector<std::string> Launcher(int host) const;

  absl::Status Shape(int host, const LinkShape& shape);
  absl::Status Cut(int host, CutKind kind);
  absl::Status Heal(int host);

  // "netem", "relay" (this process's PacketRelay) or "none" (no link asked for latency or loss).
  std::string latency_by() const;
  // The relay's counters (all zero without one).
  RelayCounters relay_counters() const;

 private:
  struct Host {
    std::string name, netns, address, port;  // port: the link's end in the switch
    LinkShape shape;
    bool dropped = false;
  };
  NetnsHosts() = default;
  absl::Status Build(const HostsOptions& options);
  absl::Status AddLink(const std::string& netns, const std::string& inner, const std::string& port,
                       const std::string& address);
  absl::Status ApplyShape(const Host& host);

  std::string prefix_;  // "stagecoach-<pid>-"
  std::string switch_netns_;
  std::vector<Host> hosts_;
  std::vector<std::string> made_;  // namespaces made, to delete
  bool netem_ = false;
  bool relay_mode_ = false;  // the relay switches, not the kernel's bridge
  bool self_attached_ = false;
  std::unique_ptr<PacketRelay> relay_;
};

}  // namespace stagecoach::testing::netns
