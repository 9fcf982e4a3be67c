// The step gate of a task: at every step boundary it decides what the task's thread does next,
// and it holds the thread (no busy loop) while there is nothing to do. ControlTask, Stop and
// RequestCheckpoint steer it from other threads. No LibTorch: the gate does not know what a
// client step's batch is (ClientPayload is opaque to it).
//
// Steps are counted in the job's timeline ("global steps", counting the resumed checkpoint's
// resume.step). At every step boundary (Next), with `done` global steps done, the task:
//   0. when stopped, ends (CANCELLED "stopped: <reason>");
//   1. writes the checkpoint asked for at exactly `done` while holding (checkpoint at hold),
//      if there is one;
//   2. else runs the pending client step for `done`, if there is one;
//   3. else, when done < step_limit, runs a data step (the spec's batch for step `done`);
//   4. else, with finish_at_limit, ends: every rank meets at a final barrier, then SUCCEEDED;
//   5. else holds: waits until a ControlTask (Apply) changes something or Stop is called; a
//      hold longer than hold_timeout fails the task (DEADLINE_EXCEEDED).
// step_limit and finish_at_limit start as the options' and Apply replaces them;
// step_limit == steps done starts the task held.
//
// A step runs from the decision (Next) to EndCountedStep / EndUncountedStep: meanwhile a
// step_limit below done + 1 is refused, and a checkpoint step equal to done has passed (ignored);
// while nothing runs, one equal to done asks for a checkpoint at hold. Checkpoint steps: the
// options', Apply's and RequestCheckpoint's add up; EndCountedStep says whether the new step
// count is one of them.
//
// Client steps. Apply hands over at most one client step, only while the task holds at exactly
// the client step's global_step. Its check (e.g. running the batch through stage 0) runs
// without the gate's lock, only while the task's thread waits in Next, and no step starts
// until the check ends; the client step is taken only if the check passes and nothing moved
// the gate meanwhile (another Apply, Stop, the task ending). A refused client step changes
// nothing in the gate.
//
// Thread safety: every method is thread-safe. Next, EndCountedStep, EndUncountedStep and
// Finish belong to the task's thread. The gate owns one mutex, never held while calling out
// (the check runs without it).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace stagecoach::runtime {

struct StepGateOptions {
  // Who the task is, for messages: "<job_id> attempt <attempt> rank <rank>".
  std::string job_id;
  int64_t attempt = 0;
  int rank = 0;
  // Global steps done when the task starts (a resumed checkpoint's step, else 0).
  int64_t steps_done = 0;
  int64_t step_limit = 0;
  bool finish_at_limit = false;
  // Global steps after which to checkpoint (besides every_steps, which the gate does not know).
  std::vector<int64_t> checkpoint_steps;
  // The longest hold without an Apply; must be > 0.
  absl::Duration hold_timeout = absl::Hours(24);
  // The longest a client step's check waits for the task's thread to come to its step boundary
  // (it may still be setting up, or writing the last step's checkpoint or sending its report).
  absl::Duration check_timeout = absl::Seconds(60);
  // A forward-only task: a training client step is refused.
  bool forward_only_task = false;
};

class StepGate {
 public:
  // What a client step carries besides its step (its decoded batch); opaque to the gate.
  class ClientPayload {
   public:
    virtual ~ClientPayload() = default;
  };

  struct ClientStep {
    // The timeline step it runs at (the task must hold at exactly this many steps).
    int64_t global_step = 0;
    // Forward-only: runs, does not count in the timeline. Else a training step that counts.
    bool forward_only = false;
    std::unique_ptr<ClientPayload> payload;
  };

  // What a ControlTask asks of the gate (besides a client step).
  struct Control {
    int64_t step_limit = 0;
    bool finish_at_limit = false;
    // Steps the task has passed are ignored; a step equal to the steps done while nothing runs
    // asks for a checkpoint at hold.
    std::vector<int64_t> checkpoint_steps;
  };

  enum class Action { kDataStep, kClientStep, kCheckpointAtHold, kFinish };

  struct Decision {
    Action action = Action::kFinish;
    // Global steps done at the decision (the step a data step runs is this one).
    int64_t steps_done = 0;
    // kClientStep: the client step handed over by Apply.
    ClientStep client;
  };

  struct StepEnd {
    // Global steps done after the step.
    int64_t steps_done = 0;
    // Whether that count is one of the checkpoint steps.
    bool checkpoint_requested = false;
  };

  // Runs without the gate's lock while the task holds; a non-OK result refuses the client step
  // and is returned by Apply as is.
  using Check = std::function<absl::Status()>;

  explicit StepGate(StepGateOptions options);

  StepGate(const StepGate&) = delete;
  StepGate& operator=(const StepGate&) = delete;

  // The task's thread, at a step boundary: the next thing to do (see the file comment), after
  // holding as long as there is nothing. kDataStep and kClientStep start a step (end it with
  // EndCountedStep or EndUncountedStep); kFinish marks the task finishing. CANCELLED
  // "stopped: <reason>" after Stop; DEADLINE_EXCEEDED naming the rank and step after a hold
  // longer than hold_timeout. After an error the task is finishing.
  absl::StatusOr<Decision> Next();

  // The task's thread: the running step counted in the timeline (a data step or a training
  // client step) ended.
  StepEnd EndCountedStep();
  // The task's thread: the running forward-only client step ended (the timeline stays).
  void EndUncountedStep();
  // The task's thread: the task is ending; every later Apply is refused.
  void Finish();

  // Ends the task at its next boundary and wakes a hold. The first reason is kept.
  void Stop(const std::string& reason);
  // The reason given to the first Stop; nullopt when not stopped.
  std::optional<std::string> stop_reason() const;

  // Adds a checkpoint after the step that brings the timeline to `global_step` steps.
  // FAILED_PRECONDITION (naming job, rank and steps) when that many steps are done already.
  absl::Status RequestCheckpoint(int64_t global_step);

  // A ControlTask: replaces step_limit and finish_at_limit, adds checkpoint steps and hands over
  // `client` (when given; without one, a pending client step that has not started is
  // withdrawn); runs `check` first when given with a client step. Returns the global
  // steps done when the request was taken. FAILED_PRECONDITION (naming job, attempt, rank and
  // steps) for a task that is ending, a step_limit below the steps done (or below done + 1 while
  // a step runs), a client step when the task does not hold at exactly its global_step or
  // another one is pending or being checked, a training client step on a forward-only task,
  // and a client step whose check was overtaken (another Apply, Stop, the task ending);
  // DEADLINE_EXCEEDED when the task's thread does not come back to its boundary within
  // check_timeout; the check's own error. On any error nothing changes.
  absl::StatusOr<int64_t> Apply(const Control& control, std::optional<ClientStep> client,
                                const Check& check = nullptr);

  // Runs `work` on the caller's thread while the task holds (its stages idle: a generation
  // session's decoding step), starting no step until it ends; the hold goes on afterwards.
  // Waits up to check_timeout for another such work or a client step's check to end and for
  // the task's thread to come back to its boundary. FAILED_PRECONDITION (naming job, rank and
  // steps, and `what`) when the task does not hold (a step runs or is due, a client step is
  // pending, the task is ending); DEADLINE_EXCEEDED after check_timeout; `work`'s own error.
  absl::Status RunHeld(const Check& work, const std::string& what);

  // Blocks until the task's thread holds (waits in Next with nothing to do) at `steps_done`
  // global steps; DEADLINE_EXCEEDED after `timeout`, FAILED_PRECONDITION once the task ends.
  // For observers (tests, status); the hold does not change.
  absl::Status AwaitHolding(int64_t steps_done, absl::Duration timeout);

  // Global steps of the timeline done so far.
  int64_t steps_done() const;

  // Before the task's first step: its timeline starts at `steps_done` and it holds at
  // `step_limit` (finishing there with `finish_at_limit`), a replacement rank joining a running
  // job at that step with the job's step control (TaskAssignment.join).
  void StartAt(int64_t steps_done, int64_t step_limit, bool finish_at_limit);

 private:
  // "<job> attempt <a> rank <r>".
  std::string Who() const;
  // Apply's checks of the gate's state (the order of the errors is the contract's).
  absl::Status ValidateLocked(const Control& control, const ClientStep* client) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks `step` as checked (Next starts nothing meanwhile), waits up to check_timeout for the
  // task's thread to be back in Next (or ending), then runs `work` without the lock if
  // `may_run` (called under it) still holds, and sets *ran. DEADLINE_EXCEEDED ending with
  // `for_what` on the timeout; else `work`'s result (OK when it did not run).
  absl::Status AtBoundaryLocked(int64_t step, const std::function<bool()>& may_run,
                                const Check& work, const std::string& for_what, bool* ran)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs `check` without the lock once the task's thread waits in Next; FAILED_PRECONDITION
  // when the gate moved meanwhile.
  absl::Status CheckLocked(int64_t global_step, const Check& check)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits in Next until something may have changed; the hold's error after hold_timeout.
  absl::Status HoldLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the gate would hold now: nothing runs, the limit is reached and no finish.
  bool HoldsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const StepGateOptions options_;
  mutable absl::Mutex mu_;
  std::optional<std::string> stop_reason_ ABSL_GUARDED_BY(mu_);
  int64_t steps_done_ ABSL_GUARDED_BY(mu_) = 0;
  // A step runs (between the decision and its end).
  bool executing_ ABSL_GUARDED_BY(mu_) = false;
  // The task is ending (finish_at_limit reached, an error, Finish).
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  int64_t step_limit_ ABSL_GUARDED_BY(mu_) = 0;
  bool finish_at_limit_ ABSL_GUARDED_BY(mu_) = false;
  std::set<int64_t> checkpoint_steps_ ABSL_GUARDED_BY(mu_);
  // A checkpoint asked for at exactly the steps done while holding.
  bool checkpoint_at_hold_ ABSL_GUARDED_BY(mu_) = false;
  // The client step to run at the next boundary.
  std::optional<ClientStep> pending_client_ ABSL_GUARDED_BY(mu_);
  // Bumped by every Apply that takes effect and by Stop, so that a hold wakes up and a check
  // can tell whether the gate moved while it ran.
  int64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  // The global_step of the client step whose check runs (or waits to), or of a RunHeld's work:
  // Next starts nothing until it ends.
  std::optional<int64_t> checking_step_ ABSL_GUARDED_BY(mu_);
  // The task's thread is inside Next (not using the stages).
  bool in_next_ ABSL_GUARDED_BY(mu_) = false;
  // The task's thread waits in a hold with nothing to do.
  bool holding_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace stagecoach::runtime
