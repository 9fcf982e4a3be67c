// Where LibTorch's C++ API differs between the versions Stagecoach builds against: Debian 12's
// 1.13 (the development machines), the CUDA image's 2.5 and Debian 13's 2.6
// (scripts/test_trixie.sh builds and tests against it). Code that must differ tests
// STAGECOACH_TORCH_AT_LEAST at the API's own boundary, named where it is used.
#pragma once

#include <torch/version.h>

#define STAGECOACH_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||             \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

// c10::Allocator::allocate is const up to 2.2 and not const from 2.3 on.
#if STAGECOACH_TORCH_AT_LEAST(2, 3)
#define STAGECOACH_ALLOCATE_CONST
#else
#define STAGECOACH_ALLOCATE_CONST const
#endif
