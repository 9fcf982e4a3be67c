// The daemons' crash report: a fault or an abort prints which signal, which thread and its stack
// to stderr, and the process still dies of that signal (death tests: each case runs in a child).
#include "common/process/crash_report.h"

#include <signal.h>
#include <stdlib.h>

#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stagecoach::crash_report_test {
namespace {

class CrashReportTest : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

// Reads through a null pointer the compiler cannot see coming.
int ReadThrough(volatile int* p) { return *p; }

TEST_F(CrashReportTest, AFaultPrintsItsSignalAndStackAndStillKillsTheProcess) {
  EXPECT_EXIT(
      {
        InstallCrashReport("crash-test");
        volatile int* nowhere = nullptr;
        (void)ReadThrough(nowhere);
      },
      ::testing::KilledBySignal(SIGSEGV),
      "\\*\\*\\* crash-test: fatal signal 11 \\(SIGSEGV\\) in thread [0-9]+ of pid [0-9]+; "
      "stack:\n(.|\n)*\\*\\*\\* end of stack");
}

TEST_F(CrashReportTest, AnAbortInAnotherThreadIsReportedToo) {
  EXPECT_EXIT(
      {
        InstallCrashReport("crash-test");
        std::thread([] { abort(); }).join();
      },
      ::testing::KilledBySignal(SIGABRT), "crash-test: fatal signal 6 \\(SIGABRT\\)");
}

TEST_F(CrashReportTest, WithoutAFaultNothingIsPrinted) {
  EXPECT_EXIT(
      {
        InstallCrashReport("crash-test");
        exit(3);
      },
      ::testing::ExitedWithCode(3), ::testing::Not(::testing::HasSubstr("fatal signal")));
}

}  // namespace
}  // namespace stagecoach::crash_report_test
