// The job-wide reduction of a few numbers per step over the ranks of one pipeline (a replica's
// ranks): each rank's gradient statistics (their squared norm, a non-finite flag per rank), so
// that every rank takes the same clipping and skipping decision (step_recipe.h).
//
// Over the pipeline's own transport, on the kJobReduction links of message_tags.h (rank r and
// r+1): rank 0 sends its values up the chain, each rank adds its own to what it received and
// passes the partial sums on, and rank P-1, holding the sum, sends it back down. The sum is made
// once, in rank order ((v0 + v1) + v2) + ..., so every rank gets the same bits. 2(P-1) messages
// of 8 bytes per value, one after another: latency, not bandwidth. Device-memory transports
// (NCCL) get the values in a tensor on the task's device.
//
// Not thread-safe: the task's thread, when the pipeline's executor has no transfer in flight
// (between steps). Every rank of the pipeline calls SumOverRanks the same number of times with
// the same number of values.
#pragma once

#include <torch/types.h>

#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/runtime/executor/progress_beacon.h"
#include "worker/transport/transport.h"

namespace stagecoach::runtime {

class JobReduction {
 public:
  // `transport` (the pipeline's, must outlive this); `device` is where a device-memory
  // transport takes its buffers; every wait is bounded by `timeout`.
  JobReduction(transport::Transport* transport, torch::Device device, absl::Duration timeout)
      : transport_(transport), device_(device), timeout_(timeout) {}

  // The element-wise sum of every rank's `values`. The transport's errors, with the peer and
  // what was being passed; DEADLINE_EXCEEDED after the timeout.
  absl::StatusOr<std::vector<double>> SumOverRanks(const std::vector<double>& values);

  // Marks each wait on a neighbour in `progress` ("JOB_REDUCTION" sends and receives, with the
  // peer and tag), so that a stall there names the rank it waits on. May be null.
  void set_progress(ProgressBeacon* progress) { progress_ = progress; }

 private:
  // Sends `t` to `peer` / receives into `t` from `peer` on the edge's tag, and waits.
  absl::Status SendTo(const torch::Tensor& t, int peer, int edge, int direction);
  absl::Status RecvFrom(torch::Tensor& t, int peer, int edge, int direction);

  transport::Transport* const transport_;
  const torch::Device device_;
  const absl::Duration timeout_;
  ProgressBeacon* progress_ = nullptr;
};

}  // namespace stagecoach::runtime
