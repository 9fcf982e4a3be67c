// Keeps freed heap memory in the process, so that the multi-MiB activation and gradient buffers
// a pipeline step allocates and frees do not page-fault on every step: no mmap below 32 MiB
// (glibc's largest threshold), no trimming below 1 GiB, and one malloc arena (a thread's own
// arena still grows and shrinks its heaps). bench/pipeline_bench measured 1,600-3,600 minor
// faults per rank per step (about 8 ms of a 170 ms step) with glibc's defaults, none with this.
// Call at the start of main, before other threads exist: the arena limit binds only threads
// that get an arena afterwards.
#pragma once

namespace stagecoach {

void TuneMallocForTensors();

// Caps glibc's malloc arenas at `arenas`. A long-lived service whose many threads (gRPC's, a work
// queue's) allocate and free small objects otherwise spreads them over up to 8 arenas per core,
// each keeping its own fragmented high-water mark: the coordinator's resident memory grew by
// ~8 MiB over 1,200 jobs with glibc's default and by 0.1-0.2 MiB with one arena (tests/e2e/
// job_retention_test prints it; it asserts on heap in use, which allocator noise does not move).
// Call at the start of main, before other threads exist.
void LimitMallocArenas(int arenas);

// Maps every allocation of `bytes` or more on its own and unmaps it when freed. glibc's default
// threshold (128 KiB) rises to the size of each mapped block freed, up to 32 MiB, after which
// blocks of that size come from the heap and stay there: the coordinator serialises a job's
// record (1.7 MB at 100,000 steps) at every state change and checkpoint, and bench/soak_bench
// saw its resident memory climb with those buffers. Setting the threshold fixes it. Call at the
// start of main.
void MapLargeAllocations(int bytes);

}  // namespace stagecoach
