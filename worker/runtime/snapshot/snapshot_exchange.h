// How snapshot files cross the data plane between two ranks' workers: when a snapshot is taken
// (each rank sends its files to the rank that keeps a copy, snapshot_steps.h) and when an attempt
// starts from one (each rank receives the files it restores, snapshot_restore.h).
//
// One bundle per (sender, receiver) pair: an 8-byte header length, the header (a SnapshotCopy:
// the owner rank and the files' entries with sizes and SHA-256), then each file's bytes, all on
// one tag of a host-memory transport. The receiver checks every file's size and SHA-256 against
// the header, so a bundle is either whole or an error naming the file.
//
// Sends and receives of one exchange are posted together from one thread (the transport's
// rule) and waited for with `timeout` each. A failed exchange aborts `transport` (transfers of
// it may still be posted; the peers then fail promptly too): it is used for nothing after.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "stagecoach/v1/types.pb.h"
#include "worker/runtime/snapshot/snapshot_store.h"
#include "worker/transport/transport.h"

namespace stagecoach::runtime {

// A snapshot file with its bytes.
struct SnapshotFile {
  int rank = 0;  // whose stages it holds, in the attempt that took it
  v1::StageCheckpointFile entry;
  SnapshotStore::Bytes bytes;
};

// The tag of snapshot bundles (a transport of their own: no other messages share it).
inline constexpr uint64_t kSnapshotTag = 0x5350;  // "SP"

// Sends `outgoing[q]` to each rank q and receives one bundle from each rank in `incoming`, over
// `transport`. Returns what was received, by sender. Empty bundles are sent too (a header
// with no files), so that both sides agree on the exchange. DEADLINE_EXCEEDED or the
// transport's error naming the peer; DATA_LOSS naming the file whose bytes do not match their
// entry; INVALID_ARGUMENT for a header that does not parse.
absl::StatusOr<std::map<int, std::vector<SnapshotFile>>> ExchangeSnapshotFiles(
    transport::Transport& transport, const std::map<int, std::vector<SnapshotFile>>& outgoing,
    const std::vector<int>& incoming, absl::Duration timeout);

}  // namespace stagecoach::runtime
