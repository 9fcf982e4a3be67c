// A conformance suite for Collectives backends (worker/collectives/collectives.h), written
// against the interface only. A backend instantiates it with a CollectivesBackend:
//
//   INSTANTIATE_TEST_SUITE_P(Ring, CollectivesConformanceTest,
//                            ::testing::Values(RingBackend()), CollectivesBackendName);
//
// Every rank of a group runs in this process, each on a thread of its own for every call (one
// call at a time per rank, as collectives.h requires).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "worker/collectives/collectives.h"

namespace stagecoach::collectives::testing {

// Memory a backend reduces (host memory for the ring, device memory for NCCL), with copies from
// and to the host.
class CollectiveBuffer {
 public:
  virtual ~CollectiveBuffer() = default;
  virtual void* data() = 0;
  virtual size_t size() const = 0;
  // Copies bytes.size() bytes (at most size()) to the start of the buffer.
  virtual void Write(const std::vector<uint8_t>& bytes) = 0;
  virtual std::vector<uint8_t> Read() const = 0;
};

// Host memory (`rank` unused).
std::unique_ptr<CollectiveBuffer> AllocateHostMemory(size_t bytes, int rank);

struct CollectivesBackend {
  std::string name;
  // Creates `size` connected groups' endpoints; element i is rank i.
  std::function<absl::StatusOr<std::vector<std::unique_ptr<Collectives>>>(int size)> create_group;
  std::function<std::unique_ptr<CollectiveBuffer>(size_t bytes, int rank)> allocate =
      AllocateHostMemory;
  // The largest group create_group supports; tests needing more skip.
  int max_size = 4;
  // When not empty, every test skips with this reason (e.g. "no CUDA device").
  std::string unavailable;
};

// Runs create(rank) for every rank on a thread of its own (creation blocks until all met).
absl::StatusOr<std::vector<std::unique_ptr<Collectives>>> CreateCollectivesOnThreads(
    int size, const std::function<absl::StatusOr<std::unique_ptr<Collectives>>(int rank)>& create);

void PrintTo(const CollectivesBackend& backend, std::ostream* os);
std::string CollectivesBackendName(const ::testing::TestParamInfo<CollectivesBackend>& info);

class CollectivesConformanceTest : public ::testing::TestWithParam<CollectivesBackend> {
 protected:
  void SetUp() override;
  // A group of `size`; a fatal failure when the backend fails; skips above max_size.
  void CreateGroup(int size, std::vector<std::unique_ptr<Collectives>>* group);
};

}  // namespace stagecoach::collectives::testing
