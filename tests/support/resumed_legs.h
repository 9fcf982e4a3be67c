// Jobs run one after another on a LocalCluster, each resuming from the checkpoint the one before
// wrote after its last step: what the tests of resuming on another layout (replicas, shard
// levels) share. Thread-compatible; gtest assertions.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tests/support/local_cluster.h"

namespace stagecoach::testing {

struct ResumedLegs {
  std::vector<double> losses;       // every leg's, in order
  std::string last_checkpoint_dir;  // the last leg's training.checkpoint.dir
};

// Leg i's spec is spec(i, ckpt, resume_from): ckpt = <cluster dir>/<name>-<i>, its checkpoint
// directory, and resume_from the previous leg's step directory after its `steps` steps ("" for
// the first leg). Every leg must succeed with `steps` losses, else a fatal failure names it and
// the function returns early.
void RunResumedLegs(LocalCluster& cluster, const std::string& name, int legs, int64_t steps,
                    const std::function<std::string(int leg, const std::string& ckpt,
                                                    const std::string& resume_from)>& spec,
                    ResumedLegs* out);

// Each of `got` within atol + rtol |want| of `want` (as many of them), naming the step.
void ExpectLossesNear(const std::vector<double>& got, const std::vector<double>& want, double rtol,
                      double atol);

}  // namespace stagecoach::testing
