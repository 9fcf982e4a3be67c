// In-memory snapshots taken at step boundaries (training.snapshot.every_steps,
// docs/recovery.md). After a counted step whose new global step count is a multiple of
// every_steps, the rank copies its stages' training state (checkpoint.h's StateSnapshot: the
// same copy an asynchronous checkpoint takes) and trains on, while a background thread
//   1. pickles each stage into a training-state file's bytes (the checkpoint layout) and keeps
//      them in its worker's snapshot store (snapshot_store.h);
//   2. sends them to its holder rank's worker and receives the files of the ranks it holds a
//      copy for (snapshot_exchange.h), keeping those too;
//   3. reports what its worker now holds (CoordinatorService.ReportSnapshot), which is what
//      lets the coordinator mark the snapshot complete.
// So a lost worker's state is in another worker's memory, and a restart continues from the
// latest complete snapshot (snapshot_restore.h) instead of the latest checkpoint on disk.
//
// At most one snapshot is in flight: a snapshot step first waits for the previous one (every
// rank takes the same steps, so the exchanges pair up). A failed exchange (a peer lost) fails
// the task at its next snapshot step or its end, like a failed checkpoint write. A task that
// ends without draining abandons its exchange (the transport is aborted with the task).
//
// Not thread-safe: the task's thread only, between steps. The stages, optimizer, store and
// transport must outlive it.
#pragma once

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "stagecoach/v1/coordinator.pb.h"
#include "worker/model/stage_model.h"
#include "worker/runtime/checkpoint/background_writer.h"
#include "worker/runtime/snapshot/snapshot_exchange.h"
#include "worker/runtime/snapshot/snapshot_store.h"
#include "worker/transport/transport.h"

namespace stagecoach::runtime {

struct SnapshotStepsOptions {
  std::string worker_id;
  std::string job_id;
  int attempt = 0;
  int rank = 0;
  int64_t every_steps = 0;
  // The rank whose worker keeps a copy of this rank's files (-1: none), and the ranks whose
  // files this rank's worker keeps (TaskAssignment.snapshot_holders).
  int holder = -1;
  std::vector<int> holds_for;
  // Bounds each wait of the exchange, and a snapshot step's wait for the previous one.
  absl::Duration timeout = absl::Minutes(5);
  // By stage: a parameter its files leave out (the last stage's copy of tied embeddings).
  std::map<int, std::string> omitted;
};

// The holders' inverse: the ranks whose holder is `rank`.
std::vector<int> SnapshotSenders(const std::vector<int>& holders, int rank);

// The options of `task`'s snapshots (every_steps from its spec's training.snapshot; holder and
// holds_for from TaskAssignment.snapshot_holders; the timeout from its comm_timeout, at least
// five minutes: a snapshot moves a whole rank's state).
SnapshotStepsOptions SnapshotOptionsOf(const v1::TaskAssignment& task, const std::string& worker_id,
                                       int64_t every_steps);

class SnapshotSteps {
 public:
  // `transport` spans the attempt's ranks (null with a single rank: no copy leaves the worker).
  SnapshotSteps(SnapshotStepsOptions options, const std::map<int, model::StageModel*>& stages,
                const torch::optim::Optimizer* optimizer, SnapshotStore* store,
                transport::Transport* transport, SnapshotReporter report);

  // After a counted step that brought the timeline to `global_steps` steps: takes the snapshot
  // when due (see the file comment). The previous snapshot's error, if any.
  absl::Status AfterStep(int64_t global_steps);

  // Waits for the snapshot in flight; its error, if any. Call before the task ends.
  absl::Status Drain();

  // Tells the coordinator what this worker holds of the snapshot after `global_steps` steps
  // (ReportSnapshot; a failure is logged): after each exchange, and after a restore from one
  // (its own stages' files, so that the lost worker's copies are replaced). Ranks reported.
  int ReportHeld(int64_t global_steps) const;

 private:
  // The background part of a snapshot after `global_steps` steps of `copies`.
  absl::Status Exchange(int64_t global_steps, const std::vector<StateSnapshot>& copies);

  const SnapshotStepsOptions options_;
  const std::map<int, model::StageModel*>& stages_;
  const torch::optim::Optimizer* optimizer_;
  SnapshotStore* store_;
  transport::Transport* transport_;
  SnapshotReporter report_;
  BackgroundWriter background_;
};

}  // namespace stagecoach::runtime
