// The measured Chrome trace of one training or inference step, assembled from every rank's step
// report (ReportStepRequest.executed_actions, action_timings, step_start_time) on one time base,
// and a bounded per-job store of the latest steps' reports that GetStepTrace reads.
//
// The trace is schedule::FormatChromeTrace's format (the simulator's trace), in microseconds from
// the earliest rank's step start. Each SEND is paired with its peer's RECV as the lowering pass
// pairs them: SEND_F(s, mb) with RECV_F(s+1, mb), SEND_B(s, mb) with RECV_B(s-1, mb). A transfer
// starts at its SEND's start and arrives at the latest of: its RECV's end, its SEND's start (a
// receive posted before the data was sent: a transfer never arrives before it starts), and,
// when the compute action that consumes the received tensor (the F of RECV_F's stage and
// microbatch; the I or B of RECV_B's) waited for data (wait_us > 0), the end of that wait: a
// worker's RECV only posts the receive, and its consumer blocks until the data is there. A SEND
// or RECV without a partner (its peer rank did not report, or lists no partner) gets no
// transfer. Transfer sizes are not reported per message; they show as 0 bytes.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "stagecoach/v1/coordinator.pb.h"
#include "stagecoach/v1/types.pb.h"

namespace stagecoach::coordinator {

// One rank's report of one step.
struct RankStepTiming {
  // The trace's process: the rank, or with data-parallel replicas the task index
  // (Plan::TaskIndex); transfers pair only within one replica.
  int rank = 0;
  int replica = 0;
  // The process's name in the trace ("Replica 1 rank 0"); "Rank <rank>" when empty.
  std::string label;
  // Executed actions in execution order, PyTorch syntax (ReportStepRequest.executed_actions).
  std::vector<std::string> actions;
  // timings[i] is actions[i]'s, in microseconds after `start` (ReportStepRequest.action_timings).
  std::vector<v1::ActionTiming> timings;
  // Wall-clock time the rank's step started (ReportStepRequest.step_start_time).
  absl::Time start = absl::UnixEpoch();
  // With replicas: the buckets of the step's gradient reduction (times relative to `start`),
  // drawn on the rank's "gradient reduction" track.
  std::vector<v1::ReductionBucket> reduction;
  // The rank's measured bubble ratio of the step (ReportStepRequest.bubble_ratio).
  double bubble_ratio = 0;
  // With placement.shard: parameters: the step's all-gathers of stage parameters, drawn on the
  // rank's "parameter gathering" track.
  std::vector<v1::ReductionBucket> gathers;
};

// The Chrome trace JSON of one step from `ranks` (any order; rank r is process r, ranks that
// are missing have no events), with otherData.title `title`. t = 0 is the earliest rank's
// `start`; an action of rank r runs from r.start + start_us to r.start + end_us.
// INVALID_ARGUMENT naming the rank (and action) when a rank is negative or listed twice, its
// actions and timings differ in length, an action does not parse, or a timing ends before it
// starts.
// With `step_id` every event of the step carries it (ChromeTraceOptions::step_id).
absl::StatusOr<std::string> MeasuredStepTrace(const std::vector<RankStepTiming>& ranks,
                                              const std::string& title,
                                              const std::string& step_id = "");

// Keeps the per-rank timings of the latest `capacity` steps (global step -> ranks), for a job's
// GetStepTrace. Not thread-safe: its owner (the job manager) serialises calls. Copyable and
// movable.
class StepTraceStore {
 public:
  // `capacity` >= 1 steps are kept (smaller values keep 1).
  explicit StepTraceStore(int capacity = 64);

  // Records a rank's report of `global_step`, replacing an earlier report of the same rank and
  // step. Keeps the `capacity` highest steps: adding a step beyond them evicts the lowest; a
  // step below all of them when the store is full is dropped.
  void Add(int64_t global_step, RankStepTiming rank);

  // The trace (MeasuredStepTrace) of `global_step`, or with -1 of the latest step every one of
  // ranks 0 .. num_ranks-1 reported; sets *traced_step (when not null) to the step traced.
  // NOT_FOUND when the step is not kept, lacks a rank's report, or (for -1) no kept step is
  // complete; the message names the kept range ("steps 3..66 are kept"). INVALID_ARGUMENT as
  // MeasuredStepTrace.
  // Every event carries the step's id: "<job_id>/step-<global step>" ("step-<n>" without a
  // job id).
  absl::StatusOr<std::string> Trace(int64_t global_step, int num_ranks, const std::string& title,
                                    int64_t* traced_step, const std::string& job_id = "") const;

  // The latest kept step that ranks 0 .. num_ranks-1 all reported, and its reports by rank;
  // nullptr (and *step -1) when none is.
  const std::map<int, RankStepTiming>* LatestComplete(int num_ranks, int64_t* step) const;

  // The lowest and highest kept step; -1 when nothing is kept.
  int64_t first_kept() const;
  int64_t last_kept() const;

  // Forgets the steps after `global_step` (a job restarted from the checkpoint at that step will
  // run them again).
  void DropAfter(int64_t global_step);

 private:
  int capacity_;
  std::map<int64_t, std::map<int, RankStepTiming>> steps_;  // global step -> rank -> report
};

}  // namespace stagecoach::coordinator
