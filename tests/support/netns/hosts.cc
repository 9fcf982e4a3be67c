#include "tests/support/netns/hosts.h"

#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/util/status_macros.h"
#include "tests/support/process.h"

namespace stagecoach::testing::netns {
namespace {

constexpr char kPrefix[] = "stagecoach-";
constexpr char kRunNetns[] = "/run/netns";
constexpr absl::Duration kCommandTimeout = absl::Seconds(20);

// The tool's path (ChildProcess and RunCommand exec a path), or empty.
std::string Tool(const std::string& name) {
  for (const char* dir : {"/usr/sbin", "/sbin", "/usr/bin", "/bin"}) {
    const std::string path = absl::StrCat(dir, "/", name);
    if (access(path.c_str(), X_OK) == 0) return path;
  }
  return "";
}

// Runs the tool (found by Tool) to completion: its stdout, or an error naming the command.
absl::StatusOr<std::string> Output(std::vector<std::string> argv) {
  const std::string tool = Tool(argv[0]);
  if (tool.empty()) return absl::NotFoundError(absl::StrCat("'", argv[0], "' is not installed"));
  argv[0] = tool;
  CommandResult r = RunCommand(argv, kCommandTimeout);
  if (r.exit_code != 0) {
    return absl::InternalError(absl::StrCat("'", absl::StrJoin(argv, " "), "' exited with ",
                                            r.exit_code, ": ", absl::StripAsciiWhitespace(r.err)));
  }
  return r.out;
}

absl::Status Run(std::vector<std::string> argv) { return Output(std::move(argv)).status(); }

// Kills what runs in the namespace, then deletes it.
void DeleteNamespace(const std::string& netns) {
  auto pids = Output({"ip", "netns", "pids", netns});
  if (pids.ok()) {
    for (absl::string_view line : absl::StrSplit(*pids, '\n', absl::SkipWhitespace())) {
      int pid = 0;
      if (absl::SimpleAtoi(line, &pid) && pid > 1) kill(pid, SIGKILL);
    }
  }
  (void)Run({"ip", "netns", "del", netns});
}

// Namespaces "stagecoach-<pid>-..." whose process is gone.
void DeleteStaleNamespaces() {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(kRunNetns, ec)) {
    const std::string name = entry.path().filename().string();
    absl::string_view rest = name;
    if (!absl::ConsumePrefix(&rest, kPrefix)) continue;
    int pid = 0;
    if (!absl::SimpleAtoi(rest.substr(0, rest.find('-')), &pid) || pid <= 0) continue;
    if (kill(pid, 0) == 0 || errno != ESRCH) continue;
    DeleteNamespace(name);
  }
}

// The network namespace this process had before EnterOwnNetworkNamespace (0: not entered).
ino_t entered_from = 0;

ino_t NetworkNamespace() {
  struct stat self {};
  return stat("/proc/self/ns/net", &self) == 0 ? self.st_ino : 0;
}

bool InOwnNetworkNamespace() { return entered_from != 0 && NetworkNamespace() != entered_from; }

std::string Micros(absl::Duration d) { return absl::StrCat(absl::ToInt64Microseconds(d), "us"); }

// tbf on `dev` in `netns` ("": this process's) at the shape's rate, or no root qdisc.
absl::Status RateLimit(const std::string& netns, const std::string& dev, int64_t bits) {
  std::vector<std::string> tc = {"tc"};
  if (!netns.empty()) tc.insert(tc.end(), {"-n", netns});
  if (bits <= 0) {
    std::vector<std::string> del = tc;
    del.insert(del.end(), {"qdisc", "del", "dev", dev, "root"});
    (void)Run(del);  // none there: nothing to do
    return absl::OkStatus();
  }
  // A burst of 10 ms at the rate (at least 32 KiB) keeps the rate on a 250 Hz kernel.
  const int64_t burst = std::max<int64_t>(32 * 1024, bits / 8 / 100);
  tc.insert(tc.end(),
            {"qdisc", "replace", "dev", dev, "root", "tbf", "rate", absl::StrCat(bits, "bit"),
             "burst", absl::StrCat(burst), "latency", "200ms"});
  return Run(tc);
}

absl::Status Netem(const std::string& netns, const std::string& dev, const LinkShape& s,
                   bool dropped) {
  std::vector<std::string> tc = {"tc",
                                 "-n",
                                 netns,
                                 "qdisc",
                                 "replace",
                                 "dev",
                                 dev,
                                 "root",
                                 "netem",
                                 "delay",
                                 Micros(s.delay),
                                 "loss",
                                 absl::StrCat(dropped ? 100.0 : s.loss * 100, "%")};
  if (s.rate_bits_per_second > 0) {
    tc.insert(tc.end(), {"rate", absl::StrCat(s.rate_bits_per_second, "bit")});
  }
  return Run(tc);
}

}  // namespace

absl::Status NetnsHosts::Available() {
  if (geteuid() != 0) return absl::PermissionDeniedError("network namespaces need root");
  for (const char* tool : {"ip", "tc", "unshare", "hostname", "ethtool"}) {
    if (Tool(tool).empty()) {
      return absl::NotFoundError(absl::StrCat("'", tool, "' is not installed (scripts/lib.sh)"));
    }
  }
  return absl::OkStatus();
}

absl::Status NetnsHosts::EnterOwnNetworkNamespace() {
  const ino_t before = NetworkNamespace();
  if (unshare(CLONE_NEWNET) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("unshare(CLONE_NEWNET): ", std::strerror(errno)));
  }
  entered_from = before;
  return Run({"ip", "link", "set", "lo", "up"});
}

absl::Status NetnsHosts::Probe() {
  const std::string probe = absl::StrCat(kPrefix, getpid(), "-probe");
  RETURN_IF_ERROR(Run({"ip", "netns", "add", probe}));
  absl::Status veth =
      Run({"ip", "link", "add", "sc-probe", "type", "veth", "peer", "name", "p0", "netns", probe});
  (void)Run({"ip", "link", "del", "sc-probe"});
  DeleteNamespace(probe);
  return veth;
}

absl::StatusOr<std::unique_ptr<NetnsHosts>> NetnsHosts::Create(const HostsOptions& options) {
  RETURN_IF_ERROR(Available());
  if (options.names.empty() || options.names.size() > 200) {
    return absl::InvalidArgumentError("between 1 and 200 hosts");
  }
  for (const std::string& n : options.names) {
    const bool valid = !n.empty() && n.size() <= 20 && std::all_of(n.begin(), n.end(), [](char c) {
      return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '-';
    });
    if (!valid) return absl::InvalidArgumentError(absl::StrCat("bad host name '", n, "'"));
  }
  if (options.attach_self && !InOwnNetworkNamespace()) {
    return absl::FailedPreconditionError(
        "attach_self needs this process in a network namespace of its own "
        "(NetnsHosts::EnterOwnNetworkNamespace first in main): no address is made in the "
        "machine's namespace");
  }
  DeleteStaleNamespaces();
  std::unique_ptr<NetnsHosts> hosts(new NetnsHosts());
  absl::Status built = hosts->Build(options);
  if (!built.ok()) return built;  // the destructor deletes what was made
  return hosts;
}

absl::Status NetnsHosts::AddLink(const std::string& netns, const std::string& inner,
                                 const std::string& port, const std::string& address) {
  std::vector<std::string> add = {"ip", "link", "add", inner};
  if (!netns.empty()) add.insert(add.end(), {"netns", netns});
  add.insert(add.end(), {"type", "veth", "peer", "name", port, "netns", switch_netns_});
  RETURN_IF_ERROR(Run(add));
  std::vector<std::string> ip = {"ip"};
  if (!netns.empty()) ip.insert(ip.end(), {"-n", netns});
  std::vector<std::string> addr = ip, up = ip;
  addr.insert(addr.end(), {"addr", "add", address + "/24", "dev", inner});
  up.insert(up.end(), {"link", "set", inner, "up"});
  RETURN_IF_ERROR(Run(addr));
  RETURN_IF_ERROR(Run(up));
  if (relay_mode_) {
    // The relay reads frames as they are on the wire (packet_relay.h): no offloads on either end.
    for (const auto& [ns, dev] : {std::pair{netns, inner}, {switch_netns_, port}}) {
      std::vector<std::string> ethtool = {"ethtool"};
      if (!ns.empty()) ethtool = {"ip", "netns", "exec", ns, Tool("ethtool")};
      ethtool.insert(ethtool.end(), {"-K", dev, "tx", "off", "sg", "off", "tso", "off", "gso",
                                     "off", "gro", "off"});
      RETURN_IF_ERROR(Run(ethtool));
    }
  }
  return Run({"ip", "-n", switch_netns_, "link", "set", port, "up"});
}

absl::Status NetnsHosts::Build(const HostsOptions& options) {
  prefix_ = absl::StrCat(kPrefix, getpid(), "-");
  switch_netns_ = prefix_ + "switch";
  RETURN_IF_ERROR(Run({"ip", "netns", "add", switch_netns_}));
  made_.push_back(switch_netns_);
  RETURN_IF_ERROR(Run({"ip", "-n", switch_netns_, "link", "set", "lo", "up"}));
  const LinkShape& s = options.shape;
  const bool latency = s.delay > absl::ZeroDuration() || s.loss > 0 || options.droppable;
  if (latency) {
    netem_ = Run({"tc", "-n", switch_netns_, "qdisc", "add", "dev", "lo", "root", "netem", "delay",
                  "1ms"})
                 .ok();
    if (netem_) (void)Run({"tc", "-n", switch_netns_, "qdisc", "del", "dev", "lo", "root"});
  }
  relay_mode_ = latency && !netem_;
  if (!relay_mode_) {
    RETURN_IF_ERROR(Run({"ip", "-n", switch_netns_, "link", "add", "br0", "type", "bridge"}));
    RETURN_IF_ERROR(Run({"ip", "-n", switch_netns_, "link", "set", "br0", "up"}));
  }
  std::vector<std::string> ports;
  for (size_t i = 0; i < options.names.size(); ++i) {
    Host h;
    h.name = options.names[i];
    h.netns = prefix_ + h.name;
    h.address = absl::StrCat("10.77.0.", i + 2);
    h.port = absl::StrCat("p", i);
    h.shape = s;
    RETURN_IF_ERROR(Run({"ip", "netns", "add", h.netns}));
    made_.push_back(h.netns);
    RETURN_IF_ERROR(Run({"ip", "-n", h.netns, "link", "set", "lo", "up"}));
    RETURN_IF_ERROR(AddLink(h.netns, "eth0", h.port, h.address));
    ports.push_back(h.port);
    hosts_.push_back(h);
  }
  if (options.attach_self) {
    RETURN_IF_ERROR(AddLink("", "sc-self", "pself", SelfAddress()));
    self_attached_ = true;
    ports.push_back("pself");
  }
  for (const std::string& port : ports) {
    if (relay_mode_) {
      RETURN_IF_ERROR(Run({"ip", "-n", switch_netns_, "link", "set", port, "promisc", "on"}));
    } else {
      RETURN_IF_ERROR(Run({"ip", "-n", switch_netns_, "link", "set", port, "master", "br0"}));
    }
  }
  if (relay_mode_) {
    auto relay =
        PacketRelay::Start(absl::StrCat(kRunNetns, "/", switch_netns_), ports, options.seed);
    if (!relay.ok()) return relay.status();
    relay_ = *std::move(relay);
  }
  for (const Host& h : hosts_) RETURN_IF_ERROR(ApplyShape(h));
  return absl::OkStatus();
}

NetnsHosts::~NetnsHosts() {
  relay_.reset();
  if (self_attached_) (void)Run({"ip", "link", "del", "sc-self"});
  for (auto it = made_.rbegin(); it != made_.rend(); ++it) DeleteNamespace(*it);
}

std::vector<std::string> NetnsHosts::Launcher(int host) const {
  return {Tool("ip"),
          "netns",
          "exec",
          hosts_[host].netns,
          Tool("unshare"),
          "--uts",
          "--",
          "/bin/sh",
          "-c",
          "hostname \"$0\" && exec \"$@\"",
          hosts_[host].name};
}

absl::Status NetnsHosts::ApplyShape(const Host& h) {
  const LinkShape& s = h.shape;
  const bool latency = s.delay > absl::ZeroDuration() || s.loss > 0 || h.dropped;
  if (relay_ != nullptr) {
    RETURN_IF_ERROR(relay_->SetShape(h.port, PortShape{s.delay, s.loss, h.dropped}));
  } else if (latency && !netem_) {
    return absl::FailedPreconditionError(
        absl::StrCat("host '", h.name,
                     "': latency, loss or a dropping cut need netem or the relay; create "
                     "the hosts with a shape that has them or with `droppable`"));
  }
  for (const auto& [ns, dev] : {std::pair{h.netns, std::string("eth0")}, {switch_netns_, h.port}}) {
    if (netem_ && latency) {
      RETURN_IF_ERROR(Netem(ns, dev, s, h.dropped));
    } else {
      RETURN_IF_ERROR(RateLimit(ns, dev, s.rate_bits_per_second));
    }
  }
  return absl::OkStatus();
}

absl::Status NetnsHosts::Shape(int host, const LinkShape& shape) {
  if (shape.delay < absl::ZeroDuration() || !(shape.loss >= 0 && shape.loss <= 1) ||
      shape.rate_bits_per_second < 0) {
    return absl::InvalidArgumentError(absl::StrCat("host '", hosts_[host].name,
                                                   "': a link shape needs a delay >= 0, a loss "
                                                   "in [0, 1] and a rate >= 0"));
  }
  hosts_[host].shape = shape;
  return ApplyShape(hosts_[host]);
}

absl::Status NetnsHosts::Cut(int host, CutKind kind) {
  Host& h = hosts_[host];
  if (kind == CutKind::kLinkDown) {
    return Run({"ip", "-n", switch_netns_, "link", "set", h.port, "down"});
  }
  h.dropped = true;
  absl::Status applied = ApplyShape(h);
  if (!applied.ok()) h.dropped = false;
  return applied;
}

absl::Status NetnsHosts::Heal(int host) {
  Host& h = hosts_[host];
  RETURN_IF_ERROR(Run({"ip", "-n", switch_netns_, "link", "set", h.port, "up"}));
  if (!h.dropped) return absl::OkStatus();
  h.dropped = false;
  return ApplyShape(h);
}

std::string NetnsHosts::latency_by() const {
  if (relay_ != nullptr) return "relay";
  return netem_ ? "netem" : "none";
}

RelayCounters NetnsHosts::relay_counters() const {
  return relay_ != nullptr ? relay_->counters() : RelayCounters{};
}

}  // namespace stagecoach::testing::netns
