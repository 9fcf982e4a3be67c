// A conformance suite for Transport backends (worker/transport/transport.h), written against
// the interface only. A backend instantiates it with a TransportBackend that creates groups of
// connected transports and memory they can transfer:
//
//   INSTANTIATE_TEST_SUITE_P(Gloo, TransportConformanceTest,
//                            ::testing::Values(GlooBackend()), BackendName);
//
// The tests run every rank of a group in this process; calls on one transport are made from
// one thread at a time, as transport.h requires.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/transport/backends.h"
#include "gtest/gtest.h"
#include "worker/transport/transport.h"

// Asserts that a Status expression is OK, printing it otherwise.
#define SC_ASSERT_OK(expr)                      \
  do {                                          \
    const absl::Status sc_status_ = (expr);     \
    ASSERT_TRUE(sc_status_.ok()) << sc_status_; \
  } while (0)

// Posts a send or receive (`expr`), asserting that posting succeeded; declares `lhs` as the
// Work. For tests in namespace stagecoach::transport or with `Work` in scope.
#define SC_ASSIGN_WORK(lhs, expr)                  \
  auto lhs##_or = (expr);                          \
  ASSERT_TRUE(lhs##_or.ok()) << lhs##_or.status(); \
  std::unique_ptr<Work> lhs = std::move(lhs##_or).value()

namespace stagecoach::transport::testing {

// Memory a backend sends from and receives into (host memory for Gloo, device memory for
// NCCL), with copies from and to the host for the tests to fill and check it.
class TestBuffer {
 public:
  virtual ~TestBuffer() = default;
  virtual void* data() = 0;
  virtual size_t size() const = 0;
  // Copies `bytes` (at most size() of them) to the start of the buffer.
  virtual void Write(const std::vector<uint8_t>& bytes) = 0;
  // Copies the whole buffer to the host.
  virtual std::vector<uint8_t> Read() const = 0;
};

// Host memory, for backends that transfer host memory (`rank` is unused).
std::unique_ptr<TestBuffer> AllocateHostBuffer(size_t bytes, int rank);

// What the suite needs from a backend.
struct TransportBackend {
  // Names the instantiation ("Gloo").
  std::string name;
  // Creates `world_size` connected transports; element i is rank i.
  std::function<absl::StatusOr<std::vector<std::unique_ptr<Transport>>>(int world_size)>
      create_group;
  // Allocates memory the backend can transfer, for the transport of rank `rank` (device
  // memory lives on that rank's device).
  std::function<std::unique_ptr<TestBuffer>(size_t bytes, int rank)> allocate = AllocateHostBuffer;
  // The largest group create_group supports; tests that need more ranks skip.
  int max_world_size = 4;
  // When not empty, every test skips with this reason (e.g. "no CUDA device").
  std::string unavailable;

  // What the backend provides beyond the interface's common ground: its descriptor's
  // (common/transport/backends.h). The suite checks that its transports report these and that
  // the registry holds the same. Tests of a capability the backend lacks (matches_tags,
  // detects_size_mismatch, independent_transfers) skip, or skip that part.
  BackendCapabilities capabilities;
};

// Creates a group of `world_size` transports, calling create(rank) for every rank on a thread
// of its own (creation blocks until the ranks have met); element i is rank i. The first rank's
// error when one fails.
absl::StatusOr<std::vector<std::unique_ptr<Transport>>> CreateGroupOnThreads(
    int world_size,
    const std::function<absl::StatusOr<std::unique_ptr<Transport>>(int rank)>& create);

// Prints the backend's name in test output.
void PrintTo(const TransportBackend& backend, std::ostream* os);

// Names instantiations after TransportBackend::name.
std::string BackendName(const ::testing::TestParamInfo<TransportBackend>& info);

// Bytes that differ between (seed, position), to tell messages apart.
std::vector<uint8_t> Pattern(size_t bytes, uint32_t seed);

class TransportConformanceTest : public ::testing::TestWithParam<TransportBackend> {
 protected:
  // Skips every test when the backend is unavailable.
  void SetUp() override;
  // Creates a group of `world_size` into `group`; a fatal failure when the backend fails.
  void CreateGroup(int world_size, std::vector<std::unique_ptr<Transport>>* group);
  // Backend memory for `rank` holding `contents`.
  std::unique_ptr<TestBuffer> Buffer(const std::vector<uint8_t>& contents, int rank);
  // Backend memory for `rank` of `bytes` zero bytes.
  std::unique_ptr<TestBuffer> ZeroBuffer(size_t bytes, int rank);
};

}  // namespace stagecoach::transport::testing
