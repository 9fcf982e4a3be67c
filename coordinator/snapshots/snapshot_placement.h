// Where an attempt that starts from an in-memory snapshot (snapshot_copies.h) runs its ranks,
// and which files move at its start (TaskAssignment.resume.snapshot): every file a rank restores
// must be held by one of the attempt's workers, so the workers holding the files are taken
// first: each rank back on the worker that ran it where that is free (the first of its files'
// holders), else on another holding its files; and the files then move from the rank whose
// worker holds them to the rank that restores them (nothing moves for a rank back on a worker
// that holds its own files). The snapshot's layout is the attempt's: stage s's file is in the
// copy of the rank that held stage s. Pure.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "stagecoach/v1/types.pb.h"

namespace stagecoach::coordinator {

struct SnapshotPlacement {
  // The worker of each rank, in rank order: an index into the `idle` list given.
  std::vector<int> workers;
  // Every rank's transfers, in rank order of the receiver (SnapshotRestore.transfers).
  std::vector<v1::SnapshotTransfer> transfers;
};

// `needs[r]`: the stages whose training-state files rank r restores (its own stages, and
// stage 0 as well for the last stage's tied copy of the embeddings); `idle`: the ids of the
// workers that may be taken, in the order to take them. nullopt when `idle` has fewer workers
// than ranks, or a file some rank needs is held by none of the workers taken.
std::optional<SnapshotPlacement> PlaceOnSnapshot(const v1::JobSnapshot& snapshot,
                                                 const std::vector<std::vector<int>>& needs,
                                                 const std::vector<std::string>& idle);

}  // namespace stagecoach::coordinator
