// The hosts of tests/support/netns (hosts.h) and their links, with TCP between this process
// (10.77.0.1) and a listener in a host's namespace:
//   - a link's delay is met each way (a connection's handshake takes at least twice it), and
//     bytes cross the relay intact;
//   - with loss, frames are dropped and TCP still delivers every byte;
//   - a cut (dropping on the relay, link down on the kernel's bridge) makes the host
//     unreachable, and healing it makes it reachable again;
//   - a daemon runs under its host's name and address;
//   - namespaces left by a process that died are deleted by the next Create.
// Root only (label netns); skipped, naming why, elsewhere.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"
#include "tests/support/netns/hosts.h"
#include "tests/support/netns/netns_test.h"
#include "tests/support/process.h"

namespace stagecoach::testing::netns_hosts_test {
namespace {

using netns::CutKind;
using netns::HostsOptions;
using netns::LinkShape;
using netns::NetnsHosts;

// A listening socket made in the host's namespace (by a thread that enters it; the socket
// stays there); its port in *port.
int ListenIn(const std::string& netns, const std::string& address, int* port) {
  int fd = -1;
  std::thread([&] {
    const int ns = open(absl::StrCat("/run/netns/", netns).c_str(), O_RDONLY | O_CLOEXEC);
    if (ns < 0 || setns(ns, CLONE_NEWNET) != 0) return;
    close(ns);
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    inet_pton(AF_INET, address.c_str(), &a.sin_addr);
    socklen_t len = sizeof(a);
    if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(fd, 4) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      close(fd);
      fd = -1;
      return;
    }
    *port = ntohs(a.sin_port);
  }).join();
  return fd;
}

// Connects from this process within `timeout`; the socket, or -1.
int Connect(const std::string& address, int port, std::chrono::milliseconds timeout) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, address.c_str(), &a.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 && errno != EINPROGRESS) {
    close(fd);
    return -1;
  }
  pollfd p{fd, POLLOUT, 0};
  int err = 0;
  socklen_t len = sizeof(err);
  if (poll(&p, 1, static_cast<int>(timeout.count())) != 1 ||
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
    close(fd);
    return -1;
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  timeval t{30, 0};  // no read or write below waits longer
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &t, sizeof(t));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &t, sizeof(t));
  return fd;
}

// Sends `bytes` patterned bytes to a listener that echoes them, and checks what comes back.
void ExpectEchoIntact(int listener, const std::string& address, int port, size_t bytes) {
  const int client = Connect(address, port, std::chrono::seconds(10));
  ASSERT_GE(client, 0) << "connect to " << address << ":" << port;
  std::thread echo([listener] {
    pollfd p{listener, POLLIN, 0};
    if (poll(&p, 1, 10000) != 1) return;
    const int conn = accept(listener, nullptr, nullptr);
    timeval t{30, 0};
    setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &t, sizeof(t));
    char buf[65536];
    ssize_t n;
    while ((n = read(conn, buf, sizeof(buf))) > 0) {
      if (write(conn, buf, n) != n) break;
    }
    close(conn);
  });
  std::string sent(bytes, '\0'), received;
  for (size_t i = 0; i < bytes; ++i) sent[i] = static_cast<char>((i * 131 + i / 977) & 0xff);
  std::thread writer([&] {
    for (size_t off = 0; off < bytes;) {
      const ssize_t n = write(client, sent.data() + off, std::min<size_t>(65536, bytes - off));
      if (n <= 0) break;
      off += n;
    }
    shutdown(client, SHUT_WR);
  });
  char buf[65536];
  ssize_t n;
  while ((n = read(client, buf, sizeof(buf))) > 0) received.append(buf, n);
  writer.join();
  echo.join();
  close(client);
  EXPECT_EQ(received.size(), bytes);
  EXPECT_TRUE(received == sent) << "the bytes changed on the way";
}

class NetnsHostsTest : public ::testing::Test {
 protected:
  void SetUp() override { SKIP_UNLESS_NETNS(); }

  std::unique_ptr<NetnsHosts> Make(const LinkShape& shape, bool droppable) {
    HostsOptions options;
    options.names = {"host-a"};
    options.shape = shape;
    options.droppable = droppable;
    auto hosts = NetnsHosts::Create(options);
    EXPECT_TRUE(hosts.ok()) << hosts.status();
    return hosts.ok() ? *std::move(hosts) : nullptr;
  }
};

TEST_F(NetnsHostsTest, ALinksDelayIsMetEachWayAndBytesCrossTheRelayIntact) {
  auto hosts = Make(LinkShape{0, absl::Milliseconds(20), 0}, false);
  ASSERT_NE(hosts, nullptr);
  EXPECT_NE(hosts->latency_by(), "none");
  int port = 0;
  const int listener = ListenIn(hosts->netns(0), hosts->address(0), &port);
  ASSERT_GE(listener, 0);
  const auto start = std::chrono::steady_clock::now();
  const int fd = Connect(hosts->address(0), port, std::chrono::seconds(5));
  const auto handshake = std::chrono::steady_clock::now() - start;
  ASSERT_GE(fd, 0);
  close(fd);
  pollfd p{listener, POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 10000), 1);
  close(accept(listener, nullptr, nullptr));  // the echo below accepts the next connection
  // SYN over host-a's link (20 ms), SYN-ACK back over it (20 ms).
  EXPECT_GE(handshake, std::chrono::milliseconds(40));
  ExpectEchoIntact(listener, hosts->address(0), port, 4 << 20);
  close(listener);
  EXPECT_GT(hosts->relay_counters().forwarded, 1000);
}

TEST_F(NetnsHostsTest, WithLossFramesAreDroppedAndTcpStillDeliversEveryByte) {
  auto hosts = Make(LinkShape{0, absl::ZeroDuration(), 0.05}, false);
  ASSERT_NE(hosts, nullptr);
  int port = 0;
  const int listener = ListenIn(hosts->netns(0), hosts->address(0), &port);
  ASSERT_GE(listener, 0);
  ExpectEchoIntact(listener, hosts->address(0), port, 2 << 20);
  close(listener);
  if (hosts->latency_by() == "relay") {
    EXPECT_GT(hosts->relay_counters().lost, 0);
  }
}

TEST_F(NetnsHostsTest, ACutHostIsUnreachableUntilHealed) {
  for (const bool droppable : {true, false}) {
    SCOPED_TRACE(droppable ? "dropping on the relay" : "link down on the bridge");
    auto hosts = Make(LinkShape{}, droppable);
    ASSERT_NE(hosts, nullptr);
    int port = 0;
    const int listener = ListenIn(hosts->netns(0), hosts->address(0), &port);
    ASSERT_GE(listener, 0);
    ASSERT_TRUE(hosts->Cut(0, droppable ? CutKind::kDrop : CutKind::kLinkDown).ok());
    EXPECT_LT(Connect(hosts->address(0), port, std::chrono::seconds(1)), 0) << "reached";
    ASSERT_TRUE(hosts->Heal(0).ok());
    const int fd = Connect(hosts->address(0), port, std::chrono::seconds(10));
    EXPECT_GE(fd, 0) << "not reachable once healed";
    if (fd >= 0) close(fd);
    close(listener);
  }
}

TEST_F(NetnsHostsTest, ADaemonRunsUnderItsHostsNameAndAddress) {
  auto hosts = Make(LinkShape{}, false);
  ASSERT_NE(hosts, nullptr);
  std::vector<std::string> argv = hosts->Launcher(0);
  argv.insert(argv.end(), {"/bin/sh", "-c", "hostname; /usr/sbin/ip -4 -o addr show dev eth0"});
  CommandResult r = RunCommand(argv, absl::Seconds(20));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.substr(0, r.out.find('\n')), "host-a");
  EXPECT_NE(r.out.find("10.77.0.2/24"), std::string::npos) << r.out;
}

TEST_F(NetnsHostsTest, BadHostNamesAndLinkShapesAreRefusedNamingWhat) {
  HostsOptions options;
  options.names = {"host-a", "bad name"};
  auto refused = NetnsHosts::Create(options);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("bad host name 'bad name'"), std::string::npos)
      << refused.status();
  auto hosts = Make(LinkShape{}, false);
  ASSERT_NE(hosts, nullptr);
  const absl::Status shape = hosts->Shape(0, LinkShape{0, absl::ZeroDuration(), 2.0});
  EXPECT_EQ(shape.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(shape.message().find("host 'host-a'"), std::string::npos) << shape;
  // Latency on the kernel's bridge, made without the relay: refused, saying what is needed.
  const absl::Status latency = hosts->Shape(0, LinkShape{0, absl::Milliseconds(1), 0});
  if (hosts->latency_by() == "none") {
    EXPECT_EQ(latency.code(), absl::StatusCode::kFailedPrecondition) << latency;
    EXPECT_NE(latency.message().find("droppable"), std::string::npos) << latency;
  }
}

TEST_F(NetnsHostsTest, NamespacesOfAProcessThatDiedAreDeletedByTheNextCreate) {
  int dead = 4000000;
  while (kill(dead, 0) == 0 || errno != ESRCH) ++dead;
  const std::string stale = absl::StrCat("stagecoach-", dead, "-host-a");
  ASSERT_EQ(RunCommand({"/usr/sbin/ip", "netns", "add", stale}, absl::Seconds(20)).exit_code, 0);
  auto hosts = Make(LinkShape{}, false);
  ASSERT_NE(hosts, nullptr);
  CommandResult list = RunCommand({"/usr/sbin/ip", "netns", "list"}, absl::Seconds(20));
  EXPECT_EQ(list.out.find(stale), std::string::npos) << list.out;
  EXPECT_NE(list.out.find(hosts->netns(0)), std::string::npos) << list.out;
}

}  // namespace
}  // namespace stagecoach::testing::netns_hosts_test
