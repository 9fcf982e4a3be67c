#include "common/process/malloc_tuning.h"

#include <malloc.h>

namespace stagecoach {

void TuneMallocForTensors() {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  LimitMallocArenas(1);
}

void LimitMallocArenas(int arenas) { mallopt(M_ARENA_MAX, arenas); }

void MapLargeAllocations(int bytes) { mallopt(M_MMAP_THRESHOLD, bytes); }

}  // namespace stagecoach
