// The straggler rule: a rank whose compute is persistently slower than that of its peers with
// the same work is straggling (v1::RankStraggler).
//
// Peers: the tasks whose ranks hold stages of the same work (the same number of layers and
// parameters, and the same first/last role: the loss runs on the last stage), which always
// includes the rank's data-parallel replicas and, in a pipeline cut into equal stages, the other
// ranks with equal stages. A task without peers is never judged.
//
// Compute: per step, a task's F, B, I, W and OVERLAP_F_B actions' own time (end - start - wait:
// what it computed, not what it waited for). Each complete step gives each judged task the
// ratio of its compute to the median of its peers' in that step (and, per action kind, of its
// mean time per action to the median of theirs). Its pace is the median of those ratios over the
// window: the steps completed in the latest `min_window` of time, and at least the latest
// `window` steps (at most kMaxWindowSteps). A median is moved by at most one place by one slow
// step (a checkpoint write, a page fault storm), so only a rank slower in most of the window's
// steps is named. It is straggling from when its pace reaches `threshold` with a full window (at
// least `window` steps, over at least `min_window` since the rule began) until its pace falls
// below halfway between 1 and the threshold (so that a pace near the threshold does not flap).
//
// Why a window in time as well as in steps: CPU time-sharing makes a rank slower for stretches
// of a few hundred milliseconds, which are many steps of a small model. Measured on the 2-core
// machine (4 worker processes, 2 replicas of a 2-stage MLP, ~45 steps/s; docs/diagnosis.md):
// over 8-step windows identical ranks' pace reached p90 1.22, p99 1.48, max 1.99; over windows of
// 500 steps (~11 s), p90 1.04, max 1.08. The threshold's default, 1.25, is three times that
// maximum's distance from 1, and a rank a quarter slower than its peers holds the whole pipeline
// back by as much at every step.
//
// Not thread-safe: its owner (the job, under the job table's lock) serialises calls.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "stagecoach/v1/diagnosis.pb.h"
#include "stagecoach/v1/types.pb.h"

namespace stagecoach::coordinator {

struct StragglerOptions {
  double threshold = 1.25;                        // --straggler-threshold
  int window = 8;                                 // --straggler-window, in steps
  absl::Duration min_window = absl::Seconds(30);  // --straggler-min-window
};

// The most steps a window holds, however many complete within min_window.
inline constexpr int kMaxWindowSteps = 1024;

// One task's compute in one step, in seconds: in total and by action kind (sum, actions).
struct ComputeSample {
  double total = 0;
  std::map<std::string, std::pair<double, int>> by_kind;
};

// From a step report's executed actions and their timings (as long as the actions, else an
// empty sample); actions that do not parse or are not compute are left out.
ComputeSample SampleStep(const std::vector<std::string>& actions,
                         const std::vector<v1::ActionTiming>& timings);

class StragglerWatch {
 public:
  StragglerWatch() = default;
  // `work_keys[task]` (task = replica * num_ranks + rank): tasks with equal keys are peers.
  StragglerWatch(StragglerOptions options, std::vector<std::string> work_keys, int num_ranks);

  // Records `task`'s compute of global step `step` (kept until the step is complete; at most
  // the 16 latest steps are kept).
  void Add(int64_t step, int task, ComputeSample sample);

  // The step is complete at `now` (every rank of the healthy replicas reported it): its samples
  // join the window and the rule runs. Returns the tasks whose straggling began or ended.
  std::vector<v1::StragglerEvent> Complete(int64_t step, absl::Time now);

  std::vector<v1::RankStraggler> Stragglers() const;
  // Every task that has peers.
  std::vector<v1::RankPace> Pace() const;
  const StragglerOptions& options() const { return options_; }

 private:
  v1::RankStraggler Describe(int task) const;
  // The task's ratios over the window (its total's, and each kind's), medians; false when the
  // window is not full or the task has no peers.
  void Judge(int task, bool full, std::vector<v1::StragglerEvent>& changes);

  StragglerOptions options_;
  std::vector<std::string> keys_;
  int num_ranks_ = 1;
  std::vector<std::vector<int>> peers_;  // by task
  std::map<int64_t, std::map<int, ComputeSample>> partial_;
  // The window's complete steps: per step, per task, its ratio (total and by kind); tasks
  // absent from a step (a lost replica) have none.
  struct StepRatios {
    absl::Time completed;
    std::map<int, double> total;
    std::map<int, std::map<std::string, double>> by_kind;
  };
  std::deque<StepRatios> window_;
  absl::Time first_completed_ = absl::InfinitePast();     // the rule's first complete step
  std::vector<double> pace_;                              // by task; 0 before a full window
  std::vector<std::map<std::string, double>> kind_pace_;  // by task
  std::vector<bool> straggling_;                          // by task
};

}  // namespace stagecoach::coordinator
