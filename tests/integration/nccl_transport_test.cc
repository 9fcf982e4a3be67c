// The NCCL backend: the transport conformance suite with one rank per GPU (ranks as threads,
// device memory, one InMemoryStore), multi-GPU transfers in an order NCCL can run, per-link
// communicators (NcclOptions::links) with pipeline posting orders, and NCCL's own behaviour on
// one GPU with a one-rank communicator sending to itself. Without NCCL in the build or without
// a CUDA device every test skips (and CTest reports it skipped), except the validation of
// links, which needs no device.
#include <algorithm>
#include <atomic>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/transport_conformance.h"
#include "worker/runtime/executor/message_tags.h"
#include "worker/transport/in_memory_store.h"
#include "worker/transport/nccl/factory.h"
#include "worker/transport/transport.h"

#if STAGECOACH_HAVE_NCCL
#include <cuda_runtime_api.h>
#endif

namespace stagecoach::transport::testing::nccl_transport_test {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr absl::Duration kWait = absl::Seconds(20);
constexpr absl::Duration kPrompt = absl::Seconds(3);
// NCCL's first communicator in a process takes a while (topology detection).
constexpr absl::Duration kConnect = absl::Seconds(60);

// Why the NCCL tests cannot run here; empty when they can.
std::string UnavailableReason() {
  if (!NcclBuilt()) return "this build has no NCCL (STAGECOACH_HAVE_NCCL=0)";
  if (CudaDeviceCount() == 0) return "no CUDA device is visible";
  return "";
}

#if STAGECOACH_HAVE_NCCL

void ExpectCuda(cudaError_t error, const char* call) {
  EXPECT_EQ(error, cudaSuccess) << call << ": " << cudaGetErrorString(error);
}

// Makes `device` current for the scope.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    ExpectCuda(cudaGetDevice(&previous_), "cudaGetDevice");
    ExpectCuda(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceScope() { cudaSetDevice(previous_); }

 private:
  int previous_ = 0;
};

// Device memory on `device`. Allocation, copies and frees go through the device's legacy
// default stream, the transports' compute stream here: they are ordered with the transfers,
// and freeing never waits for the whole device (where memory pools exist).
class DeviceBuffer final : public TestBuffer {
 public:
  DeviceBuffer(size_t bytes, int device) : bytes_(bytes), device_(device) {
    if (bytes == 0) return;
    DeviceScope scope(device_);
    int pools = 0;
    cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device_);
    async_ = pools != 0;
    ExpectCuda(
        async_ ? cudaMallocAsync(&data_, bytes, cudaStreamLegacy) : cudaMalloc(&data_, bytes),
        "cudaMalloc");
    // Usable from any stream from now on.
    ExpectCuda(cudaStreamSynchronize(cudaStreamLegacy), "cudaStreamSynchronize");
  }
  ~DeviceBuffer() override {
    if (data_ == nullptr) return;
    DeviceScope scope(device_);
    ExpectCuda(async_ ? cudaFreeAsync(data_, cudaStreamLegacy) : cudaFree(data_), "cudaFree");
  }
  void* data() override { return data_; }
  size_t size() const override { return bytes_; }
  void Write(const std::vector<uint8_t>& bytes) override {
    const size_t n = std::min(bytes.size(), bytes_);
    if (n == 0) return;
    DeviceScope scope(device_);
    ExpectCuda(cudaMemcpy(data_, bytes.data(), n, cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  std::vector<uint8_t> Read() const override {
    std::vector<uint8_t> out(bytes_);
    if (bytes_ == 0) return out;
    DeviceScope scope(device_);
    ExpectCuda(cudaMemcpy(out.data(), data_, bytes_, cudaMemcpyDeviceToHost), "cudaMemcpy");
    return out;
  }

 private:
  const size_t bytes_;
  const int device_;
  bool async_ = false;
  void* data_ = nullptr;
};

// A non-blocking stream on `device`, as void* (cudaStream_t).
void* CreateStream(int device) {
  DeviceScope scope(device);
  cudaStream_t stream = nullptr;
  ExpectCuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  return stream;
}
void DestroyStream(void* stream) {
  ExpectCuda(cudaStreamDestroy(static_cast<cudaStream_t>(stream)), "cudaStreamDestroy");
}
void MemsetAsync(void* data, int value, size_t bytes, void* stream) {
  ExpectCuda(cudaMemsetAsync(data, value, bytes, static_cast<cudaStream_t>(stream)),
             "cudaMemsetAsync");
}
// Copies `bytes` at `data` to the host on `stream` and waits for the stream.
std::vector<uint8_t> ReadOnStream(const void* data, size_t bytes, void* stream) {
  std::vector<uint8_t> out(bytes);
  auto s = static_cast<cudaStream_t>(stream);
  ExpectCuda(cudaMemcpyAsync(out.data(), data, bytes, cudaMemcpyDeviceToHost, s),
             "cudaMemcpyAsync");
  ExpectCuda(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  return out;
}

std::unique_ptr<TestBuffer> AllocateDeviceBuffer(size_t bytes, int rank) {
  return std::make_unique<DeviceBuffer>(bytes, rank);  // Rank r runs on GPU r.
}

#else  // Never called: every test skips first.

std::unique_ptr<TestBuffer> AllocateDeviceBuffer(size_t bytes, int rank) {
  return AllocateHostBuffer(bytes, rank);
}
void* CreateStream(int) { return nullptr; }
void DestroyStream(void*) {}
void MemsetAsync(void*, int, size_t, void*) {}
std::vector<uint8_t> ReadOnStream(const void*, size_t bytes, void*) {
  return std::vector<uint8_t>(bytes);
}

#endif  // STAGECOACH_HAVE_NCCL

// Creates `world_size` NCCL transports, rank r on GPU r with links(r) (none when null), each
// connecting on a thread of its own through one InMemoryStore (each group under a key prefix
// of its own).
absl::StatusOr<std::vector<std::unique_ptr<Transport>>> CreateNcclGroup(
    int world_size, const std::function<std::vector<NcclLink>(int rank)>& links = nullptr) {
  static std::atomic<int> groups{0};
  const std::string prefix = absl::StrCat("nccl_group", groups++, "/");
  InMemoryStore store;
  return CreateGroupOnThreads(world_size, [&](int rank) {
    NcclOptions options;
    options.rank = rank;
    options.world_size = world_size;
    options.cuda_device = rank;
    options.key_prefix = prefix;
    options.connect_timeout = kConnect;
    if (links != nullptr) options.links = links(rank);
    return CreateNcclTransport(options, &store);
  });
}

TransportBackend NcclBackend() {
  TransportBackend backend;
  backend.name = "Nccl";
  backend.create_group = [](int world_size) { return CreateNcclGroup(world_size); };
  backend.allocate = AllocateDeviceBuffer;
  backend.max_world_size = CudaDeviceCount();  // NCCL refuses two ranks on one GPU.
  backend.unavailable = UnavailableReason();
  backend.capabilities = NcclDescriptor().capabilities;
  return backend;
}

INSTANTIATE_TEST_SUITE_P(Nccl, TransportConformanceTest, ::testing::Values(NcclBackend()),
                         BackendName);

class NcclTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string reason = UnavailableReason();
    if (!reason.empty()) GTEST_SKIP() << reason;
  }

  // A one-rank transport on GPU 0 (into self_).
  void CreateSelf(void* compute_stream = nullptr) {
    NcclOptions options;
    options.key_prefix = absl::StrCat("self", next_prefix_++, "/");
    options.connect_timeout = kConnect;
    options.compute_stream = compute_stream;
    auto created = CreateNcclTransport(options, &store_);
    ASSERT_TRUE(created.ok()) << created.status();
    self_ = std::move(created).value();
  }

  InMemoryStore store_;
  int next_prefix_ = 0;
  std::unique_ptr<Transport> self_;
};

TEST_F(NcclTransportTest, WorldOfOneSendsToItself) {
  ASSERT_NO_FATAL_FAILURE(CreateSelf());
  EXPECT_EQ(self_->backend(), "nccl");
  EXPECT_EQ(self_->rank(), 0);
  EXPECT_EQ(self_->world_size(), 1);
  int64_t total = 0;
  for (size_t bytes : {size_t{1} << 10, size_t{64} << 20}) {
    SCOPED_TRACE(absl::StrCat(bytes, " bytes"));
    const std::vector<uint8_t> data = Pattern(bytes, static_cast<uint32_t>(bytes));
    auto out = AllocateDeviceBuffer(bytes, 0);
    auto in = AllocateDeviceBuffer(bytes, 0);
    out->Write(data);
    in->Write(std::vector<uint8_t>(bytes, 0));
    SC_ASSIGN_WORK(send, self_->Send(out->data(), bytes, 0, 1));
    SC_ASSIGN_WORK(recv, self_->Recv(in->data(), bytes, 0, 1));
    SC_ASSERT_OK(recv->Wait(kWait));
    SC_ASSERT_OK(send->Wait(kWait));
    EXPECT_TRUE(in->Read() == data) << "payload differs";
    SC_ASSERT_OK(send->Wait(absl::ZeroDuration()));  // Again after OK: OK at once.
    total += static_cast<int64_t>(bytes);
    EXPECT_EQ(self_->stats().bytes_sent, total);
    EXPECT_EQ(self_->stats().bytes_received, total);
  }
  SC_ASSERT_OK(self_->Barrier(kWait));
  EXPECT_EQ(self_->stats().bytes_sent, total);  // Barriers count nothing.
  const absl::Time start = absl::Now();
  self_.reset();
  EXPECT_LT(absl::Now() - start, kPrompt);
}

// A self-transfer is held until both halves are posted; the receive may come first, and a wait
// before the send is posted times out without harm.
TEST_F(NcclTransportTest, SelfReceivePostedFirst) {
  ASSERT_NO_FATAL_FAILURE(CreateSelf());
  const std::vector<uint8_t> data = Pattern(4096, 7);
  auto out = AllocateDeviceBuffer(data.size(), 0);
  auto in = AllocateDeviceBuffer(data.size(), 0);
  out->Write(data);
  SC_ASSIGN_WORK(recv, self_->Recv(in->data(), data.size(), 0, 0x3b));
  const absl::Time start = absl::Now();
  const absl::Status early = recv->Wait(absl::Milliseconds(150));
  const absl::Duration waited = absl::Now() - start;
  EXPECT_EQ(early.code(), absl::StatusCode::kDeadlineExceeded) << early;
  EXPECT_THAT(std::string(early.message()),
              AllOf(HasSubstr("rank 0: receive from rank 0"), HasSubstr("0x3b"), HasSubstr("4096"),
                    HasSubstr("150ms"), HasSubstr("no send with this tag")));
  EXPECT_GE(waited, absl::Milliseconds(150));
  EXPECT_LT(waited, kPrompt);
  SC_ASSIGN_WORK(send, self_->Send(out->data(), data.size(), 0, 0x3b));
  SC_ASSERT_OK(recv->Wait(kWait));
  SC_ASSERT_OK(send->Wait(kWait));
  EXPECT_EQ(in->Read(), data);
}

TEST_F(NcclTransportTest, SelfTransfersPairByTagThenInPostingOrder) {
  ASSERT_NO_FATAL_FAILURE(CreateSelf());
  struct Message {
    uint64_t tag;
    std::vector<uint8_t> data;
  };
  // Sizes differ, so a wrong pairing fails loudly.
  const std::vector<Message> messages = {
      {5, Pattern(1000, 1)}, {6, Pattern(2000, 2)}, {5, Pattern(1010, 3)}, {6, Pattern(2020, 4)}};
  std::vector<std::unique_ptr<TestBuffer>> out, in;
  std::vector<std::unique_ptr<Work>> works;
  for (const Message& m : messages) {
    out.push_back(AllocateDeviceBuffer(m.data.size(), 0));
    out.back()->Write(m.data);
    in.push_back(AllocateDeviceBuffer(m.data.size(), 0));
    SC_ASSIGN_WORK(send, self_->Send(out.back()->data(), m.data.size(), 0, m.tag));
    works.push_back(std::move(send));
  }
  for (size_t i : {1, 3, 0, 2}) {  // Tag 6, then tag 5; per tag in posting order.
    SC_ASSIGN_WORK(recv, self_->Recv(in[i]->data(), messages[i].data.size(), 0, messages[i].tag));
    works.push_back(std::move(recv));
  }
  for (auto& work : works) SC_ASSERT_OK(work->Wait(kWait));
  for (size_t i = 0; i < messages.size(); ++i) EXPECT_EQ(in[i]->Read(), messages[i].data) << i;
}

TEST_F(NcclTransportTest, SelfSizeMismatchFailsBothHalves) {
  ASSERT_NO_FATAL_FAILURE(CreateSelf());
  auto out = AllocateDeviceBuffer(200, 0);
  auto in = AllocateDeviceBuffer(100, 0);
  in->Write(std::vector<uint8_t>(100, 0));
  SC_ASSIGN_WORK(send, self_->Send(out->data(), 200, 0, 9));
  SC_ASSIGN_WORK(recv, self_->Recv(in->data(), 100, 0, 9));
  const absl::Status recv_status = recv->Wait(kWait);
  EXPECT_EQ(recv_status.code(), absl::StatusCode::kInternal) << recv_status;
  EXPECT_THAT(std::string(recv_status.message()),
              HasSubstr("rank 0: receive from rank 0 (tag 0x9, 100 bytes) failed: expected 100 "
                        "bytes from rank 0 tag 0x9, got 200"));
  const absl::Status send_status = send->Wait(kWait);
  EXPECT_EQ(send_status.code(), absl::StatusCode::kInternal) << send_status;
  EXPECT_THAT(std::string(send_status.message()),
              HasSubstr("rank 0 expected 100 bytes for tag 0x9, this send has 200"));
  EXPECT_EQ(in->Read(), std::vector<uint8_t>(100, 0)) << "nothing may be written on a mismatch";
  // The transport still works.
  const std::vector<uint8_t> data = Pattern(100, 3);
  out->Write(data);
  SC_ASSIGN_WORK(send2, self_->Send(out->data(), 100, 0, 9));
  SC_ASSIGN_WORK(recv2, self_->Recv(in->data(), 100, 0, 9));
  SC_ASSERT_OK(recv2->Wait(kWait));
  SC_ASSERT_OK(send2->Wait(kWait));
  EXPECT_EQ(in->Read(), data);
}

TEST_F(NcclTransportTest, ZeroByteTransfersCompleteAtOnce) {
  ASSERT_NO_FATAL_FAILURE(CreateSelf());
  SC_ASSIGN_WORK(send, self_->Send(nullptr, 0, 0, 1));
  SC_ASSERT_OK(send->Wait(absl::ZeroDuration()));
  SC_ASSIGN_WORK(recv, self_->Recv(nullptr, 0, 0, 1));
  SC_ASSERT_OK(recv->Wait(absl::ZeroDuration()));
}

TEST_F(NcclTransportTest, TimedOutSendStaysPostedAndCompletesLater) {
  ASSERT_NO_FATAL_FAILURE(CreateSelf());
  const std::vector<uint8_t> data = Pattern(2048, 11);
  auto out = AllocateDeviceBuffer(data.size(), 0);
  auto in = AllocateDeviceBuffer(data.size(), 0);
  out->Write(data);
  SC_ASSIGN_WORK(send, self_->Send(out->data(), data.size(), 0, 0x3b));
  const absl::Time start = absl::Now();
  const absl::Status status = send->Wait(absl::Milliseconds(150));
  const absl::Duration waited = absl::Now() - start;
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_THAT(std::string(status.message()),
              AllOf(HasSubstr("rank 0: send to rank 0"), HasSubstr("0x3b"), HasSubstr("2048"),
                    HasSubstr("timed out after 150ms")));
  EXPECT_GE(waited, absl::Milliseconds(150));
  EXPECT_LT(waited, kPrompt);
  SC_ASSIGN_WORK(recv, self_->Recv(in->data(), data.size(), 0, 0x3b));
  SC_ASSERT_OK(send->Wait(kWait));
  SC_ASSERT_OK(recv->Wait(kWait));
  EXPECT_EQ(in->Read(), data);
}

TEST_F(NcclTransportTest, AbortCancelsPendingAndLaterWaits) {
  ASSERT_NO_FATAL_FAILURE(CreateSelf());
  auto out = AllocateDeviceBuffer(1024, 0);
  SC_ASSIGN_WORK(send, self_->Send(out->data(), 1024, 0, 1));  // Never received.
  absl::Status status;
  absl::Duration waited;
  std::thread waiter([&] {
    const absl::Time start = absl::Now();
    status = send->Wait(kWait);
    waited = absl::Now() - start;
  });
  absl::SleepFor(absl::Milliseconds(100));
  self_->Abort();
  self_->Abort();  // Idempotent.
  waiter.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled) << status;
  EXPECT_LT(waited, kPrompt + absl::Milliseconds(100));
  EXPECT_EQ(send->Wait(kWait).code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(self_->Barrier(kWait).code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(self_->Send(out->data(), 1024, 0, 2).status().code(), absl::StatusCode::kCancelled);
  const absl::Time start = absl::Now();
  self_.reset();
  EXPECT_LT(absl::Now() - start, kPrompt);
}

TEST_F(NcclTransportTest, WorksOutliveTheTransport) {
  ASSERT_NO_FATAL_FAILURE(CreateSelf());
  auto in = AllocateDeviceBuffer(64, 0);
  SC_ASSIGN_WORK(recv, self_->Recv(in->data(), 64, 0, 1));  // Never sent.
  const absl::Time start = absl::Now();
  self_.reset();  // Not aborted: still must not hang.
  EXPECT_LT(absl::Now() - start, kPrompt);
  EXPECT_EQ(recv->Wait(kWait).code(), absl::StatusCode::kCancelled);
}

// Send and Recv order against the compute stream: the send moves what the stream had written
// when it was posted, the receive lands after what the stream did before it was posted, and
// work queued on the stream after a successful Wait sees the received bytes.
TEST_F(NcclTransportTest, OrdersAgainstTheComputeStream) {
  void* stream = CreateStream(0);
  ASSERT_NO_FATAL_FAILURE(CreateSelf(stream));
  constexpr size_t kBytes = size_t{64} << 20;
  auto out = AllocateDeviceBuffer(kBytes, 0);
  auto in = AllocateDeviceBuffer(kBytes, 0);
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    const int value = 0x11 * (round + 1);
    // No host synchronization between these calls.
    MemsetAsync(out->data(), value, kBytes, stream);
    MemsetAsync(in->data(), 0, kBytes, stream);
    SC_ASSIGN_WORK(send, self_->Send(out->data(), kBytes, 0, 1));
    SC_ASSIGN_WORK(recv, self_->Recv(in->data(), kBytes, 0, 1));
    SC_ASSERT_OK(recv->Wait(kWait));
    SC_ASSERT_OK(send->Wait(kWait));
    MemsetAsync(out->data(), 0xff, kBytes, stream);  // After the send: must not leak into it.
    const std::vector<uint8_t> received = ReadOnStream(in->data(), kBytes, stream);
    EXPECT_TRUE(received == std::vector<uint8_t>(kBytes, static_cast<uint8_t>(value)));
  }
  self_.reset();
  in.reset();
  out.reset();
  DestroyStream(stream);
}

TEST_F(NcclTransportTest, ManyTransfersThenGracefulTeardown) {
  ASSERT_NO_FATAL_FAILURE(CreateSelf());
  constexpr int kMessages = 200;
  std::vector<std::unique_ptr<TestBuffer>> out, in;
  std::vector<std::unique_ptr<Work>> works;
  for (int i = 0; i < kMessages; ++i) {
    out.push_back(AllocateDeviceBuffer(4096, 0));
    out.back()->Write(Pattern(4096, i));
    in.push_back(AllocateDeviceBuffer(4096, 0));
    SC_ASSIGN_WORK(send, self_->Send(out.back()->data(), 4096, 0, i));
    SC_ASSIGN_WORK(recv, self_->Recv(in.back()->data(), 4096, 0, i));
    works.push_back(std::move(send));
    works.push_back(std::move(recv));
  }
  for (auto& work : works) SC_ASSERT_OK(work->Wait(kWait));
  for (int i = 0; i < kMessages; ++i) ASSERT_EQ(in[i]->Read(), Pattern(4096, i)) << i;
  EXPECT_EQ(self_->stats().bytes_sent, int64_t{kMessages} * 4096);
  const absl::Time start = absl::Now();
  self_.reset();
  EXPECT_LT(absl::Now() - start, kPrompt);
}

TEST_F(NcclTransportTest, RejectsBadOptionsAndPeers) {
  NcclOptions options;
  options.world_size = 2;
  EXPECT_EQ(CreateNcclTransport(options, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  for (auto [rank, world] : {std::pair{2, 2}, std::pair{-1, 2}, std::pair{0, 0}}) {
    options.rank = rank;
    options.world_size = world;
    EXPECT_EQ(CreateNcclTransport(options, &store_).status().code(),
              absl::StatusCode::kInvalidArgument)
        << rank << " of " << world;
  }
  options.rank = 0;
  options.world_size = 1;
  options.connect_timeout = absl::ZeroDuration();
  EXPECT_EQ(CreateNcclTransport(options, &store_).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.connect_timeout = kConnect;
  options.cuda_device = CudaDeviceCount();
  auto no_device = CreateNcclTransport(options, &store_);
  EXPECT_EQ(no_device.status().code(), absl::StatusCode::kInvalidArgument) << no_device.status();
  EXPECT_THAT(std::string(no_device.status().message()), HasSubstr("cuda_device"));

  ASSERT_NO_FATAL_FAILURE(CreateSelf());
  auto buffer = AllocateDeviceBuffer(16, 0);
  for (int peer : {-1, 1, 100}) {
    EXPECT_EQ(self_->Send(buffer->data(), 16, peer, 1).status().code(),
              absl::StatusCode::kInvalidArgument)
        << peer;
    EXPECT_EQ(self_->Recv(buffer->data(), 16, peer, 1).status().code(),
              absl::StatusCode::kInvalidArgument)
        << peer;
  }
  EXPECT_EQ(self_->Send(nullptr, 16, 0, 1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(NcclTransportTest, RendezvousTimesOutWithoutRankZero) {
  NcclOptions options;
  options.rank = 1;
  options.world_size = 2;  // Rank 0 never comes.
  options.key_prefix = "lonely/";
  options.connect_timeout = absl::Milliseconds(300);
  const absl::Time start = absl::Now();
  auto transport = CreateNcclTransport(options, &store_);
  const absl::Duration waited = absl::Now() - start;
  EXPECT_EQ(transport.status().code(), absl::StatusCode::kDeadlineExceeded) << transport.status();
  EXPECT_THAT(std::string(transport.status().message()),
              AllOf(HasSubstr("rank 1"), HasSubstr("lonely/nccl_unique_id")));
  EXPECT_GE(waited, absl::Milliseconds(300));
  EXPECT_LT(waited, kPrompt);
}

TEST_F(NcclTransportTest, CommunicatorTimesOutWhenARankNeverJoins) {
  NcclOptions options;
  options.rank = 0;
  options.world_size = 2;  // Rank 1 never comes.
  options.key_prefix = "half/";
  options.connect_timeout = absl::Seconds(2);
  const absl::Time start = absl::Now();
  auto transport = CreateNcclTransport(options, &store_);
  const absl::Duration waited = absl::Now() - start;
  EXPECT_EQ(transport.status().code(), absl::StatusCode::kDeadlineExceeded) << transport.status();
  EXPECT_THAT(std::string(transport.status().message()),
              AllOf(HasSubstr("rank 0"), HasSubstr("not every one of the 2 ranks joined")));
  EXPECT_GE(waited, absl::Seconds(2));
  EXPECT_LT(waited, absl::Seconds(2) + kPrompt);
  EXPECT_TRUE(store_.Get("half/nccl_unique_id", absl::ZeroDuration()).ok());
}

// With two or more GPUs: every pair of ranks exchanges 8 MiB (more than NCCL buffers), each
// rank posting its transfers in one global order of the pairs, the order NCCL needs.
TEST_F(NcclTransportTest, RanksExchangeInOneGlobalOrder) {
  const int ranks = std::min(CudaDeviceCount(), 4);
  if (ranks < 2) GTEST_SKIP() << "needs two CUDA devices, found " << ranks;
  auto created = CreateNcclGroup(ranks);
  ASSERT_TRUE(created.ok()) << created.status();
  std::vector<std::unique_ptr<Transport>> t = std::move(created).value();
  constexpr size_t kBytes = size_t{8} << 20;
  auto message = [](int from, int to) { return Pattern(kBytes, 100 * from + to); };
  std::vector<std::vector<std::unique_ptr<TestBuffer>>> out(ranks), in(ranks);
  for (int rank = 0; rank < ranks; ++rank) {
    for (int peer = 0; peer < ranks; ++peer) {
      out[rank].push_back(AllocateDeviceBuffer(peer == rank ? 0 : kBytes, rank));
      in[rank].push_back(AllocateDeviceBuffer(peer == rank ? 0 : kBytes, rank));
      if (peer != rank) out[rank][peer]->Write(message(rank, peer));
    }
  }
  std::vector<std::thread> threads;
  for (int rank = 0; rank < ranks; ++rank) {
    threads.emplace_back([&, rank] {
      std::vector<std::unique_ptr<Work>> works;
      auto post = [&](absl::StatusOr<std::unique_ptr<Work>> work) {
        ASSERT_TRUE(work.ok()) << work.status();
        works.push_back(std::move(work).value());
      };
      for (int a = 0; a < ranks; ++a) {
        for (int b = a + 1; b < ranks; ++b) {
          if (rank == a) {
            post(t[a]->Send(out[a][b]->data(), kBytes, b, 1));
            post(t[a]->Recv(in[a][b]->data(), kBytes, b, 1));
          } else if (rank == b) {
            post(t[b]->Recv(in[b][a]->data(), kBytes, a, 1));
            post(t[b]->Send(out[b][a]->data(), kBytes, a, 1));
          }
        }
      }
      for (auto& work : works) {
        const absl::Status status = work->Wait(kWait);
        EXPECT_TRUE(status.ok()) << status;
      }
      const absl::Status barrier = t[rank]->Barrier(kWait);
      EXPECT_TRUE(barrier.ok()) << barrier;
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int rank = 0; rank < ranks; ++rank) {
    for (int peer = 0; peer < ranks; ++peer) {
      if (peer == rank) continue;
      EXPECT_TRUE(in[rank][peer]->Read() == message(peer, rank)) << peer << " -> " << rank;
    }
  }
  threads.clear();
  for (int rank = 0; rank < ranks; ++rank) threads.emplace_back([&, rank] { t[rank].reset(); });
  for (std::thread& thread : threads) thread.join();
}

// Per-link communicators (NcclOptions::links), with the executor's tags.
using runtime::LinkOf;
using runtime::MessageTag;
using runtime::Payload;

NcclLink LinkTo(Payload payload, int edge, int peer) {
  return NcclLink{LinkOf(MessageTag(payload, edge, 0)), peer};
}

std::vector<NcclLink> ToNcclLinks(const std::vector<runtime::Link>& links) {
  std::vector<NcclLink> out;
  for (const runtime::Link& link : links) out.push_back(NcclLink{link.link, link.peer});
  return out;
}

// Links are checked before CreateNcclTransport touches the store or CUDA, so this runs
// wherever NCCL is built, with or without a device.
TEST(NcclLinkOptionsTest, RejectsBadLinks) {
  if (!NcclBuilt()) GTEST_SKIP() << UnavailableReason();
  EXPECT_EQ(runtime::kLinkShift, NcclOptions().link_shift);
  InMemoryStore store;
  NcclOptions options;
  options.rank = 0;
  options.world_size = 2;
  options.key_prefix = "bad_links/";
  options.connect_timeout = absl::Milliseconds(200);
  const uint64_t act = LinkOf(MessageTag(Payload::kActivation, 0, 0));
  struct Case {
    std::vector<NcclLink> links;
    int link_shift;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{{act, 0}}, 28, "links[0] (link 0x10000000 with rank 0): the peer is this rank"},
      {{{act, 1}, {act, 2}},
       28,
       "links[1] (link 0x10000000 with rank 2): the peer is not in [0, 2)"},
      {{{act, -1}}, 28, "the peer is not in [0, 2)"},
      {{{act, 1}, {act + 1, 1}, {act, 1}},
       28,
       "links[2] (link 0x10000000 with rank 1): listed twice"},
      // A tag where a link belongs.
      {{{MessageTag(Payload::kGradient, 3, 0), 1}}, 28, "no tag has this link"},
      {{{act, 1}}, 64, "link_shift 64 is not in [0, 64)"},
      {{{act, 1}}, -1, "link_shift -1 is not in [0, 64)"},
      {{}, 64, "link_shift 64"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    options.links = c.links;
    options.link_shift = c.link_shift;
    const absl::Time start = absl::Now();
    auto created = CreateNcclTransport(options, &store);
    EXPECT_EQ(created.status().code(), absl::StatusCode::kInvalidArgument) << created.status();
    EXPECT_THAT(std::string(created.status().message()),
                AllOf(HasSubstr("rank 0"), HasSubstr(c.message)));
    EXPECT_LT(absl::Now() - start, absl::Milliseconds(100)) << "must fail before connecting";
  }
  EXPECT_FALSE(store.Get("bad_links/nccl_unique_id", absl::ZeroDuration()).ok());
}

// Two ranks on two GPUs, each with the links of the pipeline boundary 0 | 1.
class NcclLinkTest : public NcclTransportTest {
 protected:
  void SetUp() override {
    NcclTransportTest::SetUp();
    if (IsSkipped()) return;
    if (CudaDeviceCount() < 2) {
      GTEST_SKIP() << "needs two CUDA devices (NCCL refuses two ranks on one GPU), found "
                   << CudaDeviceCount();
    }
  }

  void CreatePair(const std::function<std::vector<NcclLink>(int rank)>& links) {
    auto created = CreateNcclGroup(2, links);
    ASSERT_TRUE(created.ok()) << created.status();
    t_ = std::move(created).value();
  }

  // Runs fn(rank) for both ranks at once, each on a thread of its own.
  static void RunBoth(const std::function<void(int rank)>& fn) {
    std::thread other([&] { fn(1); });
    fn(0);
    other.join();
  }

  // Destroys both transports at once (each finalizes its communicators, bounded by a few
  // seconds inside the transport; a hang would show here).
  void DestroyPair() {
    RunBoth([&](int rank) {
      const absl::Time start = absl::Now();
      t_[rank].reset();
      EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << "rank " << rank;
    });
  }

  std::vector<std::unique_ptr<Transport>> t_;
};

// 1F1B's steady state on two stages: stage 0 sends the activation of one microbatch, then
// receives the gradient of another, while stage 1 sends that gradient, then receives the
// activation. One communicator runs each rank's send first and deadlocks on messages larger
// than NCCL buffers; with a communicator per link the transfers cross.
TEST_F(NcclLinkTest, OneFOneBCrossCompletesWithLargeMessages) {
  ASSERT_NO_FATAL_FAILURE(CreatePair([](int rank) {
    return std::vector<NcclLink>{LinkTo(Payload::kActivation, 0, 1 - rank),
                                 LinkTo(Payload::kGradient, 0, 1 - rank)};
  }));
  constexpr size_t kBytes = size_t{16} << 20;
  constexpr int kRounds = 4;
  auto data = [](Payload payload, int microbatch) {
    return Pattern(kBytes, 1000 * static_cast<uint32_t>(payload) + microbatch);
  };
  // Rank 0 sends activations and receives gradients; rank 1 the other way round.
  std::vector<std::unique_ptr<TestBuffer>> out[2], in[2];
  for (int k = 0; k < kRounds; ++k) {
    for (int rank : {0, 1}) {
      out[rank].push_back(AllocateDeviceBuffer(kBytes, rank));
      out[rank].back()->Write(data(rank == 0 ? Payload::kActivation : Payload::kGradient, k));
      in[rank].push_back(AllocateDeviceBuffer(kBytes, rank));
    }
  }
  RunBoth([&](int rank) {
    const Payload sent = rank == 0 ? Payload::kActivation : Payload::kGradient;
    const Payload received = rank == 0 ? Payload::kGradient : Payload::kActivation;
    for (int k = 0; k < kRounds; ++k) {
      SCOPED_TRACE(absl::StrCat("rank ", rank, " round ", k));
      SC_ASSIGN_WORK(
          send, t_[rank]->Send(out[rank][k]->data(), kBytes, 1 - rank, MessageTag(sent, 0, k)));
      SC_ASSIGN_WORK(
          recv, t_[rank]->Recv(in[rank][k]->data(), kBytes, 1 - rank, MessageTag(received, 0, k)));
      SC_ASSERT_OK(recv->Wait(kWait));
      SC_ASSERT_OK(send->Wait(kWait));
    }
  });
  for (int k = 0; k < kRounds; ++k) {
    EXPECT_TRUE(in[1][k]->Read() == data(Payload::kActivation, k)) << "activation " << k;
    EXPECT_TRUE(in[0][k]->Read() == data(Payload::kGradient, k)) << "gradient " << k;
  }
  for (int rank : {0, 1}) {
    EXPECT_EQ(t_[rank]->stats().bytes_sent, int64_t{kRounds} * int64_t{kBytes});
    EXPECT_EQ(t_[rank]->stats().bytes_received, int64_t{kRounds} * int64_t{kBytes});
  }

  // A tag of a link that is not configured (shape messages; another boundary) is refused.
  auto buffer = AllocateDeviceBuffer(16, 0);
  for (uint64_t tag :
       {MessageTag(Payload::kShapes, 0, 0), MessageTag(Payload::kActivation, 1, 0), uint64_t{7}}) {
    SCOPED_TRACE(absl::StrFormat("tag 0x%x", tag));
    for (auto status : {t_[0]->Send(buffer->data(), 16, 1, tag).status(),
                        t_[0]->Recv(buffer->data(), 16, 1, tag).status()}) {
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
      EXPECT_THAT(std::string(status.message()),
                  AllOf(HasSubstr(absl::StrFormat("link 0x%x", LinkOf(tag))),
                        HasSubstr("with rank 1 is not one of this transport's links")));
    }
  }
  EXPECT_EQ(
      t_[0]->Send(buffer->data(), 16, 0, MessageTag(Payload::kActivation, 0, 0)).status().code(),
      absl::StatusCode::kInvalidArgument);
  buffer.reset();

  RunBoth([&](int rank) { SC_ASSERT_OK(t_[rank]->Barrier(kWait)); });
  DestroyPair();
}

// Stages 0 and 2 on rank 0, stages 1 and 3 on rank 1 (an interleaved placement): rank 0 sends
// over boundaries 0|1 and 2|3 and receives over 1|2. Each side posts the boundaries in another
// order; every message must land in the buffer of its own boundary and microbatch.
TEST_F(NcclLinkTest, BoundariesPostedInDifferentOrdersStayApart) {
  const std::vector<int> stage_to_rank = {0, 1, 0, 1};
  ASSERT_NO_FATAL_FAILURE(CreatePair([&](int rank) {
    return ToNcclLinks(runtime::LinksOfRank(stage_to_rank, rank, /*forward_only=*/true));
  }));
  constexpr int kMicrobatches = 3;
  for (size_t bytes : {size_t{64} << 10, size_t{16} << 20}) {
    SCOPED_TRACE(absl::StrCat(bytes, " bytes"));
    auto data = [&](int edge, int microbatch) {
      return Pattern(bytes, static_cast<uint32_t>(100 * edge + microbatch));
    };
    // [edge][microbatch] on the sending and on the receiving rank (all the same size).
    std::unique_ptr<TestBuffer> out[3][kMicrobatches], in[3][kMicrobatches];
    for (int edge = 0; edge < 3; ++edge) {
      const int from = stage_to_rank[edge];
      for (int mb = 0; mb < kMicrobatches; ++mb) {
        out[edge][mb] = AllocateDeviceBuffer(bytes, from);
        out[edge][mb]->Write(data(edge, mb));
        in[edge][mb] = AllocateDeviceBuffer(bytes, 1 - from);
      }
    }
    auto tag = [](int edge, int mb) { return MessageTag(Payload::kActivation, edge, mb); };
    RunBoth([&](int rank) {
      Transport& t = *t_[rank];
      const int peer = 1 - rank;
      std::vector<std::unique_ptr<Work>> works;
      auto post = [&](absl::StatusOr<std::unique_ptr<Work>> work) {
        ASSERT_TRUE(work.ok()) << work.status();
        works.push_back(std::move(work).value());
      };
      if (rank == 0) {
        // Boundaries 0|1 and 2|3 alternately, then all of 1|2.
        for (int mb = 0; mb < kMicrobatches; ++mb) {
          post(t.Send(out[0][mb]->data(), bytes, peer, tag(0, mb)));
          post(t.Send(out[2][mb]->data(), bytes, peer, tag(2, mb)));
        }
        for (int mb = 0; mb < kMicrobatches; ++mb) {
          post(t.Recv(in[1][mb]->data(), bytes, peer, tag(1, mb)));
        }
      } else {
        // All of 2|3 (interleaved with sends over 1|2) before any of 0|1.
        for (int mb = 0; mb < kMicrobatches; ++mb) {
          post(t.Recv(in[2][mb]->data(), bytes, peer, tag(2, mb)));
          post(t.Send(out[1][mb]->data(), bytes, peer, tag(1, mb)));
        }
        for (int mb = 0; mb < kMicrobatches; ++mb) {
          post(t.Recv(in[0][mb]->data(), bytes, peer, tag(0, mb)));
        }
      }
      for (auto& work : works) {
        const absl::Status status = work->Wait(kWait);
        EXPECT_TRUE(status.ok()) << "rank " << rank << ": " << status;
      }
    });
    for (int edge = 0; edge < 3; ++edge) {
      for (int mb = 0; mb < kMicrobatches; ++mb) {
        EXPECT_TRUE(in[edge][mb]->Read() == data(edge, mb))
            << "boundary " << edge << "|" << edge + 1 << " microbatch " << mb;
      }
    }
  }
  RunBoth([&](int rank) { SC_ASSERT_OK(t_[rank]->Barrier(kWait)); });
  DestroyPair();
}

// Abort reaches every link's communicator: waits on two links are both cancelled promptly.
TEST_F(NcclLinkTest, AbortCancelsWaitsOnEveryLink) {
  ASSERT_NO_FATAL_FAILURE(CreatePair([](int rank) {
    return std::vector<NcclLink>{LinkTo(Payload::kActivation, 0, 1 - rank),
                                 LinkTo(Payload::kGradient, 0, 1 - rank)};
  }));
  auto act = AllocateDeviceBuffer(1024, 0);
  auto grad = AllocateDeviceBuffer(1024, 0);
  // Never sent.
  SC_ASSIGN_WORK(recv_act,
                 t_[0]->Recv(act->data(), 1024, 1, MessageTag(Payload::kActivation, 0, 0)));
  SC_ASSIGN_WORK(recv_grad,
                 t_[0]->Recv(grad->data(), 1024, 1, MessageTag(Payload::kGradient, 0, 0)));
  const absl::Status early = recv_grad->Wait(absl::Milliseconds(100));
  EXPECT_EQ(early.code(), absl::StatusCode::kDeadlineExceeded) << early;
  EXPECT_THAT(
      std::string(early.message()),
      AllOf(HasSubstr("rank 0: receive from rank 1"),
            HasSubstr(absl::StrFormat("link 0x%x)", LinkOf(MessageTag(Payload::kGradient, 0, 0)))),
            HasSubstr("on this link")));
  absl::Status statuses[2];
  std::thread waiter([&] {
    statuses[0] = recv_act->Wait(kWait);
    statuses[1] = recv_grad->Wait(kWait);
  });
  absl::SleepFor(absl::Milliseconds(100));
  const absl::Time start = absl::Now();
  t_[0]->Abort();
  waiter.join();
  EXPECT_LT(absl::Now() - start, kPrompt);
  for (const absl::Status& status : statuses) {
    EXPECT_EQ(status.code(), absl::StatusCode::kCancelled) << status;
  }
  EXPECT_EQ(t_[0]->Barrier(kWait).code(), absl::StatusCode::kCancelled);
  const absl::Time destroyed = absl::Now();
  t_[0].reset();  // Aborted: nothing to finalize.
  EXPECT_LT(absl::Now() - destroyed, kPrompt);
  t_[1]->Abort();
  t_[1].reset();
}

}  // namespace
}  // namespace stagecoach::transport::testing::nccl_transport_test
