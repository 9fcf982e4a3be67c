// main() of the tests that make hosts as network namespaces (netns_test.h).
#include <cstring>

#include "gtest/gtest.h"
#include "tests/support/netns/hosts.h"
#include "tests/support/netns/netns_test.h"

namespace stagecoach::testing::netns {
namespace {

absl::Status& Precondition() {
  static absl::Status status = absl::UnknownError("main() did not check");
  return status;
}

}  // namespace

const absl::Status& NetnsPrecondition() { return Precondition(); }

}  // namespace stagecoach::testing::netns

int main(int argc, char** argv) {
  namespace netns = stagecoach::testing::netns;
  bool listing = false;
  for (int i = 1; i < argc; ++i) listing |= std::strcmp(argv[i], "--gtest_list_tests") == 0;
  // Listing the tests (CTest's discovery) needs no namespace.
  if (!listing) {
    absl::Status status = netns::NetnsHosts::Available();
    if (status.ok()) status = netns::NetnsHosts::EnterOwnNetworkNamespace();
    if (status.ok()) status = netns::NetnsHosts::Probe();
    netns::Precondition() = status;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
