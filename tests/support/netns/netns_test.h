// For test binaries whose tests make hosts (hosts.h): their main() (netns_test_main.cc) moves
// the process into a network namespace of its own before gtest or gRPC start a thread, so that
// the hosts' links and this process's address are never in the machine's namespace.
// NetnsPrecondition() is OK when hosts can be made here, otherwise it says why not (not root, a
// tool missing, no namespaces), and tests skip with that message.
#pragma once

#include "absl/status/status.h"

namespace stagecoach::testing::netns {

const absl::Status& NetnsPrecondition();

}  // namespace stagecoach::testing::netns

// In a test body or SetUp: skips the test, naming why, where hosts cannot be made.
#define SKIP_UNLESS_NETNS()                                                        \
  do {                                                                             \
    if (!::stagecoach::testing::netns::NetnsPrecondition().ok()) {                 \
      GTEST_SKIP() << "no network namespaces here: "                               \
                   << ::stagecoach::testing::netns::NetnsPrecondition().message(); \
    }                                                                              \
  } while (0)
