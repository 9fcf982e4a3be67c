// The scheduler's time slice of a compute thread. Linux's EEVDF scheduler (6.6 and later) lets
// a running thread finish its slice before a thread that wakes up takes its CPU. A worker's
// compute thread runs at full load on a CPU that its communication threads (Gloo's event loop,
// the transport's control and completion threads) also wake on, once or more per message; each
// of those hops waited for the compute thread's slice to end (about 1.5 ms on 2 CPUs), and a
// message passes several. Since Linux 6.12 a thread can ask for a shorter slice
// (sched_attr.sched_runtime for SCHED_OTHER); with 0.1 ms the step of a latency-bound 1F1B job
// (bench/peer_bench.cc --model tiny) went from 10.9 to 7.7 ms, compute-bound jobs unchanged.
//
// RequestTimeSlice asks for `slice` on the calling thread, keeping its policy and nice value.
// Kernels before 6.12 ignore the request for SCHED_OTHER threads; the result says whether the
// kernel reports the slice afterwards. No LibTorch in this header.
#pragma once

#include <string>

#include "absl/time/time.h"

namespace stagecoach::runtime {

// The smallest slice Linux accepts (it clamps requests to [0.1 ms, 100 ms]).
constexpr absl::Duration kComputeTimeSlice = absl::Microseconds(100);

struct TimeSliceResult {
  bool applied = false;  // the kernel reports `slice` as the thread's slice
  std::string why;       // for the log: "time slice 100us" or why not
};

TimeSliceResult RequestTimeSlice(absl::Duration slice);

}  // namespace stagecoach::runtime
