// What a rank's stages hold between steps, measured: the bytes of the allocations behind their
// parameters and gradients, as the process's counting allocator counted them (not the tensors'
// sizes: a parameter that views a larger buffer counts the whole buffer, and a freed one counts
// nothing). With ZeroShards, its shards count as parameters and their gradients as gradients.
// Storages shared by several tensors count once. One that the counting allocator did not
// allocate (before its Install; device memory) counts its storage's size.
//
// Thread-safe as far as the tensors are not changed meanwhile: between steps, on the task's
// thread.
#pragma once

#include <cstdint>
#include <map>

#include "worker/model/stage_model.h"
#include "worker/runtime/sharding/zero_shards.h"

namespace stagecoach::runtime {

struct HeldMemory {
  int64_t parameter_bytes = 0;
  int64_t gradient_bytes = 0;
};

// `shards` may be null (no sharding).
HeldMemory MeasureHeldMemory(const std::map<int, model::StageModel*>& stages,
                             const ZeroShards* shards);

}  // namespace stagecoach::runtime
