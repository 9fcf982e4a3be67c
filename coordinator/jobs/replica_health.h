// The health of a job attempt's data-parallel replicas when they carry on
// (restart.carry_on, docs/recovery.md): which replicas were lost, the membership (its epoch,
// the healthy replicas in group order, the slices of the global batch each runs), and the
// settling of each step (CoordinatorService.SettleStep).
//
// Slices. A step's global batch is D x M microbatches: slice s is the M microbatches replica
// s runs when every replica is healthy. When replicas are lost their slices go, in order, to
// the healthy replicas in order (round robin); each healthy replica runs its own slice and the
// ones it was given, ascending. So the lowest healthy replica (the data-parallel group's rank 0)
// always runs slice 0 first, the global batch and its microbatch boundaries stay the same, and
// the losses go on equal to the whole job's.
//
// Settling. Between its gradient reduction and its optimizer step every rank of every healthy
// replica arrives with the step (the global step before it) and the epoch it ran with. The
// step is committed once every healthy rank arrived without a failure at the current epoch; a
// committed step stays committed whatever happens after (a rank told COMMIT applies it, so
// every rank must be). Losing a replica starts a new epoch: every arrival of a step not
// committed is answered RETRY, with the new membership, and the healthy ranks run it again.
// A rank that arrives with a failure waits for the new epoch (or for the job to stop).
//
// Pure: no clock, no lock (the job table's lock guards it, as the rest of Job). Not
// thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <vector>

namespace stagecoach::coordinator {

// Slices of a D-replica global batch each healthy replica runs, by replica (see the file
// comment). Empty when every replica is lost.
std::map<int, std::vector<int>> AssignSlices(int replicas, const std::set<int>& lost);

class ReplicaHealth {
 public:
  // A new attempt: `replicas` replicas of `ranks` ranks each, all healthy, epoch 0. Settling
  // is on (`carry_on`) or the job does not carry on (every other call but the accessors is
  // then never made).
  void Reset(int replicas, int ranks, bool carry_on);

  bool carry_on() const { return carry_on_; }
  int replicas() const { return replicas_; }
  int epoch() const { return epoch_; }
  const std::set<int>& lost() const { return lost_; }
  bool IsLost(int replica) const { return lost_.count(replica) > 0; }
  int healthy() const { return replicas_ - static_cast<int>(lost_.size()); }
  bool degraded() const { return !lost_.empty(); }
  // Healthy replicas, ascending (the data-parallel group's order).
  std::vector<int> HealthyReplicas() const;
  // Slices replica `replica` runs now (empty for a lost one).
  std::vector<int> SlicesOf(int replica) const;
  // The latest committed step (the global step before it; -1: none yet). Steps commit in
  // order.
  int64_t last_committed() const { return last_committed_; }

  // Whether `replica` can be left out and the others carry on: it is healthy and not the last
  // healthy one.
  bool CanLose(int replica) const;
  // Leaves `replica` out: a new epoch, the arrivals of steps not committed forgotten. Call only
  // when CanLose.
  void Lose(int replica);

  // One rank's SettleStep.
  struct Arrival {
    int replica = 0;
    int rank = 0;
    int epoch = 0;
    int64_t global_step = 0;
    bool failed = false;
    // The last stage's microbatch losses of the slices it ran, slice by slice (M each);
    // empty from the other ranks.
    std::vector<double> losses;
    std::vector<int> slices;
  };
  enum class Answer { kPending, kCommit, kRetry };
  // Records `arrival` and answers it (Answer below). When it completes its step's round, the
  // step is committed and `committed` (if given) gets the step's losses by slice.
  Answer Arrive(const Arrival& arrival, std::map<int, std::vector<double>>* committed = nullptr);
  // The answer to an arrival already recorded: kCommit once its step is committed (at any
  // epoch), kRetry once the epoch moved past the arrival's, kPending otherwise.
  Answer AnswerFor(int epoch, int64_t global_step) const;

 private:
  bool carry_on_ = false;
  int replicas_ = 1;
  int ranks_ = 1;
  int epoch_ = 0;
  std::set<int> lost_;
  int64_t last_committed_ = -1;
  // The current epoch's arrivals without a failure, by step: the tasks (replica * ranks + rank)
  // that arrived, and the last stage's losses by slice.
  struct Round {
    std::set<int> tasks;
    std::map<int, std::vector<double>> losses;
  };
  std::map<int64_t, Round> rounds_;
};

}  // namespace stagecoach::coordinator
