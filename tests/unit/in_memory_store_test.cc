#include "worker/transport/in_memory_store.h"

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stagecoach::transport::in_memory_store_test {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(InMemoryStoreTest, GetReturnsWhatWasSet) {
  InMemoryStore store;
  ASSERT_TRUE(store.Set("a", "1").ok());
  ASSERT_TRUE(store.Set("b", std::string("\0\xff", 2)).ok());
  auto a = store.Get("a", absl::ZeroDuration());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(*a, "1");
  auto b = store.Get("b", absl::ZeroDuration());
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(*b, std::string("\0\xff", 2));
}

TEST(InMemoryStoreTest, SetReplacesTheValue) {
  InMemoryStore store;
  ASSERT_TRUE(store.Set("k", "old").ok());
  ASSERT_TRUE(store.Set("k", "new").ok());
  EXPECT_EQ(*store.Get("k", absl::ZeroDuration()), "new");
}

TEST(InMemoryStoreTest, GetTimesOutNamingTheKey) {
  InMemoryStore store;
  const absl::Time start = absl::Now();
  auto value = store.Get("gloo/3", absl::Milliseconds(50));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(50));
  EXPECT_EQ(value.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(value.status().message()), AllOf(HasSubstr("gloo/3"), HasSubstr("50ms")));
}

TEST(InMemoryStoreTest, WaitTimesOutNamingOnlyTheMissingKeys) {
  InMemoryStore store;
  ASSERT_TRUE(store.Set("present", "x").ok());
  const absl::Status status =
      store.Wait({"present", "missing1", "missing2"}, absl::Milliseconds(20));
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(status.message()),
              AllOf(HasSubstr("missing1"), HasSubstr("missing2"), Not(HasSubstr("present"))));
}

TEST(InMemoryStoreTest, WaitReturnsAtOnceWhenEveryKeyIsSet) {
  InMemoryStore store;
  ASSERT_TRUE(store.Set("a", "").ok());
  ASSERT_TRUE(store.Set("b", "").ok());
  EXPECT_TRUE(store.Wait({"a", "b"}, absl::ZeroDuration()).ok());
  EXPECT_TRUE(store.Wait({}, absl::ZeroDuration()).ok());
}

TEST(InMemoryStoreTest, GetAndWaitBlockUntilAnotherThreadSets) {
  InMemoryStore store;
  // Each flag is raised just before its key is set: a Get or Wait that returned with the value
  // must see it raised, or it did not wait for the setter.
  std::atomic<bool> setting_first{false}, setting_second{false};
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(50));
    setting_first = true;
    ASSERT_TRUE(store.Set("first", "1").ok());
    absl::SleepFor(absl::Milliseconds(50));
    setting_second = true;
    ASSERT_TRUE(store.Set("second", "2").ok());
  });
  auto first = store.Get("first", absl::Seconds(10));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, "1");
  EXPECT_TRUE(setting_first.load());
  EXPECT_TRUE(store.Wait({"first", "second"}, absl::Seconds(10)).ok());
  EXPECT_TRUE(setting_second.load());
  setter.join();
}

TEST(InMemoryStoreTest, ManyConcurrentWaitersAllWakeUp) {
  InMemoryStore store;
  constexpr int kWaiters = 16;
  std::vector<std::thread> waiters;
  std::vector<std::string> values(kWaiters);
  std::vector<absl::Status> statuses(kWaiters);
  for (int i = 0; i < kWaiters; ++i) {
    waiters.emplace_back([&, i] {
      // Half use Get, half Wait for every key.
      if (i % 2 == 0) {
        auto value = store.Get("key" + std::to_string(i / 2), absl::Seconds(10));
        statuses[i] = value.status();
        if (value.ok()) values[i] = *value;
      } else {
        std::vector<std::string> keys;
        for (int k = 0; k < kWaiters / 2; ++k) keys.push_back("key" + std::to_string(k));
        statuses[i] = store.Wait(keys, absl::Seconds(10));
      }
    });
  }
  absl::SleepFor(absl::Milliseconds(20));
  for (int k = 0; k < kWaiters / 2; ++k) {
    ASSERT_TRUE(store.Set("key" + std::to_string(k), "v" + std::to_string(k)).ok());
  }
  for (std::thread& waiter : waiters) waiter.join();
  for (int i = 0; i < kWaiters; ++i) {
    EXPECT_TRUE(statuses[i].ok()) << i << ": " << statuses[i];
    if (i % 2 == 0) {
      EXPECT_EQ(values[i], "v" + std::to_string(i / 2));
    }
  }
}

}  // namespace
}  // namespace stagecoach::transport::in_memory_store_test
