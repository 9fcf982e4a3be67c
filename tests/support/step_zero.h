// A job trained from a checkpoint of its initial parameters: what tests compare with a
// reference that starts from the job's own step-0 parameters (the built-in decoders draw theirs
// with LibTorch's generator, which a reference does not repeat).
#pragma once

#include <string>

#include "tests/support/local_cluster.h"

namespace stagecoach::testing {

// Submits the spec file `spec` held before its first step and checkpoints it there (the job's
// checkpoint dir gets step 0: the initial parameters); the job stays PAUSED, its id in *id.
// Fails the test (gtest assertions) otherwise, saying why the job failed.
void HoldAtAStepZeroCheckpoint(LocalCluster& cl, const std::string& spec, std::string* id);

// HoldAtAStepZeroCheckpoint, then resumes the job and waits for its end. Fails the test unless
// it succeeds; the finished job in *out.
void RunFromAStepZeroCheckpoint(LocalCluster& cl, const std::string& spec, v1::Job* out);

}  // namespace stagecoach::testing
