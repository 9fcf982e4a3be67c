// One write at a time off the caller's thread (worker/runtime/checkpoint/background_writer.h):
// Start returns while the write runs; the next Start waits for it, bounded (DEADLINE_EXCEEDED
// naming the writes, the new write not started); a failed write is returned once by the next
// Start or Drain, which then does not start its own; the destructor waits for a write in flight
// and tells it the result is no longer wanted.
#include "worker/runtime/checkpoint/background_writer.h"

#include <atomic>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stagecoach::runtime::background_writer_test {
namespace {

using ::testing::HasSubstr;

TEST(BackgroundWriter, StartReturnsWhileTheWriteRunsAndTheNextWaitsForIt) {
  BackgroundWriter writer("rank 1's checkpoint", absl::Milliseconds(200));
  absl::Notification release;
  std::atomic<int> done{0};
  ASSERT_TRUE(writer
                  .Start([&] {
                    release.WaitForNotification();
                    ++done;
                    return absl::OkStatus();
                  })
                  .ok());
  EXPECT_EQ(done.load(), 0);
  // The first write still runs: the second is refused after the timeout, and never runs.
  std::atomic<bool> second_ran{false};
  const absl::Status waited = writer.Start([&] {
    second_ran = true;
    return absl::OkStatus();
  });
  EXPECT_TRUE(absl::IsDeadlineExceeded(waited)) << waited;
  EXPECT_THAT(std::string(waited.message()), HasSubstr("rank 1's checkpoint"));
  release.Notify();
  EXPECT_TRUE(writer.Drain().ok());
  EXPECT_EQ(done.load(), 1);
  EXPECT_FALSE(second_ran.load());
  // Free again: the next write starts at once.
  ASSERT_TRUE(writer.Start([&] { return absl::OkStatus(); }).ok());
  EXPECT_TRUE(writer.Drain().ok());
}

TEST(BackgroundWriter, AFailedWriteIsReturnedOnceAndStopsTheNextStart) {
  BackgroundWriter writer("rank 0's checkpoint", absl::Seconds(10));
  ASSERT_TRUE(writer.Start([] { return absl::DataLossError("disk full"); }).ok());
  bool ran = false;
  const absl::Status next = writer.Start([&] {
    ran = true;
    return absl::OkStatus();
  });
  EXPECT_TRUE(absl::IsDataLoss(next)) << next;
  EXPECT_EQ(next.message(), "rank 0's checkpoint: disk full");
  EXPECT_TRUE(writer.Drain().ok());
  EXPECT_FALSE(ran);
  ASSERT_TRUE(writer.Start([] { return absl::InternalError("again"); }).ok());
  EXPECT_TRUE(absl::IsInternal(writer.Drain()));
}

TEST(BackgroundWriter, TheDestructorWaitsAndMarksTheWriteAbandoned) {
  std::atomic<bool> abandoned_seen{false};
  std::atomic<bool> finished{false};
  {
    BackgroundWriter writer("w", absl::Seconds(10));
    ASSERT_TRUE(writer
                    .Start([&] {
                      while (!writer.abandoned()) absl::SleepFor(absl::Milliseconds(1));
                      abandoned_seen = true;
                      finished = true;
                      return absl::OkStatus();
                    })
                    .ok());
  }
  EXPECT_TRUE(abandoned_seen.load());
  EXPECT_TRUE(finished.load());
}

}  // namespace
}  // namespace stagecoach::runtime::background_writer_test
