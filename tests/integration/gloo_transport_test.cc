// The Gloo backend: the transport conformance suite with ranks as threads (InMemoryStore),
// behaviour specific to Gloo, and ranks as separate processes (a FileRendezvousStore shared
// through a directory; the child is this binary re-executed with a filter selecting the
// child's test).
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
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
#include "tests/support/file_rendezvous_store.h"
#include "worker/transport/gloo/factory.h"
#include "worker/transport/in_memory_store.h"
#include "worker/transport/transport.h"

extern char** environ;

namespace stagecoach::transport::testing::gloo_transport_test {
namespace {

using ::stagecoach::testing::FileRendezvousStore;
using ::testing::HasSubstr;

constexpr absl::Duration kWait = absl::Seconds(20);
constexpr absl::Duration kPrompt = absl::Seconds(3);

// Creates `world_size` Gloo transports, each rank connecting on a thread of its own through
// one InMemoryStore (each group under a key prefix of its own).
absl::StatusOr<std::vector<std::unique_ptr<Transport>>> CreateGlooGroup(int world_size) {
  static std::atomic<int> groups{0};
  const std::string prefix = absl::StrCat("group", groups++, "/");
  InMemoryStore store;
  return CreateGroupOnThreads(world_size, [&](int rank) {
    GlooOptions options;
    options.rank = rank;
    options.world_size = world_size;
    options.key_prefix = prefix;
    options.connect_timeout = absl::Seconds(20);
    return CreateGlooTransport(options, &store);
  });
}

TransportBackend GlooBackend() {
  TransportBackend backend;
  backend.name = "Gloo";
  backend.create_group = CreateGlooGroup;
  backend.allocate = AllocateHostBuffer;
  backend.max_world_size = 8;
  backend.capabilities = GlooDescriptor().capabilities;
  return backend;
}

INSTANTIATE_TEST_SUITE_P(Gloo, TransportConformanceTest, ::testing::Values(GlooBackend()),
                         BackendName);

class GlooTransportTest : public ::testing::Test {
 protected:
  void Connect(int world_size) {
    auto group = CreateGlooGroup(world_size);
    ASSERT_TRUE(group.ok()) << group.status();
    t_ = std::move(group).value();
  }

  std::vector<std::unique_ptr<Transport>> t_;
};

TEST_F(GlooTransportTest, BackendIsGloo) {
  ASSERT_NO_FATAL_FAILURE(Connect(2));
  EXPECT_EQ(t_[0]->backend(), "gloo");
  EXPECT_FALSE(t_[0]->capabilities().takes_device_memory);
  EXPECT_TRUE(t_[0]->capabilities().matches_tags);
  EXPECT_TRUE(t_[0]->capabilities().on_every_worker);
}

TEST_F(GlooTransportTest, RejectsBadOptions) {
  InMemoryStore store;
  GlooOptions options;
  options.world_size = 2;
  EXPECT_EQ(CreateGlooTransport(options, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.rank = 2;
  EXPECT_EQ(CreateGlooTransport(options, &store).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.rank = -1;
  EXPECT_EQ(CreateGlooTransport(options, &store).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.rank = 0;
  options.world_size = 0;
  EXPECT_EQ(CreateGlooTransport(options, &store).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.world_size = 1;
  options.connect_timeout = absl::ZeroDuration();
  EXPECT_EQ(CreateGlooTransport(options, &store).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.connect_timeout = absl::Seconds(1);
  // gloo itself crashes on a name that does not resolve.
  options.hostname = "no-such-host.invalid";
  auto unresolved = CreateGlooTransport(options, &store);
  EXPECT_EQ(unresolved.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(unresolved.status().message()), HasSubstr("no-such-host.invalid"));
  options.hostname = "192.0.2.1";  // TEST-NET-1: resolves, but is no local address.
  auto foreign = CreateGlooTransport(options, &store);
  EXPECT_EQ(foreign.status().code(), absl::StatusCode::kInvalidArgument) << foreign.status();
  options.hostname = "localhost";
  auto local = CreateGlooTransport(options, &store);
  EXPECT_TRUE(local.ok()) << local.status();
}

TEST_F(GlooTransportTest, RendezvousTimesOutNamingTheMissingRank) {
  InMemoryStore store;
  GlooOptions options;
  options.rank = 0;
  options.world_size = 2;  // Rank 1 never comes.
  options.key_prefix = "lonely/";
  options.connect_timeout = absl::Milliseconds(300);
  const absl::Time start = absl::Now();
  auto transport = CreateGlooTransport(options, &store);
  const absl::Duration waited = absl::Now() - start;
  EXPECT_EQ(transport.status().code(), absl::StatusCode::kDeadlineExceeded) << transport.status();
  EXPECT_THAT(std::string(transport.status().message()), HasSubstr("lonely/1"));
  EXPECT_GE(waited, absl::Milliseconds(300));
  EXPECT_LT(waited, kPrompt);
}

TEST_F(GlooTransportTest, WorldOfOne) {
  InMemoryStore store;
  GlooOptions options;
  auto transport = CreateGlooTransport(options, &store);
  ASSERT_TRUE(transport.ok()) << transport.status();
  SC_ASSERT_OK((*transport)->Barrier(absl::Seconds(1)));
  char byte = 0;
  EXPECT_EQ((*transport)->Send(&byte, 1, 0, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

// A timed-out Wait leaves the transfer posted (gloo's own timeout would have closed every
// connection): waiting again completes it, and the transport keeps working.
TEST_F(GlooTransportTest, TimedOutTransfersCanStillComplete) {
  ASSERT_NO_FATAL_FAILURE(Connect(2));
  const std::vector<uint8_t> data = Pattern(1 << 20, 1);
  std::vector<uint8_t> in(data.size());
  SC_ASSIGN_WORK(recv, t_[1]->Recv(in.data(), in.size(), 0, 1));
  EXPECT_EQ(recv->Wait(absl::Milliseconds(50)).code(), absl::StatusCode::kDeadlineExceeded);
  SC_ASSIGN_WORK(send, t_[0]->Send(data.data(), data.size(), 1, 1));
  SC_ASSERT_OK(recv->Wait(kWait));
  SC_ASSERT_OK(send->Wait(kWait));
  EXPECT_TRUE(in == data);

  // Same for a send whose receive comes late.
  SC_ASSIGN_WORK(late_send, t_[0]->Send(data.data(), data.size(), 1, 2));
  EXPECT_EQ(late_send->Wait(absl::Milliseconds(50)).code(), absl::StatusCode::kDeadlineExceeded);
  std::vector<uint8_t> in2(data.size());
  SC_ASSIGN_WORK(late_recv, t_[1]->Recv(in2.data(), in2.size(), 0, 2));
  SC_ASSERT_OK(late_send->Wait(kWait));
  SC_ASSERT_OK(late_recv->Wait(kWait));
  EXPECT_TRUE(in2 == data);
}

// A send is not done while its receiver has not posted the receive (gloo writes the payload
// only then); it finishes once the receiver took it, without a Wait. After Abort every Work is
// done: its Wait returns CANCELLED at once.
TEST_F(GlooTransportTest, SendIsDoneOnlyOnceTheReceiverTookIt) {
  ASSERT_NO_FATAL_FAILURE(Connect(2));
  const std::vector<uint8_t> data = Pattern(1 << 20, 2);
  SC_ASSIGN_WORK(send, t_[0]->Send(data.data(), data.size(), 1, 5));
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_FALSE(send->Done());
  std::vector<uint8_t> in(data.size());
  SC_ASSIGN_WORK(recv, t_[1]->Recv(in.data(), in.size(), 0, 5));
  SC_ASSERT_OK(recv->Wait(kWait));
  const absl::Time deadline = absl::Now() + kWait;
  while (!send->Done() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_TRUE(send->Done());
  SC_ASSERT_OK(send->Wait(absl::ZeroDuration()));
  EXPECT_TRUE(in == data);

  SC_ASSIGN_WORK(pending, t_[0]->Send(data.data(), data.size(), 1, 6));
  EXPECT_FALSE(pending->Done());
  t_[0]->Abort();
  EXPECT_TRUE(pending->Done());
  EXPECT_EQ(pending->Wait(absl::ZeroDuration()).code(), absl::StatusCode::kCancelled);
}

// The receiver's error travels back to the sender, and other transfers are unaffected.
TEST_F(GlooTransportTest, SizeMismatchFailsTheSendAndSparesOtherTransfers) {
  ASSERT_NO_FATAL_FAILURE(Connect(2));
  std::vector<uint8_t> big(200, 1), small(100, 0);
  SC_ASSIGN_WORK(send, t_[0]->Send(big.data(), big.size(), 1, 9));
  SC_ASSIGN_WORK(recv, t_[1]->Recv(small.data(), small.size(), 0, 9));
  const absl::Status recv_status = recv->Wait(kWait);
  EXPECT_EQ(recv_status.code(), absl::StatusCode::kInternal) << recv_status;
  EXPECT_THAT(std::string(recv_status.message()),
              HasSubstr("rank 1: receive from rank 0 (tag 0x9, 100 bytes) failed: expected 100 "
                        "bytes from rank 0 tag 0x9, got 200"));
  EXPECT_EQ(small, std::vector<uint8_t>(100, 0)) << "nothing may be written on a mismatch";
  const absl::Status send_status = send->Wait(kWait);
  EXPECT_EQ(send_status.code(), absl::StatusCode::kInternal) << send_status;
  EXPECT_THAT(std::string(send_status.message()),
              HasSubstr("rank 1 expected 100 bytes for tag 0x9, this send has 200"));

  const std::vector<uint8_t> data = Pattern(4096, 3);
  std::vector<uint8_t> in(data.size());
  SC_ASSIGN_WORK(send2, t_[0]->Send(data.data(), data.size(), 1, 9));
  SC_ASSIGN_WORK(recv2, t_[1]->Recv(in.data(), in.size(), 0, 9));
  SC_ASSERT_OK(recv2->Wait(kWait));
  SC_ASSERT_OK(send2->Wait(kWait));
  EXPECT_EQ(in, data);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] { EXPECT_TRUE(t_[rank]->Barrier(kWait).ok()); });
  }
  for (std::thread& thread : threads) thread.join();
}

// A mismatch is found by the sender, whichever of the two was posted first: in Send when the
// receive's announcement came first, on the sender's control thread otherwise. The results are
// the same either way.
TEST_F(GlooTransportTest, SizeMismatchFailsBothSidesWhicheverCameFirst) {
  ASSERT_NO_FATAL_FAILURE(Connect(2));
  for (const bool receive_first : {true, false}) {
    SCOPED_TRACE(receive_first ? "receive first" : "send first");
    const uint64_t tag = receive_first ? 0x21 : 0x22;
    std::vector<uint8_t> big(300, 1), small(30, 0);
    std::unique_ptr<Work> send, recv;
    if (receive_first) {
      SC_ASSIGN_WORK(r, t_[1]->Recv(big.data(), big.size(), 0, tag));
      SC_ASSIGN_WORK(s, t_[0]->Send(small.data(), small.size(), 1, tag));
      recv = std::move(r);
      send = std::move(s);
    } else {
      SC_ASSIGN_WORK(s, t_[0]->Send(small.data(), small.size(), 1, tag));
      SC_ASSIGN_WORK(r, t_[1]->Recv(big.data(), big.size(), 0, tag));
      recv = std::move(r);
      send = std::move(s);
    }
    const absl::Status recv_status = recv->Wait(kWait);
    EXPECT_EQ(recv_status.code(), absl::StatusCode::kInternal) << recv_status;
    EXPECT_THAT(std::string(recv_status.message()),
                HasSubstr(absl::StrFormat("expected 300 bytes from rank 0 tag 0x%x, got 30", tag)));
    EXPECT_EQ(big, std::vector<uint8_t>(300, 1)) << "nothing may be written on a mismatch";
    const absl::Status send_status = send->Wait(kWait);
    EXPECT_EQ(send_status.code(), absl::StatusCode::kInternal) << send_status;
    EXPECT_THAT(std::string(send_status.message()),
                HasSubstr(absl::StrFormat(
                    "rank 1 expected 300 bytes for tag 0x%x, this send has 30", tag)));
  }
}

// RecvUpTo (shorter_receives): a send of fewer bytes lands at the start of the buffer and leaves
// the rest as it was, whichever was posted first; one of as many bytes fills it; one of more
// fails both sides naming the most, and writes nothing.
TEST_F(GlooTransportTest, ReceivesUpToTakeShorterSendsAndRefuseLongerOnes) {
  ASSERT_NO_FATAL_FAILURE(Connect(2));
  EXPECT_TRUE(t_[1]->capabilities().shorter_receives);
  for (const bool receive_first : {true, false}) {
    SCOPED_TRACE(receive_first ? "receive first" : "send first");
    const uint64_t tag = receive_first ? 0x31 : 0x32;
    const std::vector<uint8_t> data = Pattern(40, 5);
    std::vector<uint8_t> in(100, 7);
    std::unique_ptr<Work> send, recv;
    if (receive_first) {
      SC_ASSIGN_WORK(r, t_[1]->RecvUpTo(in.data(), in.size(), 0, tag));
      SC_ASSIGN_WORK(s, t_[0]->Send(data.data(), data.size(), 1, tag));
      recv = std::move(r);
      send = std::move(s);
    } else {
      SC_ASSIGN_WORK(s, t_[0]->Send(data.data(), data.size(), 1, tag));
      SC_ASSIGN_WORK(r, t_[1]->RecvUpTo(in.data(), in.size(), 0, tag));
      recv = std::move(r);
      send = std::move(s);
    }
    SC_ASSERT_OK(recv->Wait(kWait));
    SC_ASSERT_OK(send->Wait(kWait));
    EXPECT_EQ(std::vector<uint8_t>(in.begin(), in.begin() + 40), data);
    EXPECT_EQ(std::vector<uint8_t>(in.begin() + 40, in.end()), std::vector<uint8_t>(60, 7));
  }
  const std::vector<uint8_t> full = Pattern(100, 9);
  std::vector<uint8_t> in(100, 0);
  SC_ASSIGN_WORK(send, t_[0]->Send(full.data(), full.size(), 1, 0x33));
  SC_ASSIGN_WORK(recv, t_[1]->RecvUpTo(in.data(), in.size(), 0, 0x33));
  SC_ASSERT_OK(recv->Wait(kWait));
  SC_ASSERT_OK(send->Wait(kWait));
  EXPECT_EQ(in, full);

  std::vector<uint8_t> big(200, 1), small(100, 0);
  SC_ASSIGN_WORK(too_big, t_[0]->Send(big.data(), big.size(), 1, 0x34));
  SC_ASSIGN_WORK(up_to, t_[1]->RecvUpTo(small.data(), small.size(), 0, 0x34));
  const absl::Status recv_status = up_to->Wait(kWait);
  EXPECT_EQ(recv_status.code(), absl::StatusCode::kInternal) << recv_status;
  EXPECT_THAT(std::string(recv_status.message()),
              HasSubstr("expected at most 100 bytes from rank 0 tag 0x34, got 200"));
  EXPECT_EQ(small, std::vector<uint8_t>(100, 0)) << "nothing may be written on a refusal";
  const absl::Status send_status = too_big->Wait(kWait);
  EXPECT_THAT(std::string(send_status.message()),
              HasSubstr("rank 1 expected at most 100 bytes for tag 0x34, this send has 200"));
}

// More receives posted at once than the control ring holds (their announcements wait at the
// receiver until the sender's control thread takes the earlier ones), then matched by sends of
// the same tags in the reverse order: every transfer lands in its own buffer.
TEST_F(GlooTransportTest, ManyReceivesPostedAtOnceAllComplete) {
  ASSERT_NO_FATAL_FAILURE(Connect(2));
  constexpr int kCount = 100;
  std::vector<std::vector<uint8_t>> out, in;
  for (int i = 0; i < kCount; ++i) {
    out.push_back(Pattern(64 + i, i));
    in.emplace_back(64 + i);
  }
  std::vector<std::unique_ptr<Work>> recvs, sends;
  for (int i = 0; i < kCount; ++i) {
    SC_ASSIGN_WORK(recv, t_[1]->Recv(in[i].data(), in[i].size(), 0, 100 + i));
    recvs.push_back(std::move(recv));
  }
  for (int i = kCount - 1; i >= 0; --i) {
    SC_ASSIGN_WORK(send, t_[0]->Send(out[i].data(), out[i].size(), 1, 100 + i));
    sends.push_back(std::move(send));
  }
  for (auto& recv : recvs) SC_ASSERT_OK(recv->Wait(kWait));
  for (auto& send : sends) SC_ASSERT_OK(send->Wait(kWait));
  for (int i = 0; i < kCount; ++i) EXPECT_EQ(in[i], out[i]) << "transfer " << i;
}

// The watchdog sleeps until the earliest deadline it knows; a wait with an earlier one must
// wake it, or that wait would overrun its timeout.
TEST_F(GlooTransportTest, AnEarlierDeadlineWakesTheWatchdog) {
  ASSERT_NO_FATAL_FAILURE(Connect(2));
  std::vector<uint8_t> a(64), b(64);
  SC_ASSIGN_WORK(long_recv, t_[1]->Recv(a.data(), a.size(), 0, 1));
  SC_ASSIGN_WORK(short_recv, t_[1]->Recv(b.data(), b.size(), 0, 2));
  absl::Status long_status;
  std::thread waiter([&] { long_status = long_recv->Wait(absl::Seconds(60)); });
  absl::SleepFor(absl::Milliseconds(50));  // The long wait is (most likely) registered by now.
  const absl::Time start = absl::Now();
  EXPECT_EQ(short_recv->Wait(absl::Milliseconds(100)).code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_LT(absl::Now() - start, kPrompt);
  t_[1]->Abort();
  waiter.join();
  EXPECT_EQ(long_status.code(), absl::StatusCode::kCancelled) << long_status;
}

// Abort resets the connections, so peers waiting on the aborted rank fail at once.
TEST_F(GlooTransportTest, AbortFailsPeersWaitsPromptly) {
  ASSERT_NO_FATAL_FAILURE(Connect(3));
  std::vector<uint8_t> in(64);
  SC_ASSIGN_WORK(recv, t_[0]->Recv(in.data(), in.size(), 1, 5));
  absl::Status barrier_status;
  std::thread barrier([&] { barrier_status = t_[2]->Barrier(kWait); });
  absl::SleepFor(absl::Milliseconds(50));
  t_[1]->Abort();
  const absl::Time start = absl::Now();
  const absl::Status status = recv->Wait(kWait);
  EXPECT_LT(absl::Now() - start, kPrompt);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("rank 0: receive from rank 1"));
  barrier.join();
  EXPECT_FALSE(barrier_status.ok());
  // Posting to the lost peer fails at once; the other connections still work.
  EXPECT_EQ(t_[0]->Send(in.data(), in.size(), 1, 6).status().code(),
            absl::StatusCode::kUnavailable);
  std::vector<uint8_t> out = Pattern(64, 4), in2(64);
  SC_ASSIGN_WORK(send2, t_[0]->Send(out.data(), out.size(), 2, 7));
  SC_ASSIGN_WORK(recv2, t_[2]->Recv(in2.data(), in2.size(), 0, 7));
  SC_ASSERT_OK(recv2->Wait(kWait));
  SC_ASSERT_OK(send2->Wait(kWait));
  EXPECT_EQ(in2, out);
}

// A peer that is destroyed while this rank waits on it closes its connections: the wait fails.
TEST_F(GlooTransportTest, DestroyedPeerFailsPendingReceive) {
  ASSERT_NO_FATAL_FAILURE(Connect(2));
  std::vector<uint8_t> in(64);
  SC_ASSIGN_WORK(recv, t_[0]->Recv(in.data(), in.size(), 1, 5));
  t_[1].reset();
  const absl::Time start = absl::Now();
  const absl::Status status = recv->Wait(kWait);
  EXPECT_LT(absl::Now() - start, kPrompt);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
}

// Works may outlive their transport; waiting on them then reports the cancellation.
TEST_F(GlooTransportTest, WorksOutliveTheTransport) {
  ASSERT_NO_FATAL_FAILURE(Connect(2));
  std::vector<uint8_t> in(64), out(1 << 20);
  SC_ASSIGN_WORK(recv, t_[1]->Recv(in.data(), in.size(), 0, 1));
  SC_ASSIGN_WORK(send, t_[1]->Send(out.data(), out.size(), 0, 2));
  t_[1].reset();  // Not aborted: still must not hang.
  EXPECT_EQ(recv->Wait(kWait).code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(send->Wait(kWait).code(), absl::StatusCode::kCancelled);
}

// "Tear a Gloo context down only after a barrier": every rank leaves the barrier and destroys
// its transport at once; the peers still finishing their barrier must not see an error.
TEST_F(GlooTransportTest, DestroyRightAfterBarrierIsClean) {
  for (int iteration = 0; iteration < 10; ++iteration) {
    SCOPED_TRACE(absl::StrCat("iteration ", iteration));
    ASSERT_NO_FATAL_FAILURE(Connect(3));
    std::vector<std::thread> threads;
    for (int rank = 0; rank < 3; ++rank) {
      threads.emplace_back([&, rank] {
        std::vector<uint8_t> out = Pattern(256, rank), in(256);
        const int next = (rank + 1) % 3, prev = (rank + 2) % 3;
        auto send = t_[rank]->Send(out.data(), out.size(), next, 1);
        auto recv = t_[rank]->Recv(in.data(), in.size(), prev, 1);
        ASSERT_TRUE(send.ok() && recv.ok());
        EXPECT_TRUE((*send)->Wait(kWait).ok());
        EXPECT_TRUE((*recv)->Wait(kWait).ok());
        const absl::Status barrier = t_[rank]->Barrier(kWait);
        EXPECT_TRUE(barrier.ok()) << barrier;
        t_[rank].reset();
      });
    }
    for (std::thread& thread : threads) thread.join();
  }
}

// A completed send may still sit in the socket's buffer; destroying the transport right after
// it (no transfer outstanding) closes the connection gracefully and the data still arrives.
// (Resetting the connection would drop it, though rarely on loopback.)
TEST_F(GlooTransportTest, DestroyRightAfterACompletedSendStillDelivers) {
  for (int iteration = 0; iteration < 2; ++iteration) {
    SCOPED_TRACE(absl::StrCat("iteration ", iteration));
    ASSERT_NO_FATAL_FAILURE(Connect(2));
    const std::vector<uint8_t> data = Pattern(size_t{64} << 20, iteration);
    std::vector<uint8_t> in(data.size());
    SC_ASSIGN_WORK(recv, t_[1]->Recv(in.data(), in.size(), 0, 1));
    std::thread sender([&] {
      auto send = t_[0]->Send(data.data(), data.size(), 1, 1);
      ASSERT_TRUE(send.ok()) << send.status();
      const absl::Status sent = (*send)->Wait(kWait);
      EXPECT_TRUE(sent.ok()) << sent;
      t_[0].reset();
    });
    const absl::Status received = recv->Wait(kWait);
    sender.join();
    EXPECT_TRUE(received.ok()) << received;
    EXPECT_TRUE(in == data);
    t_.clear();
  }
}

// Ranks as processes.

constexpr char kChildStoreEnv[] = "STAGECOACH_GLOO_TEST_CHILD_STORE";
constexpr int kChildPayloadBytes = 1 << 20;

// The child's side: rank 1. Runs only when a parent test started this binary as its child.
TEST(GlooMultiProcessTest, DISABLED_ChildRank) {
  const char* store_dir = std::getenv(kChildStoreEnv);
  if (store_dir == nullptr) GTEST_SKIP() << "runs only as the child of a multi-process test";
  prctl(PR_SET_PDEATHSIG, SIGKILL);  // Never outlive the parent.
  FileRendezvousStore store(store_dir);
  GlooOptions options;
  options.rank = 1;
  options.world_size = 2;
  options.connect_timeout = absl::Seconds(20);
  auto transport = CreateGlooTransport(options, &store);
  ASSERT_TRUE(transport.ok()) << transport.status();
  const std::vector<uint8_t> data = Pattern(kChildPayloadBytes, 99);
  SC_ASSIGN_WORK(send, (*transport)->Send(data.data(), data.size(), 0, 1));
  SC_ASSERT_OK(send->Wait(kWait));
  // Then wait for a message that never comes, until the parent kills this process.
  std::vector<uint8_t> sink(16);
  SC_ASSIGN_WORK(recv, (*transport)->Recv(sink.data(), sink.size(), 0, 2));
  recv->Wait(absl::Seconds(60)).IgnoreError();
}

// A child process, killed and reaped by the destructor.
class Child {
 public:
  explicit Child(const std::string& store_dir) {
    std::vector<std::string> args = {"/proc/self/exe",
                                     "--gtest_filter=GlooMultiProcessTest.DISABLED_ChildRank",
                                     "--gtest_also_run_disabled_tests"};
    std::vector<std::string> env = {absl::StrCat(kChildStoreEnv, "=", store_dir)};
    for (char** var = environ; *var != nullptr; ++var) env.emplace_back(*var);
    std::vector<char*> argv, envp;
    for (std::string& arg : args) argv.push_back(arg.data());
    for (std::string& var : env) envp.push_back(var.data());
    argv.push_back(nullptr);
    envp.push_back(nullptr);
    if (posix_spawn(&pid_, argv[0], nullptr, nullptr, argv.data(), envp.data()) != 0) pid_ = -1;
  }
  ~Child() { Kill(); }

  bool started() const { return pid_ > 0; }

  // SIGKILL and reap. Returns the wait status.
  int Kill() {
    if (pid_ <= 0) return status_;
    kill(pid_, SIGKILL);
    waitpid(pid_, &status_, 0);
    pid_ = -1;
    return status_;
  }

 private:
  pid_t pid_ = -1;
  int status_ = 0;
};

TEST(GlooMultiProcessTest, KilledPeerFailsPendingWaitsPromptly) {
  const std::filesystem::path store_dir =
      std::filesystem::path(::testing::TempDir()) /
      absl::StrFormat("gloo_store_%d_%d", getpid(), absl::ToUnixMicros(absl::Now()));
  std::filesystem::create_directories(store_dir);
  Child child(store_dir.string());
  ASSERT_TRUE(child.started());

  FileRendezvousStore store(store_dir.string());
  GlooOptions options;
  options.rank = 0;
  options.world_size = 2;
  options.connect_timeout = absl::Seconds(20);
  auto created = CreateGlooTransport(options, &store);
  ASSERT_TRUE(created.ok()) << created.status();
  std::unique_ptr<Transport> transport = std::move(created).value();

  // The processes exchange data.
  std::vector<uint8_t> in(kChildPayloadBytes);
  SC_ASSIGN_WORK(recv, transport->Recv(in.data(), in.size(), 1, 1));
  SC_ASSERT_OK(recv->Wait(kWait));
  EXPECT_TRUE(in == Pattern(kChildPayloadBytes, 99));

  // A receive and a large send the child never matches, then the child dies.
  std::vector<uint8_t> pending_in(16), pending_out(size_t{32} << 20);
  SC_ASSIGN_WORK(pending_recv, transport->Recv(pending_in.data(), pending_in.size(), 1, 3));
  SC_ASSIGN_WORK(pending_send, transport->Send(pending_out.data(), pending_out.size(), 1, 4));
  std::thread killer([&] {
    absl::SleepFor(absl::Milliseconds(200));
    const int status = child.Kill();
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  });
  const absl::Time start = absl::Now();
  const absl::Status recv_status = pending_recv->Wait(kWait);
  const absl::Duration waited = absl::Now() - start;
  killer.join();
  EXPECT_EQ(recv_status.code(), absl::StatusCode::kUnavailable) << recv_status;
  EXPECT_THAT(std::string(recv_status.message()),
              HasSubstr("rank 0: receive from rank 1 (tag 0x3, 16 bytes) failed"));
  EXPECT_LT(waited, absl::Milliseconds(200) + kPrompt);
  const absl::Status send_status = pending_send->Wait(kWait);
  EXPECT_EQ(send_status.code(), absl::StatusCode::kUnavailable) << send_status;
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(200) + kPrompt);

  const absl::Time destroy_start = absl::Now();
  transport.reset();
  EXPECT_LT(absl::Now() - destroy_start, kPrompt);
  std::filesystem::remove_all(store_dir);
}

}  // namespace
}  // namespace stagecoach::transport::testing::gloo_transport_test
