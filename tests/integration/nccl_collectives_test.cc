// NCCL's collectives (worker/collectives/nccl/factory.h): the collectives conformance suite with
// one rank per GPU (ranks as threads, device memory, one InMemoryStore), and a one-rank group on
// one GPU. Without NCCL in the build or without a CUDA device every test skips, and CTest
// reports it skipped.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/integration/collectives_conformance.h"
#include "worker/collectives/nccl/factory.h"
#include "worker/transport/in_memory_store.h"
#include "worker/transport/nccl/factory.h"

#if STAGECOACH_HAVE_NCCL
#include <cuda_runtime_api.h>
#endif

namespace stagecoach::collectives::testing::nccl_collectives_test {
namespace {

// NCCL's first communicator in a process takes a while (topology detection).
constexpr absl::Duration kConnect = absl::Seconds(60);
constexpr absl::Duration kTimeout = absl::Seconds(30);

// Why these tests cannot run here; empty when they can.
std::string UnavailableReason() {
  if (!transport::NcclBuilt()) return "built without NCCL (STAGECOACH_HAVE_NCCL=0)";
  if (!transport::NcclAvailable()) return "no CUDA device";
  return "";
}

#if STAGECOACH_HAVE_NCCL

// `bytes` of device memory on GPU `device`. Copies go through the device's legacy default
// stream, the collectives' compute stream here, so they are ordered with the calls.
class DeviceMemory final : public CollectiveBuffer {
 public:
  DeviceMemory(size_t bytes, int device) : bytes_(bytes), device_(device) {
    Current current(device_);
    Check(cudaMalloc(&data_, std::max<size_t>(bytes_, 1)), "cudaMalloc");
  }
  ~DeviceMemory() override {
    Current current(device_);
    Check(cudaFree(data_), "cudaFree");
  }
  void* data() override { return data_; }
  size_t size() const override { return bytes_; }
  void Write(const std::vector<uint8_t>& bytes) override {
    const size_t n = std::min(bytes.size(), bytes_);
    if (n == 0) return;
    Current current(device_);
    Check(cudaMemcpy(data_, bytes.data(), n, cudaMemcpyHostToDevice), "cudaMemcpy to the device");
  }
  std::vector<uint8_t> Read() const override {
    std::vector<uint8_t> out(bytes_);
    if (bytes_ == 0) return out;
    Current current(device_);
    Check(cudaMemcpy(out.data(), data_, bytes_, cudaMemcpyDeviceToHost), "cudaMemcpy to the host");
    return out;
  }

 private:
  // Makes a device current for the scope.
  class Current {
   public:
    explicit Current(int device) {
      Check(cudaGetDevice(&previous_), "cudaGetDevice");
      Check(cudaSetDevice(device), "cudaSetDevice");
    }
    ~Current() { cudaSetDevice(previous_); }

   private:
    int previous_ = 0;
  };

  static void Check(cudaError_t error, const char* call) {
    EXPECT_EQ(error, cudaSuccess) << call << ": " << cudaGetErrorString(error);
  }

  const size_t bytes_;
  const int device_;
  void* data_ = nullptr;
};

std::unique_ptr<CollectiveBuffer> AllocateDeviceMemory(size_t bytes, int rank) {
  return std::make_unique<DeviceMemory>(bytes, rank);  // Rank r runs on GPU r.
}

// Makes `device` the calling thread's current device, as a worker's rank thread does.
void UseDevice(int device) {
  const cudaError_t error = cudaSetDevice(device);
  EXPECT_EQ(error, cudaSuccess) << "cudaSetDevice: " << cudaGetErrorString(error);
}

#else  // Never called: every test skips first.

std::unique_ptr<CollectiveBuffer> AllocateDeviceMemory(size_t bytes, int rank) {
  return AllocateHostMemory(bytes, rank);
}
void UseDevice(int) {}

#endif  // STAGECOACH_HAVE_NCCL

// A group of `size` ranks, rank r on GPU r, each created on a thread of its own through one
// InMemoryStore (each group under a key prefix of its own).
absl::StatusOr<std::vector<std::unique_ptr<Collectives>>> CreateNcclGroup(int size) {
  static std::atomic<int> groups{0};
  const std::string prefix = absl::StrCat("nccl_collectives", groups++, "/");
  transport::InMemoryStore store;
  return CreateCollectivesOnThreads(size, [&](int rank) {
    UseDevice(rank);
    NcclCollectivesOptions options;
    options.rank = rank;
    options.world_size = size;
    options.key_prefix = prefix;
    options.connect_timeout = kConnect;
    options.cuda_device = rank;
    return CreateNcclCollectives(options, &store);
  });
}

CollectivesBackend NcclBackend() {
  CollectivesBackend backend;
  backend.name = "Nccl";
  backend.create_group = CreateNcclGroup;
  backend.allocate = AllocateDeviceMemory;
  backend.max_size = transport::CudaDeviceCount();  // NCCL refuses two ranks on one GPU.
  backend.unavailable = UnavailableReason();
  return backend;
}

INSTANTIATE_TEST_SUITE_P(Nccl, CollectivesConformanceTest, ::testing::Values(NcclBackend()),
                         CollectivesBackendName);

TEST(NcclCollectivesTest, OneRankGroupAllReducesOnOneGpu) {
  const std::string reason = UnavailableReason();
  if (!reason.empty()) GTEST_SKIP() << reason;
  auto group = CreateNcclGroup(1);
  ASSERT_TRUE(group.ok()) << group.status();
  Collectives& self = *group->front();
  EXPECT_EQ(self.backend(), "nccl");
  EXPECT_TRUE(self.takes_device_memory());
  EXPECT_EQ(self.rank(), 0);
  EXPECT_EQ(self.size(), 1);

  const std::vector<float> values = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f};
  std::vector<uint8_t> bytes(values.size() * sizeof(float));
  std::memcpy(bytes.data(), values.data(), bytes.size());
  auto buffer = AllocateDeviceMemory(bytes.size(), 0);
  buffer->Write(bytes);
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMax}) {
    const absl::Status status = self.AllReduce(buffer->data(), static_cast<int64_t>(values.size()),
                                               DataType::kFloat32, op, kTimeout);
    ASSERT_TRUE(status.ok()) << ReduceOpName(op) << ": " << status;
    EXPECT_EQ(buffer->Read(), bytes) << ReduceOpName(op) << ": one rank's reduction is itself";
  }
  EXPECT_EQ(self.stats().bytes_sent, 0);  // Nothing leaves a group of one.
  EXPECT_EQ(self.stats().bytes_received, 0);
  self.Abort();
  const absl::Status aborted =
      self.AllReduce(buffer->data(), 1, DataType::kFloat32, ReduceOp::kSum, kTimeout);
  EXPECT_TRUE(absl::IsCancelled(aborted)) << aborted;
}

}  // namespace
}  // namespace stagecoach::collectives::testing::nccl_collectives_test
