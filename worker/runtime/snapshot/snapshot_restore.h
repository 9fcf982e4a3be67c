// An attempt that starts from an in-memory snapshot (ResumeTask.snapshot, docs/recovery.md):
// before its stages are restored, every rank sends, from its worker's snapshot store, the files
// the transfers say other ranks restore from its copy, and receives those it restores itself
// (snapshot_exchange.h, over the attempt's snapshot transport). The files then stay in memory:
// the stages are restored from them as from a checkpoint directory (checkpoint.h's StateFiles),
// with the same checks (sizes, SHA-256, names, shapes). The files of the rank's own stages go
// into its worker's store too, so that the snapshot is on two workers again.
#pragma once

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "stagecoach/v1/types.pb.h"
#include "worker/runtime/checkpoint/state_file.h"
#include "worker/runtime/snapshot/snapshot_store.h"
#include "worker/transport/transport.h"

namespace stagecoach::runtime {

// The files rank `task.rank()` restores from `task.resume()`'s snapshot, after the exchange
// with the other ranks (`transport`: the attempt's snapshot transport, null with a single
// rank). FAILED_PRECONDITION naming the file when this worker does not hold one it is to send
// or read; INVALID_ARGUMENT for a transfer naming a rank outside the attempt; the exchange's
// errors; NOT_FOUND naming a file that did not arrive.
absl::StatusOr<StateFiles> ExchangeSnapshotForRestore(const v1::TaskAssignment& task,
                                                      SnapshotStore& store,
                                                      transport::Transport* transport,
                                                      absl::Duration timeout);

}  // namespace stagecoach::runtime
