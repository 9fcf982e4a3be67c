#include "tests/integration/transport_conformance.h"

#include <algorithm>
#include <limits>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"

namespace stagecoach::transport::testing {
namespace {

using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::Eq;
using ::testing::HasSubstr;

// Generous bounds: long enough never to fire on a loaded machine, short enough that a hang
// fails the test quickly.
constexpr absl::Duration kWait = absl::Seconds(20);
// How promptly Abort, a timeout or a failure must wake a waiter.
constexpr absl::Duration kPrompt = absl::Seconds(3);

class HostBuffer final : public TestBuffer {
 public:
  explicit HostBuffer(size_t bytes) : bytes_(bytes) {}
  void* data() override { return bytes_.empty() ? nullptr : bytes_.data(); }
  size_t size() const override { return bytes_.size(); }
  void Write(const std::vector<uint8_t>& bytes) override {
    std::copy_n(bytes.begin(), std::min(bytes.size(), bytes_.size()), bytes_.begin());
  }
  std::vector<uint8_t> Read() const override { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

// Runs fn(rank) for every rank on a thread of its own and joins them.
void RunRanks(int world_size, const std::function<void(int rank)>& fn) {
  std::vector<std::thread> threads;
  threads.reserve(world_size);
  for (int rank = 0; rank < world_size; ++rank) threads.emplace_back(fn, rank);
  for (std::thread& thread : threads) thread.join();
}

// Destroys a group's transports concurrently (destruction may wait for peers) and checks
// that it does not hang.
void DestroyGroup(std::vector<std::unique_ptr<Transport>>* group) {
  const absl::Time start = absl::Now();
  RunRanks(static_cast<int>(group->size()), [&](int rank) { (*group)[rank].reset(); });
  EXPECT_LT(absl::Now() - start, kPrompt) << "destroying the transports took too long";
  group->clear();
}

#define SC_EXPECT_OK(expr)                      \
  do {                                          \
    const absl::Status sc_status_ = (expr);     \
    EXPECT_TRUE(sc_status_.ok()) << sc_status_; \
  } while (0)

// Creates the group into `group`, or skips the test when the backend cannot have that many.
#define SC_CREATE_GROUP_OR_SKIP(group, world_size)                                       \
  if ((world_size) > GetParam().max_world_size) {                                        \
    GTEST_SKIP() << GetParam().name << " supports at most " << GetParam().max_world_size \
                 << " ranks here";                                                       \
  }                                                                                      \
  ASSERT_NO_FATAL_FAILURE(CreateGroup((world_size), &(group)))

}  // namespace

std::unique_ptr<TestBuffer> AllocateHostBuffer(size_t bytes, int /*rank*/) {
  return std::make_unique<HostBuffer>(bytes);
}

absl::StatusOr<std::vector<std::unique_ptr<Transport>>> CreateGroupOnThreads(
    int world_size,
    const std::function<absl::StatusOr<std::unique_ptr<Transport>>(int rank)>& create) {
  std::vector<absl::StatusOr<std::unique_ptr<Transport>>> created(world_size);
  RunRanks(world_size, [&](int rank) { created[rank] = create(rank); });
  std::vector<std::unique_ptr<Transport>> group;
  for (auto& transport : created) {
    if (!transport.ok()) return transport.status();
    group.push_back(std::move(transport).value());
  }
  return group;
}

void PrintTo(const TransportBackend& backend, std::ostream* os) { *os << backend.name; }

std::string BackendName(const ::testing::TestParamInfo<TransportBackend>& info) {
  return info.param.name;
}

std::vector<uint8_t> Pattern(size_t bytes, uint32_t seed) {
  std::vector<uint8_t> out(bytes);
  uint32_t state = seed * 2654435761u + 1;
  for (size_t i = 0; i < bytes; ++i) {
    state = state * 1664525u + 1013904223u;
    out[i] = static_cast<uint8_t>(state >> 24);
  }
  return out;
}

void TransportConformanceTest::SetUp() {
  if (!GetParam().unavailable.empty()) {
    GTEST_SKIP() << GetParam().name << " is unavailable here: " << GetParam().unavailable;
  }
}

void TransportConformanceTest::CreateGroup(int world_size,
                                           std::vector<std::unique_ptr<Transport>>* group) {
  absl::StatusOr<std::vector<std::unique_ptr<Transport>>> created =
      GetParam().create_group(world_size);
  ASSERT_TRUE(created.ok()) << created.status();
  ASSERT_EQ(created->size(), static_cast<size_t>(world_size));
  *group = std::move(created).value();
}

std::unique_ptr<TestBuffer> TransportConformanceTest::Buffer(const std::vector<uint8_t>& contents,
                                                             int rank) {
  std::unique_ptr<TestBuffer> buffer = GetParam().allocate(contents.size(), rank);
  buffer->Write(contents);
  return buffer;
}

std::unique_ptr<TestBuffer> TransportConformanceTest::ZeroBuffer(size_t bytes, int rank) {
  return Buffer(std::vector<uint8_t>(bytes, 0), rank);
}

TEST_P(TransportConformanceTest, ReportsRankWorldSizeAndBackend) {
  std::vector<std::unique_ptr<Transport>> t;
  SC_CREATE_GROUP_OR_SKIP(t, 2);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(t[rank]->rank(), rank);
    EXPECT_EQ(t[rank]->world_size(), 2);
    // The transport names a registered backend and reports its capabilities.
    absl::StatusOr<BackendDescriptor> registered =
        BackendRegistry::Global().Find(t[rank]->backend());
    if (!registered.ok()) {
      ADD_FAILURE() << registered.status();
      continue;
    }
    const BackendCapabilities& caps = t[rank]->capabilities();
    const BackendCapabilities& expected = GetParam().capabilities;
    const BackendCapabilities* const wanted[] = {&registered->capabilities, &expected};
    for (const BackendCapabilities* c : wanted) {
      EXPECT_EQ(caps.takes_device_memory, c->takes_device_memory);
      EXPECT_EQ(caps.matches_tags, c->matches_tags);
      EXPECT_EQ(caps.detects_size_mismatch, c->detects_size_mismatch);
      EXPECT_EQ(caps.independent_transfers, c->independent_transfers);
      EXPECT_EQ(caps.needs_cuda, c->needs_cuda);
      EXPECT_EQ(caps.on_every_worker, c->on_every_worker);
    }
    EXPECT_EQ(t[rank]->stats().bytes_sent, 0);
    EXPECT_EQ(t[rank]->stats().bytes_received, 0);
  }
  DestroyGroup(&t);
}

TEST_P(TransportConformanceTest, SmallRoundTrip) {
  std::vector<std::unique_ptr<Transport>> t;
  SC_CREATE_GROUP_OR_SKIP(t, 2);
  const std::vector<uint8_t> ping = Pattern(4096, 1);
  const std::vector<uint8_t> pong = Pattern(1000, 2);
  auto ping_in = ZeroBuffer(ping.size(), 1);
  auto pong_in = ZeroBuffer(pong.size(), 0);
  auto ping_out = Buffer(ping, 0);
  auto pong_out = Buffer(pong, 1);

  SC_ASSIGN_WORK(send, t[0]->Send(ping_out->data(), ping.size(), 1, 7));
  SC_ASSIGN_WORK(recv, t[1]->Recv(ping_in->data(), ping.size(), 0, 7));
  SC_ASSERT_OK(recv->Wait(kWait));
  SC_ASSERT_OK(send->Wait(kWait));
  EXPECT_EQ(ping_in->Read(), ping);

  SC_ASSIGN_WORK(send_back, t[1]->Send(pong_out->data(), pong.size(), 0, 7));
  SC_ASSIGN_WORK(recv_back, t[0]->Recv(pong_in->data(), pong.size(), 1, 7));
  SC_ASSERT_OK(recv_back->Wait(kWait));
  SC_ASSERT_OK(send_back->Wait(kWait));
  EXPECT_EQ(pong_in->Read(), pong);

  // Waiting again after OK returns OK at once.
  SC_EXPECT_OK(recv->Wait(absl::ZeroDuration()));
  SC_EXPECT_OK(send->Wait(absl::ZeroDuration()));
  DestroyGroup(&t);
}

TEST_P(TransportConformanceTest, LargeRoundTrip) {
  std::vector<std::unique_ptr<Transport>> t;
  SC_CREATE_GROUP_OR_SKIP(t, 2);
  constexpr size_t kBytes = size_t{64} << 20;
  const std::vector<uint8_t> data = Pattern(kBytes, 3);
  auto out = Buffer(data, 0);
  auto in = ZeroBuffer(kBytes, 1);
  SC_ASSIGN_WORK(recv, t[1]->Recv(in->data(), kBytes, 0, 1));
  SC_ASSIGN_WORK(send, t[0]->Send(out->data(), kBytes, 1, 1));
  SC_ASSERT_OK(send->Wait(kWait));
  SC_ASSERT_OK(recv->Wait(kWait));
  EXPECT_TRUE(in->Read() == data) << "64 MiB payload differs";
  DestroyGroup(&t);
}

// Work::Done: a send finishes without its caller waiting, so that the caller can free its
// buffer early; Wait then reports the result at once.
TEST_P(TransportConformanceTest, SendFinishesWithoutItsCallerWaiting) {
  std::vector<std::unique_ptr<Transport>> t;
  SC_CREATE_GROUP_OR_SKIP(t, 2);
  const std::vector<uint8_t> data = Pattern(size_t{1} << 20, 8);
  auto out = Buffer(data, 0);
  auto in = ZeroBuffer(data.size(), 1);
  SC_ASSIGN_WORK(send, t[0]->Send(out->data(), data.size(), 1, 4));
  SC_ASSIGN_WORK(recv, t[1]->Recv(in->data(), data.size(), 0, 4));
  SC_ASSERT_OK(recv->Wait(kWait));
  EXPECT_TRUE(recv->Done());
  const absl::Time deadline = absl::Now() + kWait;
  while (!send->Done() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_TRUE(send->Done()) << "the send did not finish within " << kWait << " without a Wait";
  SC_EXPECT_OK(send->Wait(absl::ZeroDuration()));
  EXPECT_TRUE(in->Read() == data);
  DestroyGroup(&t);
}

TEST_P(TransportConformanceTest, ZeroByteTransfer) {
  std::vector<std::unique_ptr<Transport>> t;
  SC_CREATE_GROUP_OR_SKIP(t, 2);
  SC_ASSIGN_WORK(send, t[0]->Send(nullptr, 0, 1, 3));
  SC_ASSIGN_WORK(recv, t[1]->Recv(nullptr, 0, 0, 3));
  SC_EXPECT_OK(send->Wait(kWait));
  SC_EXPECT_OK(recv->Wait(kWait));
  DestroyGroup(&t);
}

TEST_P(TransportConformanceTest, SameTagPairsUpInPostingOrder) {
  std::vector<std::unique_ptr<Transport>> t;
  SC_CREATE_GROUP_OR_SKIP(t, 2);
  constexpr int kMessages = 8;
  std::vector<std::vector<uint8_t>> sent;
  std::vector<std::unique_ptr<TestBuffer>> out, in;
  std::vector<std::unique_ptr<Work>> sends, recvs;
  for (int i = 0; i < kMessages; ++i) {
    // Sizes differ too, so a receive matched with the wrong send fails loudly.
    sent.push_back(Pattern(1000 + 10 * i, 100 + i));
    out.push_back(Buffer(sent.back(), 0));
    in.push_back(ZeroBuffer(sent.back().size(), 1));
  }
  // Half the receives are posted before the sends, half after.
  for (int i = 0; i < kMessages / 2; ++i) {
    SC_ASSIGN_WORK(recv, t[1]->Recv(in[i]->data(), sent[i].size(), 0, 42));
    recvs.push_back(std::move(recv));
  }
  for (int i = 0; i < kMessages; ++i) {
    SC_ASSIGN_WORK(send, t[0]->Send(out[i]->data(), sent[i].size(), 1, 42));
    sends.push_back(std::move(send));
  }
  for (int i = kMessages / 2; i < kMessages; ++i) {
    SC_ASSIGN_WORK(recv, t[1]->Recv(in[i]->data(), sent[i].size(), 0, 42));
    recvs.push_back(std::move(recv));
  }
  // Waiting in reverse order does not change the pairing.
  for (int i = kMessages - 1; i >= 0; --i) SC_ASSERT_OK(recvs[i]->Wait(kWait));
  for (int i = 0; i < kMessages; ++i) SC_ASSERT_OK(sends[i]->Wait(kWait));
  for (int i = 0; i < kMessages; ++i) EXPECT_EQ(in[i]->Read(), sent[i]) << "message " << i;
  DestroyGroup(&t);
}

TEST_P(TransportConformanceTest, DifferentTagsMatchRegardlessOfPostingOrder) {
  if (!GetParam().capabilities.matches_tags) {
    GTEST_SKIP() << GetParam().name << " pairs transfers in posting order, not by tag";
  }
  std::vector<std::unique_ptr<Transport>> t;
  SC_CREATE_GROUP_OR_SKIP(t, 2);
  // Extreme tags included: every uint64 is a valid tag.
  const std::vector<uint64_t> tags = {
      1, 2, 3, 0, std::numeric_limits<uint64_t>::max(), uint64_t{1} << 63};
  const size_t kBytes = 512;
  std::vector<std::vector<uint8_t>> sent;
  std::vector<std::unique_ptr<TestBuffer>> out, in;
  std::vector<std::unique_ptr<Work>> sends, recvs(tags.size());
  for (size_t i = 0; i < tags.size(); ++i) {
    sent.push_back(Pattern(kBytes, 200 + i));
    out.push_back(Buffer(sent.back(), 0));
    in.push_back(ZeroBuffer(kBytes, 1));
    SC_ASSIGN_WORK(send, t[0]->Send(out[i]->data(), kBytes, 1, tags[i]));
    sends.push_back(std::move(send));
  }
  const std::vector<size_t> post_order = {2, 0, 5, 1, 4, 3};
  for (size_t i : post_order) {
    SC_ASSIGN_WORK(recv, t[1]->Recv(in[i]->data(), kBytes, 0, tags[i]));
    recvs[i] = std::move(recv);
  }
  const std::vector<size_t> wait_order = {1, 3, 2, 4, 0, 5};
  for (size_t i : wait_order) SC_ASSERT_OK(recvs[i]->Wait(kWait));
  for (auto& send : sends) SC_ASSERT_OK(send->Wait(kWait));
  for (size_t i = 0; i < tags.size(); ++i) {
    EXPECT_EQ(in[i]->Read(), sent[i]) << "tag " << tags[i];
  }
  DestroyGroup(&t);
}

TEST_P(TransportConformanceTest, ReceivePostedBeforeOrAfterTheSend) {
  std::vector<std::unique_ptr<Transport>> t;
  SC_CREATE_GROUP_OR_SKIP(t, 2);
  const std::vector<uint8_t> first = Pattern(3000, 5);
  const std::vector<uint8_t> second = Pattern(3000, 6);
  auto first_out = Buffer(first, 0), second_out = Buffer(second, 0);
  auto first_in = ZeroBuffer(first.size(), 1), second_in = ZeroBuffer(second.size(), 1);

  // Receive first; the send comes later.
  SC_ASSIGN_WORK(early_recv, t[1]->Recv(first_in->data(), first.size(), 0, 10));
  absl::SleepFor(absl::Milliseconds(50));
  SC_ASSIGN_WORK(late_send, t[0]->Send(first_out->data(), first.size(), 1, 10));
  SC_ASSERT_OK(early_recv->Wait(kWait));
  SC_ASSERT_OK(late_send->Wait(kWait));
  EXPECT_EQ(first_in->Read(), first);

  // Send first; the receive comes later.
  SC_ASSIGN_WORK(early_send, t[0]->Send(second_out->data(), second.size(), 1, 11));
  absl::SleepFor(absl::Milliseconds(50));
  SC_ASSIGN_WORK(late_recv, t[1]->Recv(second_in->data(), second.size(), 0, 11));
  SC_ASSERT_OK(late_recv->Wait(kWait));
  SC_ASSERT_OK(early_send->Wait(kWait));
  EXPECT_EQ(second_in->Read(), second);
  DestroyGroup(&t);
}

// Both ranks post a send and then a receive, and wait for the send first: no deadlock, even
// with payloads far larger than socket buffers.
TEST_P(TransportConformanceTest, SimultaneousExchangeDoesNotDeadlock) {
  if (!GetParam().capabilities.independent_transfers) {
    GTEST_SKIP() << GetParam().name << " runs a rank's transfers in posting order";
  }
  std::vector<std::unique_ptr<Transport>> t;
  SC_CREATE_GROUP_OR_SKIP(t, 2);
  constexpr size_t kBytes = size_t{16} << 20;
  std::vector<std::vector<uint8_t>> data = {Pattern(kBytes, 10), Pattern(kBytes, 11)};
  std::vector<std::unique_ptr<TestBuffer>> out, in;
  for (int rank = 0; rank < 2; ++rank) {
    out.push_back(Buffer(data[rank], rank));
    in.push_back(ZeroBuffer(kBytes, rank));
  }
  RunRanks(2, [&](int rank) {
    const int peer = 1 - rank;
    SC_ASSIGN_WORK(send, t[rank]->Send(out[rank]->data(), kBytes, peer, 5));
    SC_ASSIGN_WORK(recv, t[rank]->Recv(in[rank]->data(), kBytes, peer, 5));
    SC_EXPECT_OK(send->Wait(kWait));
    SC_EXPECT_OK(recv->Wait(kWait));
  });
  EXPECT_TRUE(in[0]->Read() == data[1]);
  EXPECT_TRUE(in[1]->Read() == data[0]);
  DestroyGroup(&t);
}

// Four ranks, every rank sends to and receives from every other rank at once.
TEST_P(TransportConformanceTest, AllPairsConcurrently) {
  if (!GetParam().capabilities.independent_transfers) {
    GTEST_SKIP() << GetParam().name << " runs a rank's transfers in posting order";
  }
  constexpr int kRanks = 4;
  std::vector<std::unique_ptr<Transport>> t;
  SC_CREATE_GROUP_OR_SKIP(t, kRanks);
  constexpr size_t kBytes = size_t{1} << 20;
  auto message = [](int from, int to) { return Pattern(kBytes, 1000 + 10 * from + to); };
  std::vector<std::vector<std::unique_ptr<TestBuffer>>> in(kRanks);
  std::vector<std::vector<std::unique_ptr<TestBuffer>>> out(kRanks);
  for (int rank = 0; rank < kRanks; ++rank) {
    for (int peer = 0; peer < kRanks; ++peer) {
      in[rank].push_back(ZeroBuffer(kBytes, rank));
      out[rank].push_back(Buffer(message(rank, peer), rank));
    }
  }
  RunRanks(kRanks, [&](int rank) {
    std::vector<std::unique_ptr<Work>> works;
    for (int peer = 0; peer < kRanks; ++peer) {
      if (peer == rank) continue;
      SC_ASSIGN_WORK(send, t[rank]->Send(out[rank][peer]->data(), kBytes, peer, 77));
      SC_ASSIGN_WORK(recv, t[rank]->Recv(in[rank][peer]->data(), kBytes, peer, 77));
      works.push_back(std::move(send));
      works.push_back(std::move(recv));
    }
    for (auto& work : works) SC_EXPECT_OK(work->Wait(kWait));
  });
  for (int rank = 0; rank < kRanks; ++rank) {
    for (int peer = 0; peer < kRanks; ++peer) {
      if (peer == rank) continue;
      EXPECT_TRUE(in[rank][peer]->Read() == message(peer, rank)) << peer << " -> " << rank;
    }
  }
  DestroyGroup(&t);
}

TEST_P(TransportConformanceTest, RejectsBadPeer) {
  std::vector<std::unique_ptr<Transport>> t;
  SC_CREATE_GROUP_OR_SKIP(t, 2);
  auto buffer = ZeroBuffer(16, 0);
  for (int peer : {-1, 2, 100, 0}) {  // 0 is the calling rank itself.
    auto send = t[0]->Send(buffer->data(), 16, peer, 1);
    EXPECT_EQ(send.status().code(), absl::StatusCode::kInvalidArgument) << peer;
    auto recv = t[0]->Recv(buffer->data(), 16, peer, 1);
    EXPECT_EQ(recv.status().code(), absl::StatusCode::kInvalidArgument) << peer;
  }
  DestroyGroup(&t);
}

TEST_P(TransportConformanceTest, TimeoutNamesRankPeerTagBytesAndTimeout) {
  std::vector<std::unique_ptr<Transport>> t;
  SC_CREATE_GROUP_OR_SKIP(t, 2);
  auto in = ZeroBuffer(4096, 1);
  auto out = ZeroBuffer(2048, 1);

  SC_ASSIGN_WORK(recv, t[1]->Recv(in->data(), 4096, 0, 0x2a));
  absl::Time start = absl::Now();
  absl::Status status = recv->Wait(absl::Milliseconds(100));
  absl::Duration waited = absl::Now() - start;
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_THAT(std::string(status.message()),
              AllOf(HasSubstr("rank 1"), HasSubstr("rank 0"), HasSubstr("0x2a"), HasSubstr("4096"),
                    HasSubstr("100ms")));
  EXPECT_GE(waited, absl::Milliseconds(100));
  EXPECT_LT(waited, kPrompt);

  // Sent by rank 1, the receiver above: rank 0 posts nothing, so no backend (not even one
  // that pairs transfers in posting order, whatever the tag) may pair the two.
  SC_ASSIGN_WORK(send, t[1]->Send(out->data(), 2048, 0, 0x3b));
  start = absl::Now();
  status = send->Wait(absl::Milliseconds(150));
  waited = absl::Now() - start;
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_THAT(std::string(status.message()),
              AllOf(HasSubstr("rank 0"), HasSubstr("rank 1"), HasSubstr("0x3b"), HasSubstr("2048"),
                    HasSubstr("150ms")));
  EXPECT_GE(waited, absl::Milliseconds(150));
  EXPECT_LT(waited, kPrompt);

  for (auto& transport : t) transport->Abort();
  DestroyGroup(&t);
}

TEST_P(TransportConformanceTest, AbortFromAnotherThreadCancelsPendingWait) {
  std::vector<std::unique_ptr<Transport>> t;
  SC_CREATE_GROUP_OR_SKIP(t, 2);
  auto in = ZeroBuffer(1024, 1);
  auto big = ZeroBuffer(size_t{8} << 20, 1);
  SC_ASSIGN_WORK(recv, t[1]->Recv(in->data(), 1024, 0, 9));
  SC_ASSIGN_WORK(send, t[1]->Send(big->data(), big->size(), 0, 10));  // Never received.

  absl::Status recv_status, send_status;
  absl::Duration recv_waited;
  std::thread waiter([&] {
    const absl::Time start = absl::Now();
    recv_status = recv->Wait(kWait);
    recv_waited = absl::Now() - start;
  });
  std::thread send_waiter([&] { send_status = send->Wait(kWait); });
  absl::SleepFor(absl::Milliseconds(100));
  const absl::Time abort_time = absl::Now();
  t[1]->Abort();
  t[1]->Abort();  // Idempotent.
  waiter.join();
  send_waiter.join();
  EXPECT_LT(absl::Now() - abort_time, kPrompt);
  EXPECT_EQ(recv_status.code(), absl::StatusCode::kCancelled) << recv_status;
  EXPECT_EQ(send_status.code(), absl::StatusCode::kCancelled) << send_status;
  EXPECT_LT(recv_waited, kPrompt + absl::Milliseconds(100));

  // Later waits and barriers are cancelled too, at once.
  const absl::Time start = absl::Now();
  EXPECT_EQ(recv->Wait(kWait).code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(t[1]->Barrier(kWait).code(), absl::StatusCode::kCancelled);
  EXPECT_LT(absl::Now() - start, kPrompt);

  t[0]->Abort();
  DestroyGroup(&t);
}

TEST_P(TransportConformanceTest, AbortCancelsPendingBarrier) {
  std::vector<std::unique_ptr<Transport>> t;
  SC_CREATE_GROUP_OR_SKIP(t, 2);
  absl::Status status;
  std::thread waiter([&] { status = t[0]->Barrier(kWait); });  // Rank 1 never enters.
  absl::SleepFor(absl::Milliseconds(100));
  const absl::Time abort_time = absl::Now();
  t[0]->Abort();
  waiter.join();
  EXPECT_LT(absl::Now() - abort_time, kPrompt);
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled) << status;
  t[1]->Abort();
  DestroyGroup(&t);
}

// Destroying an aborted transport with transfers still pending returns promptly.
TEST_P(TransportConformanceTest, DestroyAfterAbortWithPendingTransfers) {
  std::vector<std::unique_ptr<Transport>> t;
  SC_CREATE_GROUP_OR_SKIP(t, 2);
  auto big = ZeroBuffer(size_t{32} << 20, 0);
  auto in = ZeroBuffer(64, 0);
  SC_ASSIGN_WORK(send, t[0]->Send(big->data(), big->size(), 1, 1));
  SC_ASSIGN_WORK(recv, t[0]->Recv(in->data(), 64, 1, 2));
  t[0]->Abort();
  const absl::Time start = absl::Now();
  t[0].reset();
  EXPECT_LT(absl::Now() - start, kPrompt);
  // The Works outlive their transport.
  EXPECT_FALSE(send->Wait(absl::ZeroDuration()).ok());
  EXPECT_FALSE(recv->Wait(absl::ZeroDuration()).ok());
  t[1]->Abort();
  t[1].reset();
}

TEST_P(TransportConformanceTest, SizeMismatchIsAnErrorOnTheReceiver) {
  if (!GetParam().capabilities.detects_size_mismatch) {
    GTEST_SKIP() << GetParam().name << " cannot detect a byte-count mismatch";
  }
  std::vector<std::unique_ptr<Transport>> t;
  SC_CREATE_GROUP_OR_SKIP(t, 2);
  struct Case {
    size_t sent;
    size_t expected;
    uint64_t tag;
  };
  for (const Case& c : {Case{200, 100, 0x9}, Case{100, 200, 0xa}}) {
    SCOPED_TRACE(absl::StrFormat("send %d bytes, receive %d", c.sent, c.expected));
    const std::vector<uint8_t> data = Pattern(c.sent, 7);
    auto out = Buffer(data, 0);
    auto in = ZeroBuffer(c.expected, 1);
    SC_ASSIGN_WORK(recv, t[1]->Recv(in->data(), c.expected, 0, c.tag));
    SC_ASSIGN_WORK(send, t[0]->Send(out->data(), c.sent, 1, c.tag));
    const absl::Status status = recv->Wait(kWait);
    EXPECT_THAT(status.code(),
                AnyOf(Eq(absl::StatusCode::kInternal), Eq(absl::StatusCode::kUnavailable)))
        << status;
    EXPECT_THAT(std::string(status.message()),
                HasSubstr(absl::StrFormat("expected %d bytes from rank 0 tag 0x%x, got %d",
                                          c.expected, c.tag, c.sent)));
    // The send fails or completes, but does not hang past its timeout.
    const absl::Time start = absl::Now();
    send->Wait(absl::Seconds(1)).IgnoreError();
    EXPECT_LT(absl::Now() - start, kPrompt);
  }
  for (auto& transport : t) transport->Abort();
  DestroyGroup(&t);
}

TEST_P(TransportConformanceTest, StatsCountPayloadBytesOfCompletedTransfers) {
  std::vector<std::unique_ptr<Transport>> t;
  SC_CREATE_GROUP_OR_SKIP(t, 2);
  std::vector<std::unique_ptr<Work>> works;
  std::vector<std::unique_ptr<TestBuffer>> buffers;
  auto transfer = [&](int from, int to, size_t bytes, uint64_t tag) {
    buffers.push_back(Buffer(Pattern(bytes, static_cast<uint32_t>(tag)), from));
    auto send = t[from]->Send(buffers.back()->data(), bytes, to, tag);
    buffers.push_back(ZeroBuffer(bytes, to));
    auto recv = t[to]->Recv(buffers.back()->data(), bytes, from, tag);
    ASSERT_TRUE(send.ok()) << send.status();
    ASSERT_TRUE(recv.ok()) << recv.status();
    works.push_back(std::move(send).value());
    works.push_back(std::move(recv).value());
  };
  transfer(0, 1, 100, 1);
  transfer(0, 1, 200, 2);
  transfer(0, 1, 300, 3);
  transfer(1, 0, 50, 4);
  for (auto& work : works) SC_ASSERT_OK(work->Wait(kWait));
  // Transfers that never complete count nothing (where they do not block the barrier); nor do
  // barriers.
  auto unmatched = ZeroBuffer(1000, 0);
  std::unique_ptr<Work> lonely_send, lonely_recv;
  if (GetParam().capabilities.independent_transfers) {
    SC_ASSIGN_WORK(send, t[0]->Send(unmatched->data(), 1000, 1, 98));
    SC_ASSIGN_WORK(recv, t[0]->Recv(unmatched->data(), 1000, 1, 99));
    EXPECT_FALSE(send->Wait(absl::Milliseconds(20)).ok());
    EXPECT_FALSE(recv->Wait(absl::Milliseconds(20)).ok());
    lonely_send = std::move(send);
    lonely_recv = std::move(recv);
  }
  RunRanks(2, [&](int rank) { SC_EXPECT_OK(t[rank]->Barrier(kWait)); });
  EXPECT_EQ(t[0]->stats().bytes_sent, 600);
  EXPECT_EQ(t[0]->stats().bytes_received, 50);
  EXPECT_EQ(t[1]->stats().bytes_sent, 50);
  EXPECT_EQ(t[1]->stats().bytes_received, 600);
  for (auto& transport : t) transport->Abort();
  DestroyGroup(&t);
}

TEST_P(TransportConformanceTest, BarrierWaitsForEveryRank) {
  constexpr int kRanks = 4;
  std::vector<std::unique_ptr<Transport>> t;
  SC_CREATE_GROUP_OR_SKIP(t, kRanks);
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    absl::Mutex mu;
    absl::Time last_entry = absl::InfinitePast();
    std::vector<absl::Time> exits(kRanks);
    RunRanks(kRanks, [&](int rank) {
      // The ranks arrive one after another; nobody may leave before the last arrives.
      absl::SleepFor(absl::Milliseconds(40 * ((rank + round) % kRanks)));
      {
        absl::MutexLock lock(&mu);
        last_entry = std::max(last_entry, absl::Now());
      }
      SC_EXPECT_OK(t[rank]->Barrier(kWait));
      exits[rank] = absl::Now();
    });
    for (int rank = 0; rank < kRanks; ++rank) EXPECT_GE(exits[rank], last_entry) << rank;
  }
  DestroyGroup(&t);
}

TEST_P(TransportConformanceTest, BarrierTimesOutWhenARankIsMissing) {
  constexpr int kRanks = 3;
  std::vector<std::unique_ptr<Transport>> t;
  SC_CREATE_GROUP_OR_SKIP(t, kRanks);
  RunRanks(kRanks - 1, [&](int rank) {  // The last rank never enters.
    const absl::Time start = absl::Now();
    const absl::Status status = t[rank]->Barrier(absl::Milliseconds(200));
    const absl::Duration waited = absl::Now() - start;
    EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr("200ms"));
    EXPECT_GE(waited, absl::Milliseconds(200));
    EXPECT_LT(waited, kPrompt);
  });
  for (auto& transport : t) transport->Abort();
  DestroyGroup(&t);
}

}  // namespace stagecoach::transport::testing
