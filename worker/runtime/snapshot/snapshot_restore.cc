#include "worker/runtime/snapshot/snapshot_restore.h"

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"
#include "worker/runtime/snapshot/snapshot_exchange.h"

namespace stagecoach::runtime {

absl::StatusOr<StateFiles> ExchangeSnapshotForRestore(const v1::TaskAssignment& task,
                                                      SnapshotStore& store,
                                                      transport::Transport* transport,
                                                      absl::Duration timeout) {
  const v1::ResumeTask& resume = task.resume();
  const int me = task.rank();
  const int64_t step = resume.step();
  auto held = [&](const v1::SnapshotTransfer& t) -> absl::StatusOr<SnapshotFile> {
    absl::StatusOr<SnapshotStore::Bytes> bytes = store.Get(task.job_id(), step, t.file().file());
    if (!bytes.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("rank ", me, " restoring the in-memory snapshot after step ", step, ": ",
                       bytes.status().message()));
    }
    return SnapshotFile{t.to_rank(), t.file(), *std::move(bytes)};
  };
  std::map<std::string, StateFiles::Bytes> files;
  std::map<int, std::vector<SnapshotFile>> outgoing;
  std::set<int> incoming;
  std::set<std::string> expected;
  for (const v1::SnapshotTransfer& t : resume.snapshot().transfers()) {
    for (int r : {t.from_rank(), t.to_rank()}) {
      if (r < 0 || r >= task.world_size()) {
        return absl::InvalidArgumentError(absl::StrCat("resume.snapshot: a transfer of ",
                                                       t.file().file(), " names rank ", r, " of ",
                                                       task.world_size()));
      }
    }
    if (t.from_rank() == me && t.to_rank() == me) {
      ASSIGN_OR_RETURN(SnapshotFile local, held(t));
      files[t.file().file()] = local.bytes;
    } else if (t.from_rank() == me) {
      ASSIGN_OR_RETURN(outgoing[t.to_rank()].emplace_back(), held(t));
    } else if (t.to_rank() == me) {
      incoming.insert(t.from_rank());
      expected.insert(t.file().file());
    }
  }
  if (!outgoing.empty() || !incoming.empty()) {
    if (transport == nullptr) {
      return absl::FailedPreconditionError(
          "resume.snapshot: files move between ranks but the task has no snapshot transport");
    }
    ASSIGN_OR_RETURN(
        auto received,
        ExchangeSnapshotFiles(*transport, outgoing,
                              std::vector<int>(incoming.begin(), incoming.end()), timeout));
    for (auto& [q, bundle] : received) {
      for (SnapshotFile& f : bundle) files[f.entry.file()] = std::move(f.bytes);
    }
    for (const std::string& name : expected) {
      if (files.count(name) == 0) {
        return absl::NotFoundError(absl::StrCat("rank ", me, ": ", name,
                                                " of the in-memory snapshot after step ", step,
                                                " did not arrive"));
      }
    }
  }
  // Its own stages' files: this worker holds them from now on (a later loss may need them). Not
  // a snapshot of another layout (restored by name): its stages are not this attempt's.
  if (!resume.by_name()) {
    for (const v1::StageAssignment& stage : task.stages()) {
      for (const v1::SnapshotTransfer& t : resume.snapshot().transfers()) {
        if (t.to_rank() != me || t.file().stage() != stage.stage()) continue;
        auto it = files.find(t.file().file());
        if (it != files.end()) store.Put(task.job_id(), step, me, t.file(), it->second);
      }
    }
  }
  return StateFiles(absl::StrCat("the in-memory snapshot after step ", step), std::move(files));
}

}  // namespace stagecoach::runtime
