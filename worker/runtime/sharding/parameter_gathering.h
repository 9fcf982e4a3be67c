// ZeRO-3 (placement.shard: parameters) for one rank's stages: the StageSharding the executor
// drives through UNSHARD and RESHARD (executor/stage_sharding.h), over ZeroShards at level
// parameters.
//
// Unshard queues the all-gather of the stage's shards (ZeroShards::GatherStage) on the
// communication executor the gradient reducer uses, so that every replica issues the group's
// collectives (all-gathers and reduce-scatters) in the order of its action list, which is the
// same list on every replica; the compute thread blocks only in AwaitGathered, at the first
// action that needs the stage. Reshard waits for a gather still running and frees the whole
// copy (ZeroShards::ReleaseStage). Between steps every stage is released: the parameters hold
// no memory, the optimizer's shards do.
//
// Outside a step's actions (a checkpoint of whole parameters, an evaluation's forwards),
// GatherAll gathers every stage on the calling thread and ReleaseAll frees them again; every
// replica does so at the same global step, so the collectives pair up.
//
// Hidden ratio of a step's all-gathers, as for gradient reduction: 1 - waited / span, span from
// the start of the first gather to the end of the last, waited the compute thread's time in
// AwaitGathered (and Reshard); clamped to [0, 1], 0 without gathers.
//
// Threads: every method is the task's thread's (the executor's); the gathers run on the
// communication executor, one at a time in queue order (a WorkQueue of one thread).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/util/executor.h"
#include "worker/collectives/collective_timing.h"
#include "worker/collectives/collectives.h"
#include "worker/runtime/executor/progress_beacon.h"
#include "worker/runtime/executor/stage_sharding.h"
#include "worker/runtime/sharding/zero_shards.h"

namespace stagecoach::runtime {

// One all-gather of a stage's parameters, relative to the step's start; bytes: the gathered
// parameters' (padded).
using GatherTiming = collectives::CollectiveTiming;

// What a step's all-gathers did.
struct GatherReport {
  std::vector<GatherTiming> gathers;  // in the order they ran
  absl::Duration span;
  absl::Duration waited;
  double hidden_ratio = 0.0;
};

class ParameterGathering final : public StageSharding {
 public:
  // `shards` (at level parameters), `group` and `comm` must outlive this. Releases every stage:
  // construct it once the parameters are restored and the shards loaded.
  ParameterGathering(ZeroShards* shards, collectives::Collectives* group, Executor* comm,
                     absl::Duration timeout);
  // Waits for a gather in flight (abort the group first to cut it short).
  ~ParameterGathering() override;

  // Where the compute thread's waits for a gather show: the task's beacon marks each as a wait
  // of kind ALL_GATHER on the stage (no peer rank: the other replicas), so that a gather stuck
  // on a lost replica reads as a wait, not as a slow action. Null (the default): nowhere.
  void set_progress(ProgressBeacon* progress) { progress_ = progress; }

  // A step starts at `step_start` (gather timings count from it); its report starts empty.
  void BeginStep(absl::Time step_start);
  // The step's gathers so far.
  GatherReport Report() const;

  void Unshard(int stage) override;
  absl::StatusOr<absl::Duration> AwaitGathered(int stage, const std::string& where) override;
  absl::Status Reshard(int stage, const std::string& where) override;
  std::function<void()> Placeholders(int stage) override;

  // Every stage gathered now, on this thread (between steps); the group's errors (the group is
  // then aborted). ReleaseAll frees them again.
  absl::Status GatherAll();
  void ReleaseAll();

 private:
  enum class State { kReleased, kGathering, kGathered };
  struct Stage {
    State state = State::kReleased;
    absl::Status error;  // of its last gather
  };

  // Queued by Unshard: gathers `stage` and records it.
  void Gather(int stage);
  // ZeroShards::GatherStage with LibTorch's errors as INTERNAL; aborts the group on an error.
  absl::Status GatherNow(int stage);
  // Waits until `stage` is not being gathered; its state then. The error names `where`.
  absl::StatusOr<State> AwaitSettled(int stage, const std::string& where)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  ZeroShards* const shards_;
  collectives::Collectives* const group_;
  Executor* const comm_;
  const absl::Duration timeout_;
  absl::Time step_start_;               // the task's thread's
  ProgressBeacon* progress_ = nullptr;  // the task's thread's

  mutable absl::Mutex mu_;
  std::map<int, Stage> stages_ ABSL_GUARDED_BY(mu_);
  std::vector<GatherTiming> gathers_ ABSL_GUARDED_BY(mu_);
  absl::Duration waited_ ABSL_GUARDED_BY(mu_);
  TaskScope scope_;
};

}  // namespace stagecoach::runtime
