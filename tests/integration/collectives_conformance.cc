#include "tests/integration/collectives_conformance.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"

namespace stagecoach::collectives::testing {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kTimeout = absl::Seconds(30);

class HostMemory final : public CollectiveBuffer {
 public:
  explicit HostMemory(size_t bytes) : bytes_(bytes) {}
  void* data() override { return bytes_.data(); }
  size_t size() const override { return bytes_.size(); }
  void Write(const std::vector<uint8_t>& bytes) override {
    std::memcpy(bytes_.data(), bytes.data(), std::min(bytes.size(), bytes_.size()));
  }
  std::vector<uint8_t> Read() const override { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

// Element i of rank r's contribution: small multiples of 1/4, so sums over a few ranks are exact
// in float32 and float64.
double Value(int r, int64_t i) { return (r + 1) * (static_cast<double>(i % 97) - 48.0) * 0.25; }

template <typename T>
std::vector<uint8_t> Bytes(const std::vector<T>& values) {
  std::vector<uint8_t> out(values.size() * sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

template <typename T>
std::vector<T> Values(const std::vector<uint8_t>& bytes) {
  std::vector<T> out(bytes.size() / sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
  return out;
}

// Runs fn(rank) for every rank on a thread of its own; the statuses, by rank.
std::vector<absl::Status> OnEveryRank(int size, const std::function<absl::Status(int)>& fn) {
  std::vector<absl::Status> out(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) threads.emplace_back([&, r] { out[r] = fn(r); });
  for (std::thread& t : threads) t.join();
  return out;
}

void ExpectAllOk(const std::vector<absl::Status>& statuses) {
  for (size_t r = 0; r < statuses.size(); ++r)
    EXPECT_TRUE(statuses[r].ok()) << r << ": " << statuses[r];
}

struct Case {
  int size;
  int64_t count;
  DataType dtype;
  ReduceOp op;
};

std::string CaseName(const Case& c) {
  return absl::StrCat(c.size, " ranks, ", c.count, " x ", DataTypeName(c.dtype), ", ",
                      ReduceOpName(c.op));
}

template <typename T>
T Expected(int size, int64_t i, ReduceOp op) {
  double acc = op == ReduceOp::kMax ? Value(0, i) : 0.0;
  for (int r = 0; r < size; ++r)
    acc = op == ReduceOp::kMax ? std::max(acc, Value(r, i)) : acc + Value(r, i);
  T out = static_cast<T>(acc);
  if (op == ReduceOp::kMean) out /= static_cast<T>(size);
  return out;
}

template <typename T>
void CheckReduced(const std::vector<T>& got, int size, int64_t first, ReduceOp op,
                  const std::string& where) {
  for (size_t i = 0; i < got.size(); ++i) {
    const T want = Expected<T>(size, first + static_cast<int64_t>(i), op);
    ASSERT_NEAR(got[i], want, std::abs(want) * 1e-6 + 1e-12) << where << " element " << first + i;
  }
}

}  // namespace

std::unique_ptr<CollectiveBuffer> AllocateHostMemory(size_t bytes, int /*rank*/) {
  return std::make_unique<HostMemory>(bytes);
}

absl::StatusOr<std::vector<std::unique_ptr<Collectives>>> CreateCollectivesOnThreads(
    int size, const std::function<absl::StatusOr<std::unique_ptr<Collectives>>(int rank)>& create) {
  std::vector<absl::StatusOr<std::unique_ptr<Collectives>>> made(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) threads.emplace_back([&, r] { made[r] = create(r); });
  for (std::thread& t : threads) t.join();
  std::vector<std::unique_ptr<Collectives>> group;
  for (auto& m : made) {
    if (!m.ok()) return m.status();
    group.push_back(*std::move(m));
  }
  return group;
}

void PrintTo(const CollectivesBackend& backend, std::ostream* os) { *os << backend.name; }

std::string CollectivesBackendName(const ::testing::TestParamInfo<CollectivesBackend>& info) {
  return info.param.name;
}

void CollectivesConformanceTest::SetUp() {
  if (!GetParam().unavailable.empty()) GTEST_SKIP() << GetParam().unavailable;
}

void CollectivesConformanceTest::CreateGroup(int size,
                                             std::vector<std::unique_ptr<Collectives>>* group) {
  if (size > GetParam().max_size) GTEST_SKIP() << "the backend supports " << GetParam().max_size;
  auto made = GetParam().create_group(size);
  ASSERT_TRUE(made.ok()) << made.status();
  *group = std::move(made).value();
  ASSERT_EQ(static_cast<int>(group->size()), size);
  for (int r = 0; r < size; ++r) {
    ASSERT_EQ((*group)[r]->rank(), r);
    ASSERT_EQ((*group)[r]->size(), size);
  }
}

namespace {

template <typename T>
void RunAllReduce(CollectivesConformanceTest* test, std::vector<std::unique_ptr<Collectives>>& g,
                  const CollectivesBackend& backend, const Case& c) {
  std::vector<std::unique_ptr<CollectiveBuffer>> buffers;
  for (int r = 0; r < c.size; ++r) {
    std::vector<T> mine(c.count);
    for (int64_t i = 0; i < c.count; ++i) mine[i] = static_cast<T>(Value(r, i));
    buffers.push_back(backend.allocate(std::max<size_t>(1, c.count * sizeof(T)), r));
    buffers.back()->Write(Bytes(mine));
  }
  ExpectAllOk(OnEveryRank(c.size, [&](int r) {
    return g[r]->AllReduce(buffers[r]->data(), c.count, c.dtype, c.op, kTimeout);
  }));
  std::vector<uint8_t> first;
  for (int r = 0; r < c.size; ++r) {
    std::vector<uint8_t> got = buffers[r]->Read();
    got.resize(c.count * sizeof(T));
    CheckReduced(Values<T>(got), c.size, 0, c.op, absl::StrCat(CaseName(c), " rank ", r));
    if (r == 0) first = got;
    EXPECT_EQ(got, first) << CaseName(c) << ": rank " << r << " differs from rank 0";
  }
}

}  // namespace

TEST_P(CollectivesConformanceTest, AllReduceEveryOpTypeAndSizeGivesEveryRankTheSameResult) {
  for (int size : {1, 2, 3, 4}) {
    std::vector<std::unique_ptr<Collectives>> group;
    CreateGroup(size, &group);
    if (IsSkipped() || HasFatalFailure()) return;
    for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{300001}}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMax}) {
        RunAllReduce<float>(this, group, GetParam(), Case{size, count, DataType::kFloat32, op});
        RunAllReduce<double>(this, group, GetParam(), Case{size, count, DataType::kFloat64, op});
        if (HasFailure()) return;
      }
    }
  }
}

TEST_P(CollectivesConformanceTest, AllReduceMovesTheRingVolume) {
  constexpr int kSize = 3;
  constexpr int64_t kCount = 3 * 4096;  // divisible by the group size
  std::vector<std::unique_ptr<Collectives>> group;
  CreateGroup(kSize, &group);
  if (IsSkipped() || HasFatalFailure()) return;
  std::vector<std::unique_ptr<CollectiveBuffer>> buffers;
  std::vector<CollectiveStats> before;
  for (int r = 0; r < kSize; ++r) {
    buffers.push_back(GetParam().allocate(kCount * 4, r));
    buffers.back()->Write(std::vector<uint8_t>(kCount * 4, 0));
    before.push_back(group[r]->stats());
  }
  ExpectAllOk(OnEveryRank(kSize, [&](int r) {
    return group[r]->AllReduce(buffers[r]->data(), kCount, DataType::kFloat32, ReduceOp::kSum,
                               kTimeout);
  }));
  for (int r = 0; r < kSize; ++r) {
    const CollectiveStats after = group[r]->stats();
    EXPECT_EQ(after.bytes_sent - before[r].bytes_sent, 2 * (kSize - 1) * kCount * 4 / kSize) << r;
    EXPECT_EQ(after.bytes_received - before[r].bytes_received, 2 * (kSize - 1) * kCount * 4 / kSize)
        << r;
  }
}

TEST_P(CollectivesConformanceTest, ReduceScatterGivesEachRankItsBlockReduced) {
  for (int size : {1, 2, 4}) {
    std::vector<std::unique_ptr<Collectives>> group;
    CreateGroup(size, &group);
    if (IsSkipped() || HasFatalFailure()) return;
    for (int64_t count : {int64_t{0}, int64_t{5}, int64_t{70000}}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean}) {
        std::vector<std::unique_ptr<CollectiveBuffer>> in, out;
        for (int r = 0; r < size; ++r) {
          std::vector<float> mine(size * count);
          for (int64_t i = 0; i < size * count; ++i) mine[i] = static_cast<float>(Value(r, i));
          in.push_back(GetParam().allocate(std::max<size_t>(1, mine.size() * 4), r));
          in.back()->Write(Bytes(mine));
          out.push_back(GetParam().allocate(std::max<size_t>(1, count * 4), r));
        }
        const CollectiveStats before = group[0]->stats();
        ExpectAllOk(OnEveryRank(size, [&](int r) {
          return group[r]->ReduceScatter(in[r]->data(), out[r]->data(), count, DataType::kFloat32,
                                         op, kTimeout);
        }));
        EXPECT_EQ(group[0]->stats().bytes_sent - before.bytes_sent, (size - 1) * count * 4);
        for (int r = 0; r < size; ++r) {
          std::vector<uint8_t> got = out[r]->Read();
          got.resize(count * 4);
          CheckReduced(Values<float>(got), size, r * count, op,
                       absl::StrCat(size, " ranks, count ", count, ", rank ", r));
        }
        if (HasFailure()) return;
      }
    }
  }
}

TEST_P(CollectivesConformanceTest, AllGatherGivesEveryRankEveryBlockAlsoInPlace) {
  for (int size : {1, 2, 3}) {
    std::vector<std::unique_ptr<Collectives>> group;
    CreateGroup(size, &group);
    if (IsSkipped() || HasFatalFailure()) return;
    for (bool in_place : {false, true}) {
      constexpr int64_t kCount = 33333;
      std::vector<std::unique_ptr<CollectiveBuffer>> in, out;
      for (int r = 0; r < size; ++r) {
        std::vector<double> mine(kCount);
        for (int64_t i = 0; i < kCount; ++i) mine[i] = Value(r, i);
        out.push_back(GetParam().allocate(size * kCount * 8, r));
        in.push_back(GetParam().allocate(kCount * 8, r));
        in.back()->Write(Bytes(mine));
        if (in_place) {
          std::vector<uint8_t> placed(size * kCount * 8, 0);
          std::memcpy(placed.data() + r * kCount * 8, Bytes(mine).data(), kCount * 8);
          out.back()->Write(placed);
        }
      }
      ExpectAllOk(OnEveryRank(size, [&](int r) {
        void* input =
            in_place ? static_cast<char*>(out[r]->data()) + r * kCount * 8 : in[r]->data();
        return group[r]->AllGather(input, out[r]->data(), kCount, DataType::kFloat64, kTimeout);
      }));
      for (int r = 0; r < size; ++r) {
        const std::vector<double> got = Values<double>(out[r]->Read());
        for (int b = 0; b < size; ++b) {
          for (int64_t i = 0; i < kCount; i += 997) {
            ASSERT_EQ(got[b * kCount + i], Value(b, i)) << "rank " << r << " block " << b;
          }
        }
      }
    }
  }
}

TEST_P(CollectivesConformanceTest, BroadcastCopiesTheRootsBufferFromEveryRoot) {
  constexpr int kSize = 3;
  std::vector<std::unique_ptr<Collectives>> group;
  CreateGroup(kSize, &group);
  if (IsSkipped() || HasFatalFailure()) return;
  for (int root = 0; root < kSize; ++root) {
    constexpr int64_t kCount = 50000;
    std::vector<std::unique_ptr<CollectiveBuffer>> buffers;
    for (int r = 0; r < kSize; ++r) {
      std::vector<float> mine(kCount);
      for (int64_t i = 0; i < kCount; ++i) mine[i] = static_cast<float>(Value(r, i));
      buffers.push_back(GetParam().allocate(kCount * 4, r));
      buffers.back()->Write(Bytes(mine));
    }
    ExpectAllOk(OnEveryRank(kSize, [&](int r) {
      return group[r]->Broadcast(buffers[r]->data(), kCount, DataType::kFloat32, root, kTimeout);
    }));
    for (int r = 0; r < kSize; ++r) {
      const std::vector<float> got = Values<float>(buffers[r]->Read());
      for (int64_t i = 0; i < kCount; i += 101) {
        ASSERT_EQ(got[i], static_cast<float>(Value(root, i))) << "root " << root << " rank " << r;
      }
    }
  }
}

TEST_P(CollectivesConformanceTest, BadArgumentsAreRefusedBeforeAnythingIsSent) {
  std::vector<std::unique_ptr<Collectives>> group;
  CreateGroup(2, &group);
  if (IsSkipped() || HasFatalFailure()) return;
  auto buffer = GetParam().allocate(64, 0);
  absl::Status s =
      group[0]->AllReduce(buffer->data(), -1, DataType::kFloat32, ReduceOp::kSum, kTimeout);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("all-reduce"));
  s = group[0]->Broadcast(buffer->data(), 4, DataType::kFloat32, 2, kTimeout);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("root 2"));
  s = group[0]->AllGather(nullptr, buffer->data(), 4, DataType::kFloat32, kTimeout);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  // The group still works: nothing was sent.
  auto b0 = GetParam().allocate(16, 0);
  auto b1 = GetParam().allocate(16, 1);
  b0->Write(Bytes(std::vector<float>{1, 2, 3, 4}));
  b1->Write(Bytes(std::vector<float>{10, 20, 30, 40}));
  std::vector<CollectiveBuffer*> bufs{b0.get(), b1.get()};
  ExpectAllOk(OnEveryRank(2, [&](int r) {
    return group[r]->AllReduce(bufs[r]->data(), 4, DataType::kFloat32, ReduceOp::kSum, kTimeout);
  }));
  EXPECT_EQ(Values<float>(b1->Read()), (std::vector<float>{11, 22, 33, 44}));
}

TEST_P(CollectivesConformanceTest, ACallWhosePeerNeverComesTimesOutNamingTheCall) {
  std::vector<std::unique_ptr<Collectives>> group;
  CreateGroup(2, &group);
  if (IsSkipped() || HasFatalFailure()) return;
  auto buffer = GetParam().allocate(4096, 0);
  const absl::Time start = absl::Now();
  absl::Status s = group[0]->AllReduce(buffer->data(), 1024, DataType::kFloat32, ReduceOp::kSum,
                                       absl::Milliseconds(300));
  const absl::Duration took = absl::Now() - start;
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("all-reduce"));
  EXPECT_LT(took, absl::Seconds(10));
  EXPECT_GE(took, absl::Milliseconds(250));
}

TEST_P(CollectivesConformanceTest, AbortFromAnotherThreadEndsAWaitingCallPromptly) {
  std::vector<std::unique_ptr<Collectives>> group;
  CreateGroup(2, &group);
  if (IsSkipped() || HasFatalFailure()) return;
  auto buffer = GetParam().allocate(4096, 0);
  absl::Status s;
  std::thread caller([&] {
    s = group[0]->AllReduce(buffer->data(), 1024, DataType::kFloat32, ReduceOp::kSum,
                            absl::Seconds(60));
  });
  absl::SleepFor(absl::Milliseconds(200));
  const absl::Time aborted = absl::Now();
  group[0]->Abort();
  caller.join();
  EXPECT_LT(absl::Now() - aborted, absl::Seconds(5));
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(absl::IsCancelled(s) || absl::IsUnavailable(s)) << s;
  // Later calls are refused at once.
  s = group[0]->AllReduce(buffer->data(), 4, DataType::kFloat32, ReduceOp::kSum, kTimeout);
  EXPECT_TRUE(absl::IsCancelled(s)) << s;
}

}  // namespace stagecoach::collectives::testing
