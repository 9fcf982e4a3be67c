// The daemon's own memory as Prometheus gauges, read afresh at every scrape (MetricsServer calls
// Refresh before it serializes):
//   stagecoach_process_resident_memory_bytes  resident set (VmRSS), what the kernel charges
//   stagecoach_process_heap_in_use_bytes      bytes malloc has handed out and not had back
//                                             (glibc mallinfo2: arenas and mmap'd chunks)
// Resident memory includes freed memory malloc keeps and fragmentation, so it moves in steps;
// heap in use moves with what the process actually holds, byte for byte, which is what shows a
// leak (a coordinator that keeps every finished job) apart from allocator noise.
//
// Thread-safe: Refresh may run on any thread (it only reads the process's counters and sets
// gauges). Where /proc/self/statm cannot be read, the resident gauge keeps its last value.
#pragma once

#include "prometheus/gauge.h"
#include "prometheus/registry.h"

namespace stagecoach::metrics {

class ProcessMetrics {
 public:
  // Registers both gauges on `registry`, which must outlive this object.
  explicit ProcessMetrics(prometheus::Registry& registry);

  void Refresh();

 private:
  prometheus::Gauge* resident_;
  prometheus::Gauge* heap_in_use_;
};

}  // namespace stagecoach::metrics
