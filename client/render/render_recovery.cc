#include "client/render/render_recovery.h"

#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/util/byte_size.h"

namespace stagecoach::client {

std::string RecoveryLines(const v1::Job& j) {
  std::ostringstream out;
  if (j.replicas() > 1 && j.lost_replicas_size() > 0) {
    out << "Replicas:  " << j.healthy_replicas() << "/" << j.replicas()
        << " healthy (degraded: replica(s) " << absl::StrJoin(j.lost_replicas(), ", ")
        << " left; the healthy ones run their microbatches"
        << (j.healing_replica() >= 0
                ? absl::StrCat("; healing replica ", j.healing_replica(), " on new workers")
                : "")
        << ")\n";
  }
  if (j.has_snapshot() && j.snapshot().ranks_size() > 0) {
    std::vector<std::string> held;
    for (const v1::SnapshotCopy& copy : j.snapshot().ranks()) {
      held.push_back(
          absl::StrCat("rank ", copy.rank(), " on ", absl::StrJoin(copy.worker_ids(), ", ")));
    }
    out << "Snapshot:  in memory after step " << j.snapshot().step() << " ("
        << util::FormatBytes(static_cast<double>(j.snapshot().bytes())) << "; "
        << absl::StrJoin(held, "; ") << ")\n";
  }
  if (j.spare_workers_size() > 0) {
    out << "Spares:    " << absl::StrJoin(j.spare_workers(), ", ") << " (held idle for this job)\n";
  }
  return out.str();
}

}  // namespace stagecoach::client
