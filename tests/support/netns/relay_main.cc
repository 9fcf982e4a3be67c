// stagecoach-netns-relay: the packet relay (packet_relay.h) as a process, for
// scripts/netns_cluster.sh on kernels without netem. It switches frames between the named ports
// of a switch namespace, each with its delay and loss, until SIGINT or SIGTERM.
//
//   stagecoach-netns-relay --netns NAME PORT[=DELAY[,LOSS]] ...
//   e.g. stagecoach-netns-relay --netns demo-switch p0=1ms,0.005 p1=1ms,0.005 pself
#include <signal.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "tests/support/netns/packet_relay.h"

namespace netns = stagecoach::testing::netns;

namespace {

int Usage(const std::string& why) {
  std::fprintf(stderr,
               "stagecoach-netns-relay: %s\nusage: stagecoach-netns-relay --netns NAME "
               "PORT[=DELAY[,LOSS]] ... (DELAY e.g. 1ms, LOSS a probability, e.g. 0.01)\n",
               why.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string ns;
  std::vector<std::string> ports;
  std::vector<netns::PortShape> shapes;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--netns" && i + 1 < argc) {
      ns = argv[++i];
      continue;
    }
    std::vector<std::string> port = absl::StrSplit(arg, absl::MaxSplits('=', 1));
    netns::PortShape shape;
    if (port.size() == 2) {
      std::vector<std::string> parts = absl::StrSplit(port[1], ',');
      if (!absl::ParseDuration(parts[0], &shape.delay) ||
          (parts.size() > 1 && !absl::SimpleAtod(parts[1], &shape.loss)) || parts.size() > 2) {
        return Usage("bad port '" + arg + "'");
      }
    }
    ports.push_back(port[0]);
    shapes.push_back(shape);
  }
  if (ns.empty()) return Usage("--netns is required");
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);  // before the relay's thread starts
  auto relay = netns::PacketRelay::Start("/run/netns/" + ns, ports, 1);
  if (!relay.ok()) return Usage(std::string(relay.status().message()));
  for (size_t i = 0; i < ports.size(); ++i) {
    absl::Status shaped = (*relay)->SetShape(ports[i], shapes[i]);
    if (!shaped.ok()) return Usage(std::string(shaped.message()));
  }
  std::printf("relaying %zu ports in %s\n", ports.size(), ns.c_str());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&stop, &sig);
  const netns::RelayCounters c = (*relay)->counters();
  std::printf("forwarded %lld, lost %lld, undeliverable %lld\n",
              static_cast<long long>(c.forwarded), static_cast<long long>(c.lost),
              static_cast<long long>(c.undeliverable));
  return 0;
}
