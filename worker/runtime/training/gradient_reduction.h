// Gradient reduction across a job's data-parallel replicas (placement.replicas), overlapped with
// the pipeline: when the executor reaches a stage's REDUCE_GRAD (its last backward, B or W, has
// run), StageReady hands that stage's gradients to a communication executor, which averages them
// over the replicas in buckets (one collective call each) while the rank goes on with its other
// stages' actions. Finish, before the optimizer steps, starts the stages that never became
// ready (a schedule file without REDUCE_GRAD) and waits for every bucket: the optimizer, the
// clipping and the non-finite check all need the whole gradient of every stage.
//
// Buckets: a stage's parameters in their order, cut so that a bucket holds at most
// bucket_bytes of gradient (a larger parameter is a bucket of its own) and one dtype (float32
// or float64). Parameters whose gradient is undefined are left out (every replica runs the same
// model, so all leave out the same ones). Each bucket is copied into one flat buffer (device
// memory for a device-memory group), all-reduced with ReduceOp::kMean, and copied back, so the
// replicas of a stage end with the same bits.
//
// Hidden ratio of a step: 1 - waited / span, where span runs from the start of the first
// bucket's reduction to the end of the last and waited is the time Finish blocked the compute
// thread (with overlap off the reduction runs inside Finish, so waited >= span and the ratio is
// 0); clamped to [0, 1], 0 without buckets.
//
// Threads: BeginStep, StageReady and Finish are the task's thread's; Abort any thread's. The
// executor must run closures one at a time in the order they were queued (a WorkQueue of one
// thread), so that every replica issues its collective calls in the same order.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <set>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/util/executor.h"
#include "worker/collectives/collective_timing.h"
#include "worker/collectives/collectives.h"
#include "worker/model/stage_model.h"
#include "worker/runtime/sharding/zero_shards.h"

namespace stagecoach::runtime {

struct GradientReductionOptions {
  // Start a stage's reduction at StageReady (true) or every stage's in Finish (false).
  bool overlap = true;
  // Most gradient bytes per bucket.
  int64_t bucket_bytes = int64_t{4} << 20;
  // Bound on each collective call and on Finish's wait.
  absl::Duration timeout = absl::Seconds(60);
  // placement.shard: each stage's gradients are reduce-scattered into its shard (one call per
  // stage) instead of all-reduced in buckets (from level gradients on, the full gradients are
  // freed then), and GatherParameters spreads the stepped shards (levels optimizer and
  // gradients); null without sharding. Must outlive the reducer.
  ZeroShards* shards = nullptr;
};

// One bucket's reduction, relative to the step's start (BeginStep).
using BucketTiming = collectives::CollectiveTiming;

// What a step's reduction did.
struct ReductionReport {
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
  absl::Duration span;
  absl::Duration waited;
  double hidden_ratio = 0.0;
  std::vector<BucketTiming> buckets;  // in the order they ran
  // With shards: what GatherParameters sent, counted in bytes_sent/received too.
  int64_t gather_bytes_sent = 0;
};

class GradientReducer {
 public:
  // `group` (the rank's data-parallel group), `stages` and `comm` must outlive the reducer.
  GradientReducer(GradientReductionOptions options, collectives::Collectives* group,
                  std::map<int, model::StageModel*> stages, Executor* comm);
  // Waits for a reduction in flight (Abort first to cut it short).
  ~GradientReducer();

  // Starts a step at `step_start` (the executor's step start: bucket timings count from it).
  // `deferred`: StageReady is ignored and Finish reduces every stage (a step of several
  // passes whose gradients are complete only after the last: replica_membership.h).
  void BeginStep(absl::Time step_start, bool deferred = false);

  // Stage `stage`'s gradients are complete for this step. Once per stage per step; later calls
  // for the same stage are ignored.
  void StageReady(int stage);

  // Between steps: reduces over `group` from now on (the data-parallel group re-formed without
  // a lost replica), whose ranks hold the gradients of `slices` slices of the global batch in
  // all: each bucket is summed over the group and divided by `slices` (the mean over the group
  // when they are as many). `group` must outlive the reducer or the next SetGroup. Waits (up to
  // the timeout) for reductions still returning from the old group (abort it first).
  void SetGroup(collectives::Collectives* group, int slices);

  // Reduces the stages not started yet, then waits for every bucket. The first collective error
  // (the group is then aborted), INVALID_ARGUMENT for a gradient dtype other than float32 or
  // float64, or DEADLINE_EXCEEDED after the timeout (the group aborted).
  absl::StatusOr<ReductionReport> Finish();

  // With shards, after the optimizer stepped them: all-gathers the stages' parameters
  // (ZeroShards::GatherParameters) on the calling thread, adding its bytes to `report`; nothing
  // at level parameters (the next UNSHARD gathers them). The group's errors (the group is then
  // aborted).
  absl::Status GatherParameters(ReductionReport& report);

  // After the step: every stage's buffers become replica 0's on every replica
  // (replica_buffers.h), on the calling thread. The group's errors (the group is then aborted).
  absl::Status BroadcastBuffers();

  // Aborts the group: a reduction in flight and later ones fail promptly.
  void Abort();

 private:
  // Reduces every bucket of `stage` (on the communication executor, or inline without overlap).
  void ReduceStage(int stage);
  absl::Status ReduceBucket(int stage, const std::vector<torch::Tensor>& grads);
  // Reduce-scatters stage `stage`'s flat gradients into its shard (ZeRO-1).
  absl::Status ReduceScatterStage(int stage);
  void Launch(int stage);

  const GradientReductionOptions options_;
  collectives::Collectives* group_;
  int slices_ = 0;  // 0: as many as the group's ranks
  const std::map<int, model::StageModel*> stages_;
  Executor* const comm_;

  // The task's thread's.
  std::set<int> started_;
  bool deferred_ = false;
  absl::Time step_start_;
  collectives::CollectiveStats stats_at_start_;

  absl::Mutex mu_;
  int outstanding_ ABSL_GUARDED_BY(mu_) = 0;  // stages queued or being reduced
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  std::vector<BucketTiming> buckets_ ABSL_GUARDED_BY(mu_);
  TaskScope scope_;
};

}  // namespace stagecoach::runtime
