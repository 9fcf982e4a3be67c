// What UNSHARD and RESHARD do when a rank's stages keep their parameters sharded across the
// data-parallel replicas (placement.shard: parameters; worker/runtime/sharding/
// parameter_gathering.h implements it). Without one (ExecutorOptions::sharding null) the two
// actions do nothing and every stage's parameters are whole.
//
// The executor calls, on its thread, in the order of the rank's action list:
//   UNSHARD s      Unshard(s): starts gathering stage s's parameters and returns at once;
//   F, I, B, W s   first AwaitGathered(s): blocks until they are whole (the time it blocked
//                  counts as the action's wait for data, like a receive's);
//   RESHARD s      Reshard(s): frees the whole copy (after waiting for a gather still running).
// and, around a probe of a stage's output shapes (AgreeShapes, between steps), Placeholders.
#pragma once

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace stagecoach::runtime {

class StageSharding {
 public:
  virtual ~StageSharding() = default;

  virtual void Unshard(int stage) = 0;
  // The time it blocked. FAILED_PRECONDITION naming `where` when stage `stage` is sharded and no
  // UNSHARD started its gather; the gather's error; DEADLINE_EXCEEDED after the timeout.
  virtual absl::StatusOr<absl::Duration> AwaitGathered(int stage, const std::string& where) = 0;
  // FAILED_PRECONDITION naming `where` when the stage is not unsharded; the gather's error.
  virtual absl::Status Reshard(int stage, const std::string& where) = 0;
  // Gives a sharded stage parameters of their full shapes (zeros) until the returned closure
  // runs (nothing for a whole stage): a probe needs the shapes, not the values.
  virtual std::function<void()> Placeholders(int stage) = 0;
};

}  // namespace stagecoach::runtime
