// A job trained from a checkpoint of its initial parameters: what tests compare with a
// reference that starts from the job's own step-0 parameters (the built-in decoders draw theirs
// with LibTorch's generator, which a reference does not repeat).
#pragma once

#include <string>

#include "tests/support/local_cluster.h"

namespace stagecoach::testing {

// Submits the spec file `spec` held before its first step, checkpoints it there (the job's
// checkpoint dir gets step 0: the initial parameters), resumes it and waits for its end. Fails
// the test (gtest assertions) unless it succeeds; the finished job in *out.
void RunFromAStepZeroCheckpoint(LocalCluster& cl, const std::string& spec, v1::Job* out);

}  // namespace stagecoach::testing
