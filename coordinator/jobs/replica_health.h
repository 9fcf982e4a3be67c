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
// Healing. A lost replica is healed on replacement workers (BeginHeal): once each of its ranks
// has set up and asked to join (JoinerReady), the next commit of a step g takes it back in: a
// new epoch whose membership has it healthy again from global step g + 1 (join_step), the
// lowest other healthy replica its donor. Every member of the new epoch's group takes part in
// the donor's state transfer before that step; the commit answer carries the new membership so
// that the healthy ranks regroup after applying step g.
//
// Pure: no clock, no lock (the job table's lock guards it, as the rest of Job). Not
// thread-safe.
#pragma once

#include <climits>
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

  // Healing: the replica being healed (-1: none), and how many heals were begun (the new
  // pipeline's rendezvous names it).
  int healing() const { return healing_; }
  int heals() const { return heals_; }
  // The lowest lost replica when the job carries on and heals none; -1 otherwise.
  int ReplicaToHeal() const;
  // Starts healing lost replica `replica`. Call only with ReplicaToHeal's.
  void BeginHeal(int replica);
  // Rank `rank` of the healing replica set up and asks to join; true once every rank has.
  bool JoinerReady(int rank);
  // The healing failed (a replacement could not start or was lost): the replica stays lost.
  void AbandonHeal();
  // With the current epoch's membership: the global step from which a healed replica runs with
  // the others, and the replica that sends it its state; -1 when the epoch took in none.
  int64_t join_step() const { return join_step_; }
  int donor() const { return donor_; }

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
  // step is committed and `committed` (if given) gets the step's losses by slice; a healing
  // replica whose ranks are all ready is taken back in then, unless the next step is not before
  // `rejoin_before` (the job holds or ends there, so no step would run with it).
  Answer Arrive(const Arrival& arrival, std::map<int, std::vector<double>>* committed = nullptr,
                int64_t rejoin_before = INT64_MAX);
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
  int healing_ = -1;
  int heals_ = 0;
  std::set<int> joiners_ready_;
  int64_t join_step_ = -1;
  int donor_ = -1;
  // The current epoch's arrivals without a failure, by step: the tasks (replica * ranks + rank)
  // that arrived, and the last stage's losses by slice.
  struct Round {
    std::set<int> tasks;
    std::map<int, std::vector<double>> losses;
  };
  std::map<int64_t, Round> rounds_;
};

}  // namespace stagecoach::coordinator
