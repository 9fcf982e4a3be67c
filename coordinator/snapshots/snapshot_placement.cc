#include "coordinator/snapshots/snapshot_placement.h"

#include <algorithm>
#include <map>

namespace stagecoach::coordinator {
namespace {

// Stage -> the copy holding its training-state file, and that file.
struct StageFile {
  const v1::SnapshotCopy* copy = nullptr;
  const v1::StageCheckpointFile* file = nullptr;
};

bool Holds(const v1::SnapshotCopy& copy, const std::string& worker) {
  return std::find(copy.worker_ids().begin(), copy.worker_ids().end(), worker) !=
         copy.worker_ids().end();
}

}  // namespace

std::optional<SnapshotPlacement> PlaceOnSnapshot(const v1::JobSnapshot& snapshot,
                                                 const std::vector<std::vector<int>>& needs,
                                                 const std::vector<std::string>& idle) {
  const int ranks = static_cast<int>(needs.size());
  if (static_cast<int>(idle.size()) < ranks) return std::nullopt;
  std::map<int, StageFile> by_stage;
  for (const v1::SnapshotCopy& copy : snapshot.ranks()) {
    for (const v1::StageCheckpointFile& f : copy.files()) by_stage[f.stage()] = {&copy, &f};
  }
  for (const std::vector<int>& stages : needs) {
    for (int s : stages) {
      if (by_stage.count(s) == 0) return std::nullopt;
    }
  }
  SnapshotPlacement placement;
  placement.workers.assign(ranks, -1);
  std::vector<bool> taken(idle.size(), false);
  // 1. Each rank back on the worker that ran it (listed first among its files' holders), then
  // the others on a free worker holding their files.
  for (const bool only_first : {true, false}) {
    for (int r = 0; r < ranks; ++r) {
      if (needs[r].empty() || placement.workers[r] >= 0) continue;
      const v1::SnapshotCopy& own = *by_stage.at(needs[r].front()).copy;
      for (int h = 0; h < (only_first ? std::min(1, own.worker_ids_size()) : own.worker_ids_size());
           ++h) {
        auto it = std::find(idle.begin(), idle.end(), own.worker_ids(h));
        if (it == idle.end() || taken[it - idle.begin()]) continue;
        placement.workers[r] = static_cast<int>(it - idle.begin());
        taken[it - idle.begin()] = true;
        break;
      }
    }
  }
  // 2. The others on the first free workers.
  size_t next = 0;
  for (int r = 0; r < ranks; ++r) {
    if (placement.workers[r] >= 0) continue;
    while (taken[next]) ++next;
    placement.workers[r] = static_cast<int>(next);
    taken[next] = true;
  }
  // 3. Every needed file from a rank whose worker holds it, the receiver itself first.
  for (int r = 0; r < ranks; ++r) {
    for (int s : needs[r]) {
      const StageFile& held = by_stage.at(s);
      int from = Holds(*held.copy, idle[placement.workers[r]]) ? r : -1;
      for (int q = 0; q < ranks && from < 0; ++q) {
        if (Holds(*held.copy, idle[placement.workers[q]])) from = q;
      }
      if (from < 0) return std::nullopt;
      v1::SnapshotTransfer& t = placement.transfers.emplace_back();
      *t.mutable_file() = *held.file;
      t.set_from_rank(from);
      t.set_to_rank(r);
    }
  }
  return placement;
}

}  // namespace stagecoach::coordinator
