// The step gate alone (worker/runtime/task/step_gate.h): no LibTorch, no transport. The test's main
// thread or a TaskThread plays the task's thread; concurrency is ordered with notifications and
// StepGate::AwaitHolding, never with sleeps.
#include "worker/runtime/task/step_gate.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace stagecoach::runtime::step_gate_test {
namespace {

using ::testing::HasSubstr;

// Bound on every wait of a test: generous, never reached unless the gate is broken.
constexpr absl::Duration kWait = absl::Seconds(60);

struct TestPayload : StepGate::ClientPayload {
  explicit TestPayload(int v) : value(v) {}
  int value;
};

StepGateOptions Options(int64_t done, int64_t limit, bool finish = false) {
  StepGateOptions options;
  options.job_id = "job-g";
  options.attempt = 3;
  options.rank = 1;
  options.steps_done = done;
  options.step_limit = limit;
  options.finish_at_limit = finish;
  return options;
}

StepGate::Control Limit(int64_t limit, bool finish = false, std::vector<int64_t> checkpoints = {}) {
  StepGate::Control control;
  control.step_limit = limit;
  control.finish_at_limit = finish;
  control.checkpoint_steps = std::move(checkpoints);
  return control;
}

StepGate::ClientStep Client(int64_t step, bool forward_only = false, int value = 0) {
  StepGate::ClientStep client;
  client.global_step = step;
  client.forward_only = forward_only;
  client.payload = std::make_unique<TestPayload>(value);
  return client;
}

// The limit a client step at `step` comes with (ControlTask's rule, which the gate leaves to
// its caller).
StepGate::Control ClientLimit(int64_t step, bool forward_only = false) {
  return Limit(forward_only ? step : step + 1);
}

// One call of Next on a thread of its own, as the task's thread would make it.
class TaskThread {
 public:
  explicit TaskThread(StepGate& gate)
      : thread_([this, &gate] {
          result_ = gate.Next();
          decided_.Notify();
        }) {}
  ~TaskThread() { thread_.join(); }

  // The decision, once made (fails the test if it is not within kWait).
  absl::StatusOr<StepGate::Decision>& Result() {
    EXPECT_TRUE(decided_.WaitForNotificationWithTimeout(kWait));
    return result_;
  }
  bool Decided() const { return decided_.HasBeenNotified(); }

 private:
  absl::StatusOr<StepGate::Decision> result_ = absl::UnknownError("no decision");
  absl::Notification decided_;
  std::thread thread_;
};

// Runs one data step to its end on the calling thread.
void RunDataStep(StepGate& gate, int64_t at) {
  auto decision = gate.Next();
  ASSERT_TRUE(decision.ok()) << decision.status();
  ASSERT_EQ(decision->action, StepGate::Action::kDataStep);
  ASSERT_EQ(decision->steps_done, at);
  EXPECT_EQ(gate.EndCountedStep().steps_done, at + 1);
}

TEST(StepGate, HoldsAtTheLimitUntilAControlMovesIt) {
  StepGate gate(Options(0, 1));
  RunDataStep(gate, 0);
  TaskThread task(gate);
  ASSERT_TRUE(gate.AwaitHolding(1, kWait).ok());
  EXPECT_FALSE(task.Decided());
  // Repeating the limit is a ControlTask too: the hold wakes, finds nothing and holds again.
  ASSERT_EQ(*gate.Apply(Limit(1), std::nullopt), 1);
  ASSERT_TRUE(gate.AwaitHolding(1, kWait).ok());
  EXPECT_FALSE(task.Decided());
  auto raised = gate.Apply(Limit(2), std::nullopt);
  ASSERT_TRUE(raised.ok()) << raised.status();
  EXPECT_EQ(*raised, 1);
  auto& decision = task.Result();
  ASSERT_TRUE(decision.ok()) << decision.status();
  EXPECT_EQ(decision->action, StepGate::Action::kDataStep);
  EXPECT_EQ(decision->steps_done, 1);
}

TEST(StepGate, StartsHeldWhenTheLimitIsTheStepsDone) {
  StepGate gate(Options(4, 4));
  TaskThread task(gate);
  ASSERT_TRUE(gate.AwaitHolding(4, kWait).ok());
  ASSERT_TRUE(gate.Apply(Limit(4, /*finish=*/true), std::nullopt).ok());
  ASSERT_TRUE(task.Result().ok());
  EXPECT_EQ(task.Result()->action, StepGate::Action::kFinish);
}

TEST(StepGate, FinishesAtTheLimitAndThenRefusesControl) {
  StepGate gate(Options(0, 2, /*finish=*/true));
  RunDataStep(gate, 0);
  RunDataStep(gate, 1);
  auto decision = gate.Next();
  ASSERT_TRUE(decision.ok());
  EXPECT_EQ(decision->action, StepGate::Action::kFinish);
  EXPECT_EQ(decision->steps_done, 2);
  auto late = gate.Apply(Limit(3), std::nullopt);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(late.status().message(),
              HasSubstr("job-g attempt 3 rank 1: the task is ending (after 2 steps of the "
                        "timeline) and takes no ControlTask"));
  EXPECT_EQ(gate.AwaitHolding(2, kWait).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(StepGate, LimitsBelowTheStepsDoneAreRefused) {
  StepGate gate(Options(2, 3));
  auto below = gate.Apply(Limit(1), std::nullopt);
  EXPECT_EQ(below.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(below.status().message(),
              HasSubstr("step_limit 1 is below the 2 steps the task has done"));
  // While a step runs, the least limit is the count at its end.
  auto decision = gate.Next();
  ASSERT_TRUE(decision.ok());
  ASSERT_EQ(decision->action, StepGate::Action::kDataStep);
  auto running = gate.Apply(Limit(2), std::nullopt);
  EXPECT_EQ(running.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(running.status().message(),
              HasSubstr("step_limit 2 is below the 3 steps the task will have done at the end "
                        "of the step it runs (2 done)"));
  auto pause = gate.Apply(Limit(3), std::nullopt);
  ASSERT_TRUE(pause.ok()) << pause.status();
  EXPECT_EQ(*pause, 2);
  EXPECT_EQ(gate.EndCountedStep().steps_done, 3);
  EXPECT_EQ(gate.steps_done(), 3);
}

TEST(StepGate, AClientStepIsTakenOnlyWhileHoldingAtExactlyItsStep) {
  StepGate gate(Options(2, 3));
  auto decision = gate.Next();
  ASSERT_TRUE(decision.ok());
  // A step runs: no client step, whatever its step.
  auto running = gate.Apply(ClientLimit(2), Client(2));
  EXPECT_EQ(running.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(running.status().message(),
              HasSubstr("client_step.global_step is 2, but the task does not hold (2 steps "
                        "done, step limit 3, a step running)"));
  gate.EndCountedStep();
  for (int64_t at : {2, 4}) {
    auto elsewhere = gate.Apply(ClientLimit(at), Client(at));
    EXPECT_EQ(elsewhere.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(elsewhere.status().message(),
                HasSubstr(absl::StrCat("client_step.global_step is ", at,
                                       ", but the task holds at step 3")));
  }
  auto taken = gate.Apply(ClientLimit(3), Client(3, false, 42));
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_EQ(*taken, 3);
  auto again = gate.Apply(ClientLimit(3), Client(3));
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(again.status().message(), HasSubstr("a client step at step 3 is already pending"));

  decision = gate.Next();
  ASSERT_TRUE(decision.ok());
  ASSERT_EQ(decision->action, StepGate::Action::kClientStep);
  EXPECT_EQ(decision->steps_done, 3);
  EXPECT_EQ(decision->client.global_step, 3);
  EXPECT_FALSE(decision->client.forward_only);
  ASSERT_NE(decision->client.payload, nullptr);
  EXPECT_EQ(dynamic_cast<TestPayload&>(*decision->client.payload).value, 42);
  EXPECT_EQ(gate.EndCountedStep().steps_done, 4);
}

TEST(StepGate, AForwardOnlyClientStepDoesNotCount) {
  StepGate gate(Options(5, 5));
  ASSERT_TRUE(gate.Apply(ClientLimit(5, true), Client(5, true)).ok());
  auto decision = gate.Next();
  ASSERT_TRUE(decision.ok());
  ASSERT_EQ(decision->action, StepGate::Action::kClientStep);
  EXPECT_TRUE(decision->client.forward_only);
  gate.EndUncountedStep();
  EXPECT_EQ(gate.steps_done(), 5);
  // Holding at 5 again: another client step at 5 is taken.
  EXPECT_TRUE(gate.Apply(ClientLimit(5, true), Client(5, true)).ok());
}

TEST(StepGate, AForwardOnlyTaskRefusesATrainingClientStep) {
  StepGateOptions options = Options(0, 0);
  options.forward_only_task = true;
  StepGate gate(options);
  auto training = gate.Apply(ClientLimit(0), Client(0));
  EXPECT_EQ(training.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(training.status().message(),
              HasSubstr("a forward-only task cannot run a training client step"));
  EXPECT_TRUE(gate.Apply(ClientLimit(0, true), Client(0, true)).ok());
}

TEST(StepGate, AControlWithoutAClientStepWithdrawsAPendingOne) {
  StepGate gate(Options(1, 1));
  ASSERT_TRUE(gate.Apply(ClientLimit(1), Client(1)).ok());
  ASSERT_TRUE(gate.Apply(Limit(1, /*finish=*/true), std::nullopt).ok());
  auto decision = gate.Next();
  ASSERT_TRUE(decision.ok());
  EXPECT_EQ(decision->action, StepGate::Action::kFinish);
}

TEST(StepGate, CheckpointStepsAddUpAndOneAtTheHoldIsWrittenThere) {
  StepGateOptions options = Options(2, 2);
  options.checkpoint_steps = {3};
  StepGate gate(options);
  // The step done is a checkpoint at hold; passed steps are ignored; later ones add up.
  ASSERT_TRUE(gate.Apply(Limit(2, false, {1, 2, 5}), std::nullopt).ok());
  auto decision = gate.Next();
  ASSERT_TRUE(decision.ok());
  EXPECT_EQ(decision->action, StepGate::Action::kCheckpointAtHold);
  EXPECT_EQ(decision->steps_done, 2);
  EXPECT_EQ(gate.RequestCheckpoint(2).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(gate.RequestCheckpoint(1).message(),
              HasSubstr("job-g rank 1: the task has already done 2 steps of the timeline; it "
                        "cannot checkpoint after step 1"));
  ASSERT_TRUE(gate.RequestCheckpoint(4).ok());
  ASSERT_TRUE(gate.Apply(Limit(6), std::nullopt).ok());
  for (int64_t at = 2; at < 6; ++at) {
    decision = gate.Next();
    ASSERT_TRUE(decision.ok());
    ASSERT_EQ(decision->action, StepGate::Action::kDataStep) << at;
    const StepGate::StepEnd end = gate.EndCountedStep();
    EXPECT_EQ(end.steps_done, at + 1);
    EXPECT_EQ(end.checkpoint_requested, at + 1 == 3 || at + 1 == 4 || at + 1 == 5) << at;
  }
}

TEST(StepGate, ACheckpointStepAtTheCountOfARunningStepHasPassed) {
  StepGate gate(Options(2, 3));
  ASSERT_TRUE(gate.Next().ok());
  ASSERT_TRUE(gate.Apply(Limit(3, false, {2}), std::nullopt).ok());
  EXPECT_FALSE(gate.EndCountedStep().checkpoint_requested);
  ASSERT_TRUE(gate.Apply(Limit(3, true), std::nullopt).ok());
  auto decision = gate.Next();
  ASSERT_TRUE(decision.ok());
  EXPECT_EQ(decision->action, StepGate::Action::kFinish);  // no checkpoint at hold
}

TEST(StepGate, StopWakesAHold) {
  StepGate gate(Options(0, 0));
  TaskThread task(gate);
  ASSERT_TRUE(gate.AwaitHolding(0, kWait).ok());
  gate.Stop("the job was cancelled");
  gate.Stop("a second reason");
  auto& decision = task.Result();
  EXPECT_EQ(decision.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(decision.status().message(), "stopped: the job was cancelled");
  EXPECT_EQ(gate.stop_reason(), "the job was cancelled");
  EXPECT_EQ(gate.Apply(Limit(1), std::nullopt).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(StepGate, StopEndsTheTaskAtItsNextBoundaryBeforeAnyStep) {
  StepGate gate(Options(0, 5));
  EXPECT_EQ(gate.stop_reason(), std::nullopt);
  gate.Stop("bye");
  EXPECT_EQ(gate.Next().status().code(), absl::StatusCode::kCancelled);
}

TEST(StepGate, AHoldLongerThanHoldTimeoutFails) {
  StepGateOptions options = Options(1, 1);
  options.hold_timeout = absl::Milliseconds(1);
  StepGate gate(options);
  auto decision = gate.Next();
  EXPECT_EQ(decision.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(decision.status().message(),
            "rank 1 held at step 1 for longer than hold_timeout (1ms) without a ControlTask");
  // The task is ending: nothing more is taken.
  EXPECT_EQ(gate.Apply(Limit(2), std::nullopt).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// The check of a client step (stage 0's dry run) runs without the gate's lock, while the
// task's thread waits in Next; a refused batch changes nothing.
TEST(StepGate, ARefusedCheckChangesNothing) {
  StepGate gate(Options(2, 2));
  TaskThread task(gate);
  ASSERT_TRUE(gate.AwaitHolding(2, kWait).ok());
  int checks = 0;
  auto refused = gate.Apply(ClientLimit(2), Client(2), [&] {
    ++checks;
    EXPECT_EQ(gate.steps_done(), 2);  // the gate's lock is free
    return absl::InvalidArgumentError("client_step.inputs (rank 0): stage 0 cannot take it");
  });
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(checks, 1);
  // Still holding at 2 with nothing pending: the same step with a batch that fits is taken.
  ASSERT_TRUE(gate.AwaitHolding(2, kWait).ok());
  EXPECT_FALSE(task.Decided());
  auto taken = gate.Apply(ClientLimit(2), Client(2, false, 7), [&] {
    ++checks;
    return absl::OkStatus();
  });
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_EQ(checks, 2);
  auto& decision = task.Result();
  ASSERT_TRUE(decision.ok());
  ASSERT_EQ(decision->action, StepGate::Action::kClientStep);
  EXPECT_EQ(dynamic_cast<TestPayload&>(*decision->client.payload).value, 7);
}

// A check blocked until released, on a thread of its own (as a ControlTask handler).
class BlockedCheck {
 public:
  BlockedCheck(StepGate& gate, int64_t step)
      : thread_([this, &gate, step] {
          result_ = gate.Apply(ClientLimit(step), Client(step), [this] {
            running_.Notify();
            EXPECT_TRUE(release_.WaitForNotificationWithTimeout(kWait));
            return absl::OkStatus();
          });
          done_.Notify();
        }) {}
  ~BlockedCheck() {
    if (!release_.HasBeenNotified()) release_.Notify();
    thread_.join();
  }
  bool WaitRunning() { return running_.WaitForNotificationWithTimeout(kWait); }
  absl::StatusOr<int64_t>& Release() {
    release_.Notify();
    EXPECT_TRUE(done_.WaitForNotificationWithTimeout(kWait));
    return result_;
  }

 private:
  absl::StatusOr<int64_t> result_ = absl::UnknownError("no result");
  absl::Notification running_, release_, done_;
  std::thread thread_;
};

// A ControlTask that moves the gate while a client step is checked wins: the client step is
// refused, and the step it allows does not start before the check has ended (the stage is
// not in use by a step during the check).
TEST(StepGate, AControlDuringTheCheckRefusesTheClientStepAndNoStepStartsMeanwhile) {
  StepGate gate(Options(2, 2));
  TaskThread task(gate);
  ASSERT_TRUE(gate.AwaitHolding(2, kWait).ok());
  BlockedCheck check(gate, 2);
  ASSERT_TRUE(check.WaitRunning());
  auto second = gate.Apply(ClientLimit(2), Client(2));
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.status().message(),
              HasSubstr("a client step at step 2 is already being checked"));
  auto raised = gate.Apply(Limit(3), std::nullopt);
  ASSERT_TRUE(raised.ok()) << raised.status();
  EXPECT_FALSE(task.Decided());  // held by the check, which still runs
  auto& checked = check.Release();
  EXPECT_EQ(checked.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(checked.status().message(),
              HasSubstr("the task moved (a ControlTask, a stop or its end) while the client step "
                        "at step 2 was being checked; it was not taken"));
  auto& decision = task.Result();
  ASSERT_TRUE(decision.ok());
  EXPECT_EQ(decision->action, StepGate::Action::kDataStep);
  EXPECT_EQ(decision->steps_done, 2);
}

TEST(StepGate, AStopDuringTheCheckRefusesTheClientStep) {
  StepGate gate(Options(0, 0));
  TaskThread task(gate);
  ASSERT_TRUE(gate.AwaitHolding(0, kWait).ok());
  BlockedCheck check(gate, 0);
  ASSERT_TRUE(check.WaitRunning());
  gate.Stop("stopping");
  EXPECT_EQ(task.Result().status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(check.Release().status().code(), absl::StatusCode::kFailedPrecondition);
}

// Right after a step's end the task's thread still writes its checkpoint and report: a client
// step's check waits until the thread is back at the gate, then runs, and the step is taken.
TEST(StepGate, TheCheckWaitsForTheTaskThreadToComeBack) {
  StepGate gate(Options(0, 1));
  RunDataStep(gate, 0);  // the limit is reached, the thread is not in Next yet
  absl::Notification checked;
  absl::StatusOr<int64_t> taken = absl::UnknownError("none");
  std::thread control([&] {
    taken = gate.Apply(ClientLimit(1), Client(1), [&] {
      checked.Notify();
      return absl::OkStatus();
    });
  });
  auto decision = gate.Next();
  control.join();
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_TRUE(checked.HasBeenNotified());
  ASSERT_TRUE(decision.ok());
  EXPECT_EQ(decision->action, StepGate::Action::kClientStep);
}

TEST(StepGate, TheCheckGivesUpWhenTheTaskThreadDoesNotComeBack) {
  StepGateOptions options = Options(0, 1);
  options.check_timeout = absl::Milliseconds(1);
  StepGate gate(options);
  RunDataStep(gate, 0);
  bool ran = false;
  auto refused = gate.Apply(ClientLimit(1), Client(1), [&] {
    ran = true;
    return absl::OkStatus();
  });
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("job-g attempt 3 rank 1: the task did not come back to its step boundary "
                        "within 1ms to check the client step at step 1"));
  EXPECT_FALSE(ran);
  // Nothing was taken: the next boundary holds, and a client step is taken without a check.
  ASSERT_TRUE(gate.Apply(ClientLimit(1), Client(1)).ok());
  auto decision = gate.Next();
  ASSERT_TRUE(decision.ok());
  EXPECT_EQ(decision->action, StepGate::Action::kClientStep);
}

// Held work (a generation session's decoding step) runs while the task holds, no step starts
// meanwhile, and the hold goes on afterwards; without a hold it is refused.
TEST(StepGate, HeldWorkRunsOnlyWhileHoldingAndStartsNoStepMeanwhile) {
  StepGate gate(Options(2, 3));
  absl::Status refused = gate.RunHeld([] { return absl::OkStatus(); }, "decoding step");
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("job-g attempt 3 rank 1: decoding step needs the task "
                                           "to hold (its job PAUSED), but it has 2 steps done of "
                                           "its step limit 3"));
  RunDataStep(gate, 2);
  TaskThread task(gate);
  ASSERT_TRUE(gate.AwaitHolding(3, kWait).ok());
  absl::Notification running, release;
  absl::Status worked = absl::UnknownError("not run");
  std::thread work([&] {
    worked = gate.RunHeld(
        [&] {
          running.Notify();
          release.WaitForNotificationWithTimeout(kWait);
          return absl::OkStatus();
        },
        "decoding step");
  });
  ASSERT_TRUE(running.WaitForNotificationWithTimeout(kWait));
  ASSERT_TRUE(gate.Apply(Limit(4), std::nullopt).ok());  // a resume while the work runs
  EXPECT_FALSE(task.Decided());
  release.Notify();
  work.join();
  EXPECT_TRUE(worked.ok()) << worked;
  auto& decision = task.Result();
  ASSERT_TRUE(decision.ok());
  EXPECT_EQ(decision->action, StepGate::Action::kDataStep);
  EXPECT_EQ(decision->steps_done, 3);
}

TEST(StepGate, HeldWorkLeavesTheHoldAsItWasAndReturnsItsOwnError) {
  StepGate gate(Options(1, 1));
  TaskThread task(gate);
  ASSERT_TRUE(gate.AwaitHolding(1, kWait).ok());
  const absl::Status failed =
      gate.RunHeld([] { return absl::InvalidArgumentError("rows: bad"); }, "decoding step");
  EXPECT_EQ(failed, absl::InvalidArgumentError("rows: bad"));
  EXPECT_TRUE(gate.RunHeld([] { return absl::OkStatus(); }, "decoding step").ok());
  EXPECT_TRUE(gate.AwaitHolding(1, kWait).ok());
  EXPECT_FALSE(task.Decided());
  gate.Stop("done");
  EXPECT_EQ(task.Result().status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(gate.RunHeld([] { return absl::OkStatus(); }, "decoding step").code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace stagecoach::runtime::step_gate_test
