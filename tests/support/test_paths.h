// Paths the build passes to tests.
#pragma once

#include <string>

namespace stagecoach::testing {

// tests/data in the source tree.
inline std::string TestDataDir() { return STAGECOACH_TEST_DATA_DIR; }

// Golden schedules captured from torch.distributed.pipelining.
inline std::string GoldenDir() { return TestDataDir() + "/pytorch-schedules"; }

// The top of the build tree (binaries live in its subfolders).
inline std::string BinaryDir() { return STAGECOACH_BINARY_DIR; }

// configs/ in the source tree: the example job specs.
inline std::string ConfigsDir() { return STAGECOACH_CONFIGS_DIR; }

}  // namespace stagecoach::testing
