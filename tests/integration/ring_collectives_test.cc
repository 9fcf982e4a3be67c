// The ring collectives (worker/collectives/ring/factory.h) over Gloo transports, ranks as
// threads: the collectives conformance suite.
#include <atomic>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/integration/collectives_conformance.h"
#include "worker/collectives/ring/factory.h"
#include "worker/transport/gloo/factory.h"
#include "worker/transport/in_memory_store.h"

namespace stagecoach::collectives::testing::ring_collectives_test {
namespace {

absl::StatusOr<std::vector<std::unique_ptr<Collectives>>> CreateRingGroup(int size) {
  static std::atomic<int> groups{0};
  const std::string prefix = absl::StrCat("ring", groups++, "/");
  transport::InMemoryStore store;
  return CreateCollectivesOnThreads(size,
                                    [&](int rank) -> absl::StatusOr<std::unique_ptr<Collectives>> {
                                      transport::GlooOptions options;
                                      options.rank = rank;
                                      options.world_size = size;
                                      options.key_prefix = prefix;
                                      options.connect_timeout = absl::Seconds(20);
                                      auto t = transport::CreateGlooTransport(options, &store);
                                      if (!t.ok()) return t.status();
                                      return CreateRingCollectives(*std::move(t));
                                    });
}

CollectivesBackend RingBackend() {
  CollectivesBackend backend;
  backend.name = "RingOverGloo";
  backend.create_group = CreateRingGroup;
  backend.max_size = 4;
  return backend;
}

INSTANTIATE_TEST_SUITE_P(Ring, CollectivesConformanceTest, ::testing::Values(RingBackend()),
                         CollectivesBackendName);

TEST(RingCollectives, RefusesAMissingTransport) {
  auto none = CreateRingCollectives(nullptr);
  EXPECT_TRUE(absl::IsInvalidArgument(none.status())) << none.status();
}

}  // namespace
}  // namespace stagecoach::collectives::testing::ring_collectives_test
