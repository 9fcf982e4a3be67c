#include "tests/support/netns/packet_relay.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <future>
#include <mutex>
#include <queue>
#include <random>
#include <thread>
#include <unordered_map>

#include "absl/strings/str_cat.h"

namespace stagecoach::testing::netns {
namespace {

constexpr size_t kMaxFrame = 65536;
constexpr int kReadsPerRound = 256;  // per port, so that one busy port cannot starve the others

int64_t NowNanos() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

absl::Status Errno(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

uint64_t Mac(const unsigned char* p) {
  uint64_t mac = 0;
  for (int i = 0; i < 6; ++i) mac = (mac << 8) | p[i];
  return mac;
}

struct Port {
  std::string name;
  int fd = -1;
  int mtu = 1500;
  PortShape shape;  // under State::mu
};

struct Pending {
  int64_t due = 0;
  uint64_t seq = 0;
  int out = 0;
  std::string frame;
  bool operator>(const Pending& o) const { return due != o.due ? due > o.due : seq > o.seq; }
};

}  // namespace

struct PacketRelay::State {
  std::vector<Port> ports;
  mutable std::mutex mu;
  int stop_fd = -1;
  std::thread thread;
  std::atomic<int64_t> forwarded{0}, lost{0}, cut{0}, undeliverable{0};

  // The forwarding thread's own.
  std::unordered_map<uint64_t, int> mac_ports;
  std::priority_queue<Pending, std::vector<Pending>, std::greater<Pending>> delayed;
  uint64_t seq = 0;
  std::mt19937_64 rng;

  ~State() {
    for (Port& p : ports) {
      if (p.fd >= 0) close(p.fd);
    }
    if (stop_fd >= 0) close(stop_fd);
  }

  absl::Status Open(const std::string& netns_path);
  void Run();
  void ReadPort(int in, unsigned char* buffer);
  void Route(int in, const unsigned char* frame, size_t len);
  void Send(int out, const unsigned char* frame, size_t len);
  void DeliverDue();
};

absl::Status PacketRelay::State::Open(const std::string& netns_path) {
  if (!netns_path.empty()) {
    // Only this thread enters the switch's namespace; the sockets it opens stay there.
    const int ns = open(netns_path.c_str(), O_RDONLY | O_CLOEXEC);
    if (ns < 0) return Errno(absl::StrCat("open ", netns_path));
    const int rc = setns(ns, CLONE_NEWNET);
    close(ns);
    if (rc != 0) return Errno(absl::StrCat("setns ", netns_path));
  }
  for (Port& p : ports) {
    const unsigned index = if_nametoindex(p.name.c_str());
    if (index == 0) return Errno(absl::StrCat("relay port '", p.name, "'"));
    p.fd = socket(AF_PACKET, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, htons(ETH_P_ALL));
    if (p.fd < 0) return Errno("AF_PACKET socket (root needed)");
    int one = 1, rcvbuf = 4 << 20;
    setsockopt(p.fd, SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof(one));
    setsockopt(p.fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
    sockaddr_ll addr{};
    addr.sll_family = AF_PACKET;
    addr.sll_protocol = htons(ETH_P_ALL);
    addr.sll_ifindex = static_cast<int>(index);
    if (bind(p.fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      return Errno(absl::StrCat("bind to port '", p.name, "'"));
    }
    ifreq req{};
    std::strncpy(req.ifr_name, p.name.c_str(), IFNAMSIZ - 1);
    if (ioctl(p.fd, SIOCGIFMTU, &req) == 0) p.mtu = req.ifr_mtu;
  }
  stop_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (stop_fd < 0) return Errno("eventfd");
  return absl::OkStatus();
}

void PacketRelay::State::Send(int out, const unsigned char* frame, size_t len) {
  if (len > static_cast<size_t>(ports[out].mtu) + ETH_HLEN ||
      send(ports[out].fd, frame, len, MSG_DONTWAIT) < 0) {
    undeliverable.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  forwarded.fetch_add(1, std::memory_order_relaxed);
}

void PacketRelay::State::Route(int in, const unsigned char* frame, size_t len) {
  if (len < ETH_HLEN) return;
  const uint64_t src = Mac(frame + 6), dst = Mac(frame);
  if ((frame[6] & 1) == 0) mac_ports[src] = in;
  std::vector<int> outs;
  auto known = (frame[0] & 1) == 0 ? mac_ports.find(dst) : mac_ports.end();
  if (known != mac_ports.end()) {
    if (known->second != in) outs.push_back(known->second);
  } else {
    for (int o = 0; o < static_cast<int>(ports.size()); ++o) {
      if (o != in) outs.push_back(o);
    }
  }
  const int64_t now = NowNanos();
  for (int out : outs) {
    PortShape from, to;
    {
      std::lock_guard<std::mutex> lock(mu);
      from = ports[in].shape;
      to = ports[out].shape;
    }
    if (from.cut || to.cut) {
      cut.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    std::uniform_real_distribution<double> u(0.0, 1.0);
    if ((from.loss > 0 && u(rng) < from.loss) || (to.loss > 0 && u(rng) < to.loss)) {
      lost.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    const int64_t delay = absl::ToInt64Nanoseconds(from.delay + to.delay);
    if (delay <= 0 && delayed.empty()) {
      Send(out, frame, len);
      continue;
    }
    delayed.push(
        Pending{now + delay, seq++, out, std::string(reinterpret_cast<const char*>(frame), len)});
  }
}

void PacketRelay::State::ReadPort(int in, unsigned char* buffer) {
  for (int i = 0; i < kReadsPerRound; ++i) {
    sockaddr_ll from{};
    socklen_t from_len = sizeof(from);
    const ssize_t n = recvfrom(ports[in].fd, buffer, kMaxFrame, MSG_TRUNC,
                               reinterpret_cast<sockaddr*>(&from), &from_len);
    if (n < 0) return;  // EAGAIN: read all; ENETDOWN: the port's link is down
    if (from.sll_pkttype == PACKET_OUTGOING) continue;
    if (static_cast<size_t>(n) > kMaxFrame) {
      undeliverable.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    Route(in, buffer, static_cast<size_t>(n));
  }
}

void PacketRelay::State::DeliverDue() {
  const int64_t now = NowNanos();
  while (!delayed.empty() && delayed.top().due <= now) {
    const Pending& p = delayed.top();
    Send(p.out, reinterpret_cast<const unsigned char*>(p.frame.data()), p.frame.size());
    delayed.pop();
  }
}

void PacketRelay::State::Run() {
  std::vector<unsigned char> buffer(kMaxFrame);
  std::vector<pollfd> fds(ports.size() + 1);
  for (size_t i = 0; i < ports.size(); ++i) fds[i] = {ports[i].fd, POLLIN, 0};
  fds.back() = {stop_fd, POLLIN, 0};
  while (true) {
    int64_t wait = 100'000'000;  // wakes at least every 100 ms
    if (!delayed.empty()) wait = std::max<int64_t>(0, delayed.top().due - NowNanos());
    timespec timeout{static_cast<time_t>(wait / 1000000000), static_cast<long>(wait % 1000000000)};
    if (ppoll(fds.data(), fds.size(), &timeout, nullptr) < 0 && errno != EINTR) return;
    if (fds.back().revents != 0) return;
    for (size_t i = 0; i < ports.size(); ++i) {
      if ((fds[i].revents & POLLERR) != 0) {
        int err = 0;  // a link going down leaves an error on the socket: clear it
        socklen_t len = sizeof(err);
        getsockopt(fds[i].fd, SOL_SOCKET, SO_ERROR, &err, &len);
      }
      if ((fds[i].revents & POLLIN) != 0) ReadPort(static_cast<int>(i), buffer.data());
    }
    DeliverDue();
  }
}

PacketRelay::PacketRelay(std::unique_ptr<State> state) : state_(std::move(state)) {}

absl::StatusOr<std::unique_ptr<PacketRelay>> PacketRelay::Start(
    const std::string& netns_path, const std::vector<std::string>& ports, uint64_t seed) {
  if (ports.size() < 2) return absl::InvalidArgumentError("a relay needs at least two ports");
  auto state = std::make_unique<State>();
  for (const std::string& name : ports) state->ports.push_back(Port{name});
  state->rng.seed(seed);
  auto opened = std::make_shared<std::promise<absl::Status>>();
  std::future<absl::Status> result = opened->get_future();
  State* s = state.get();
  state->thread = std::thread([s, netns_path, opened] {
    absl::Status status = s->Open(netns_path);
    const bool ok = status.ok();
    opened->set_value(std::move(status));
    if (ok) s->Run();
  });
  if (result.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    // The thread is stuck in a system call: it cannot be joined, so it and its state are left.
    state->thread.detach();
    state.release();
    return absl::DeadlineExceededError("the relay's sockets were not open after 10 s");
  }
  absl::Status status = result.get();
  if (!status.ok()) {
    state->thread.join();
    return status;
  }
  return std::unique_ptr<PacketRelay>(new PacketRelay(std::move(state)));
}

PacketRelay::~PacketRelay() {
  const uint64_t one = 1;
  if (write(state_->stop_fd, &one, sizeof(one)) < 0) std::abort();
  state_->thread.join();
}

absl::Status PacketRelay::SetShape(const std::string& port, const PortShape& shape) {
  if (shape.delay < absl::ZeroDuration() || !(shape.loss >= 0 && shape.loss <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("relay port '", port, "': delay ", absl::FormatDuration(shape.delay),
                     " and loss ", shape.loss, " (a delay of at least 0, a loss in [0, 1])"));
  }
  std::lock_guard<std::mutex> lock(state_->mu);
  for (Port& p : state_->ports) {
    if (p.name != port) continue;
    p.shape = shape;
    return absl::OkStatus();
  }
  return absl::NotFoundError(absl::StrCat("the relay has no port '", port, "'"));
}

RelayCounters PacketRelay::counters() const {
  RelayCounters c;
  c.forwarded = state_->forwarded.load();
  c.lost = state_->lost.load();
  c.cut = state_->cut.load();
  c.undeliverable = state_->undeliverable.load();
  return c;
}

}  // namespace stagecoach::testing::netns
