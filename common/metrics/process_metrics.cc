#include "common/metrics/process_metrics.h"

#include <malloc.h>
#include <unistd.h>

#include <fstream>

namespace stagecoach::metrics {

ProcessMetrics::ProcessMetrics(prometheus::Registry& registry)
    : resident_(&prometheus::BuildGauge()
                     .Name("stagecoach_process_resident_memory_bytes")
                     .Help("Resident memory of this process (VmRSS), in bytes")
                     .Register(registry)
                     .Add({})),
      heap_in_use_(&prometheus::BuildGauge()
                        .Name("stagecoach_process_heap_in_use_bytes")
                        .Help("Bytes malloc has handed out and not had back (glibc mallinfo2)")
                        .Register(registry)
                        .Add({})) {
  Refresh();
}

void ProcessMetrics::Refresh() {
  // statm: size resident shared text lib data dt, in pages.
  std::ifstream statm("/proc/self/statm");
  long size = 0;
  long resident = 0;
  if (statm >> size >> resident) {
    resident_->Set(static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE)));
  }
  const struct mallinfo2 info = mallinfo2();
  heap_in_use_->Set(static_cast<double>(info.uordblks + info.hblkhd));
}

}  // namespace stagecoach::metrics
