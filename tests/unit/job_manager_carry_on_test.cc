// Replicas that carry on without a lost one, through the JobManager with fake workers: every
// step is settled (SettleStep) by every rank of the healthy replicas; a lost worker's replica
// leaves the job, which stays RUNNING, and the step in flight is retried by the others with the
// lost replica's slices; a committed step's loss is on record even when the lost replica's last
// stage never reported it.
#include <thread>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/coordinator_test_fakes.h"

namespace stagecoach::coordinator::carry_on_test {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string Spec(const std::string& restart = "") {
  return absl::StrCat("name: t\nmodel: {builtin: {family: mlp, sizes: [4, 8, 8, 8, 2]}}\n",
                      "split: {stages: 2}\nschedule: {kind: 1F1B, microbatches: 2}\n",
                      "placement: {workers: 2, replicas: 2}\ntraining: {batch_size: 8, steps: 4}\n",
                      restart);
}

class CarryOnTest : public JobManagerFixture {
 protected:
  // Registers 4 workers and starts a 2-replica x 2-rank job; worker i runs task i (replica
  // i / 2, rank i % 2).
  std::string StartJob(const std::string& spec = Spec()) {
    for (int i = 1; i <= 4; ++i) workers_ids_.push_back(Register(i));
    auto id = manager_->SubmitJob(spec, "spec.yaml");
    EXPECT_TRUE(id.ok()) << id.status();
    EXPECT_TRUE(Eventually([&] { return State(*id) == v1::JOB_STATE_RUNNING; }));
    return *id;
  }

  // Task `task`'s worker, job, attempt 1, rank and replica, and the step, into `r`.
  template <typename Message>
  void Identify(const std::string& job, int task, int64_t step, Message* r) {
    r->set_worker_id(workers_ids_[task]);
    r->set_job_id(job);
    r->set_attempt(1);
    r->set_rank(task % 2);
    r->set_replica(task / 2);
    r->set_step(step);
  }

  v1::SettleStepRequest Request(const std::string& job, int task, int64_t step, int epoch,
                                bool failed = false, std::vector<double> losses = {},
                                std::vector<int> slices = {}) {
    v1::SettleStepRequest r;
    Identify(job, task, step, &r);
    r.set_global_step(step);
    r.set_epoch(epoch);
    r.set_failed(failed);
    if (failed) r.set_error("gradient reduction of stage 1: connection reset by peer");
    for (double l : losses) r.add_microbatch_losses(l);
    for (int s : slices) r.add_slices(s);
    r.mutable_wait()->set_seconds(20);
    return r;
  }

  // Settles the requests on threads of their own; returns their answers in order.
  std::vector<v1::SettleStepResponse> SettleAll(const std::vector<v1::SettleStepRequest>& reqs,
                                                const std::function<void()>& meanwhile = nullptr) {
    std::vector<v1::SettleStepResponse> out(reqs.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < reqs.size(); ++i) {
      threads.emplace_back([&, i] {
        auto answer = manager_->SettleStep(reqs[i]);
        EXPECT_TRUE(answer.ok()) << answer.status();
        if (answer.ok()) out[i] = *answer;
      });
    }
    if (meanwhile) meanwhile();
    for (std::thread& t : threads) t.join();
    return out;
  }

  absl::Status Report(const std::string& job, int task, int64_t step,
                      std::vector<double> losses = {}, std::vector<int> slices = {}) {
    v1::ReportStepRequest r;
    Identify(job, task, step, &r);
    for (double l : losses) r.add_microbatch_losses(l);
    for (int s : slices) r.add_slices(s);
    return manager_->ReportStep(r);
  }

  // The job's events of one kind (e.g. &v1::JobEvent::has_replica_lost).
  std::vector<v1::JobEvent> EventsOf(const std::string& job, bool (v1::JobEvent::*has)() const) {
    auto events = manager_->WaitForEvents(job, 0, absl::ZeroDuration());
    EXPECT_TRUE(events.ok()) << events.status();
    std::vector<v1::JobEvent> out;
    if (!events.ok()) return out;
    for (const v1::JobEvent& e : events->events) {
      if ((e.*has)()) out.push_back(e);
    }
    return out;
  }

  std::vector<std::string> workers_ids_;
};

TEST_F(CarryOnTest, TasksSettleTheirStepsAndAStepCommitsWhenEveryRankArrived) {
  const std::string id = StartJob();
  EXPECT_TRUE(workers_.Started(Address(1)).at(0).settle_steps());
  std::vector<v1::SettleStepRequest> reqs;
  for (int task = 0; task < 4; ++task) {
    reqs.push_back(Request(id, task, 0, 0, false,
                           task % 2 == 1 ? std::vector<double>{1, 2} : std::vector<double>{},
                           {task / 2}));
  }
  for (const v1::SettleStepResponse& r : SettleAll(reqs)) {
    EXPECT_EQ(r.decision(), v1::SettleStepResponse::COMMIT) << r.DebugString();
  }
  // A rank that asks with nobody else arriving is told to ask again once its wait runs out.
  v1::SettleStepRequest lone = Request(id, 0, 1, 0);
  lone.mutable_wait()->set_seconds(0);
  lone.mutable_wait()->set_nanos(50'000'000);
  auto waited = manager_->SettleStep(lone);
  ASSERT_TRUE(waited.ok());
  EXPECT_EQ(waited->decision(), v1::SettleStepResponse::WAIT);
}

TEST_F(CarryOnTest, ALostWorkerOfAReplicaLeavesItOutAndTheOthersRetryTheStepWithItsSlices) {
  const std::string id = StartJob();
  // Step 0 commits everywhere; replica 1's last stage (task 3) then dies before reporting it.
  std::vector<v1::SettleStepRequest> reqs;
  for (int task = 0; task < 4; ++task) {
    reqs.push_back(Request(
        id, task, 0, 0, false,
        task % 2 == 1 ? std::vector<double>{task * 1.0, task * 1.0 + 1} : std::vector<double>{},
        {task / 2}));
  }
  SettleAll(reqs);
  for (int task : {0, 1, 2}) {
    ASSERT_TRUE(Report(id, task, 0, task == 1 ? std::vector<double>{1, 2} : std::vector<double>{},
                       {task / 2})
                    .ok());
  }
  EXPECT_EQ(Job(id).steps_done(), 0) << "task 3 has not reported step 0";
  workers_.SetUnreachable(Address(4));
  // Step 1: replica 0's ranks reduced; replica 1's rank 0 fails in the group.
  const std::vector<v1::SettleStepResponse> answers =
      SettleAll({Request(id, 0, 1, 0), Request(id, 1, 1, 0, false, {9, 9}, {0}),
                 Request(id, 2, 1, 0, /*failed=*/true)},
                [&] {
                  // The failure's investigation (on the executor) finds worker 4 lost.
                  ASSERT_TRUE(Eventually([&] { return Job(id).lost_replicas_size() == 1; }));
                });
  EXPECT_EQ(answers[0].decision(), v1::SettleStepResponse::RETRY);
  EXPECT_EQ(answers[0].epoch(), 1);
  EXPECT_THAT(answers[0].healthy_replicas(), ElementsAre(0));
  EXPECT_THAT(answers[0].slices(), ElementsAre(0, 1));
  EXPECT_EQ(answers[1].decision(), v1::SettleStepResponse::RETRY);
  EXPECT_EQ(answers[2].decision(), v1::SettleStepResponse::STOP);
  EXPECT_THAT(answers[2].reason(), HasSubstr("replica 1 has left"));

  v1::Job job = Job(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(job.healthy_replicas(), 1);
  EXPECT_THAT(job.lost_replicas(), ElementsAre(1));
  EXPECT_EQ(job.restarts(), 0);
  EXPECT_THAT(job.failure().error(), HasSubstr("lost"));
  EXPECT_EQ(job.failure().replica(), 1);
  EXPECT_TRUE(job.ranks(2).replica_lost());
  EXPECT_FALSE(job.ranks(0).replica_lost());
  // Step 0's loss came with its settling: every slice's, though task 3 never reported it.
  EXPECT_EQ(job.steps_done(), 1);
  EXPECT_THAT(job.losses(), ElementsAre(2.5));  // mean of 1, 2, 3, 4
  // Replica 1's live worker was stopped and released.
  EXPECT_FALSE(workers_.Stopped(Address(3)).empty());
  const std::vector<v1::JobEvent> lost = EventsOf(id, &v1::JobEvent::has_replica_lost);
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].replica_lost().replica(), 1);
  EXPECT_EQ(lost[0].replica_lost().healthy_replicas(), 1);
  EXPECT_EQ(lost[0].replica_lost().retried_global_step(), 1);

  // The retried step commits on replica 0 alone; its report brings both slices' losses.
  for (const v1::SettleStepResponse& r :
       SettleAll({Request(id, 0, 1, 1), Request(id, 1, 1, 1, false, {5, 6, 7, 8}, {0, 1})})) {
    EXPECT_EQ(r.decision(), v1::SettleStepResponse::COMMIT);
  }
  ASSERT_TRUE(Report(id, 0, 1, {}, {0, 1}).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(Report(id, 1, 1, {5, 6}, {0, 1})))
      << "the last stage reports microbatches x slices losses";
  ASSERT_TRUE(Report(id, 1, 1, {5, 6, 7, 8}, {0, 1}).ok());
  job = Job(id);
  EXPECT_EQ(job.steps_done(), 2);
  EXPECT_THAT(job.losses(), ElementsAre(2.5, 6.5));
  // A client batch step would need every replica.
  v1::StepJobRequest client;
  client.set_job_id(id);
  EXPECT_THAT(std::string(manager_->StepJob(client, absl::Seconds(1)).status().message()),
              HasSubstr("needs every replica"));
}

TEST_F(CarryOnTest, FreeWorkersHealALostReplicaWhichRejoinsAfterTheNextCommittedStep) {
  const std::string id = StartJob();
  // Replica 1 is lost while step 0 is in flight (worker 4's lease runs out).
  workers_.SetUnreachable(Address(4));
  clock_.Advance(absl::Seconds(6));
  for (int i : {0, 1, 2}) ASSERT_TRUE(Beat(workers_ids_[i]).ok());
  manager_->Tick();
  ASSERT_EQ(Job(id).lost_replicas_size(), 1);
  // Worker 3 (replica 1's other rank) was stopped and released; one new worker makes two free:
  // the replica is healed on them.
  ASSERT_TRUE(Eventually([&] { return !workers_.Stopped(Address(3)).empty(); }));
  Register(5);
  ASSERT_TRUE(Eventually([&] { return Job(id).healing_replica() == 1; }));
  std::map<int, v1::TaskAssignment> joiners;  // by rank
  for (int n : {3, 5}) {
    for (const v1::TaskAssignment& t : workers_.Started(Address(n))) {
      if (t.has_join()) joiners[t.rank()] = t;
    }
  }
  ASSERT_EQ(joiners.size(), 2u);
  EXPECT_EQ(joiners[0].replica(), 1);
  EXPECT_EQ(joiners[0].join().healing(), 1);
  v1::Job healing = Job(id);
  EXPECT_EQ(healing.state(), v1::JOB_STATE_RUNNING);
  EXPECT_TRUE(healing.ranks(2).replica_lost()) << "not back until it joins";
  auto joining = [&](int rank) {
    v1::SettleStepRequest r = Request(id, 2 + rank, 0, 0);
    r.set_worker_id(healing.ranks(2 + rank).worker_id());
    r.set_joining(true);
    return r;
  };
  // Both replacements have set up and asked to join (an answer within a millisecond is WAIT:
  // the rejoin needs a committed step).
  for (int rank : {0, 1}) {
    v1::SettleStepRequest quick = joining(rank);
    quick.mutable_wait()->set_seconds(0);
    quick.mutable_wait()->set_nanos(1'000'000);
    auto waited = manager_->SettleStep(quick);
    ASSERT_TRUE(waited.ok()) << waited.status();
    EXPECT_EQ(waited->decision(), v1::SettleStepResponse::WAIT);
  }
  // They ask again while replica 0 settles step 0 (retried at epoch 1 with both slices): it
  // commits, and replica 1 joins from step 1 with replica 0's state.
  const std::vector<v1::SettleStepResponse> answers =
      SettleAll({joining(0), joining(1), Request(id, 0, 0, 1),
                 Request(id, 1, 0, 1, false, {1, 2, 3, 4}, {0, 1})});
  for (int i : {0, 1}) {
    EXPECT_EQ(answers[i].decision(), v1::SettleStepResponse::JOIN) << answers[i].DebugString();
    EXPECT_EQ(answers[i].join_global_step(), 1);
    EXPECT_EQ(answers[i].donor_replica(), 0);
    EXPECT_THAT(answers[i].healthy_replicas(), ElementsAre(0, 1));
    EXPECT_THAT(answers[i].slices(), ElementsAre(1));
    EXPECT_EQ(answers[i].step_limit(), 4);
  }
  for (int i : {2, 3}) {
    EXPECT_EQ(answers[i].decision(), v1::SettleStepResponse::COMMIT);
    EXPECT_EQ(answers[i].epoch(), 2) << "the commit brings the new membership";
    EXPECT_EQ(answers[i].join_global_step(), 1);
    EXPECT_THAT(answers[i].slices(), ElementsAre(0));
  }
  v1::Job whole = Job(id);
  EXPECT_EQ(whole.healthy_replicas(), 2);
  EXPECT_EQ(whole.lost_replicas_size(), 0);
  EXPECT_EQ(whole.healing_replica(), -1);
  EXPECT_FALSE(whole.ranks(2).replica_lost());
  // Step 0 completes on replica 0's reports alone; step 1 needs all four.
  ASSERT_TRUE(Report(id, 0, 0, {}, {0, 1}).ok());
  ASSERT_TRUE(Report(id, 1, 0, {1, 2, 3, 4}, {0, 1}).ok());
  EXPECT_EQ(Job(id).steps_done(), 1);
  const std::vector<v1::JobEvent> healed = EventsOf(id, &v1::JobEvent::has_replica_healed);
  ASSERT_EQ(healed.size(), 1u);
  EXPECT_EQ(healed[0].replica_healed().replica(), 1);
  EXPECT_EQ(healed[0].replica_healed().joined_global_step(), 1);
  EXPECT_EQ(healed[0].replica_healed().healthy_replicas(), 2);
}

TEST_F(CarryOnTest, WithoutCarryOnOrWithTheLastReplicaLostTheJobRestartsAsBefore) {
  const std::string id = StartJob(Spec("restart: {max_restarts: 1, carry_on: false}\n"));
  EXPECT_FALSE(workers_.Started(Address(1)).at(0).settle_steps());
  workers_.SetUnreachable(Address(4));
  clock_.Advance(absl::Seconds(6));  // the lease of every worker runs out; only worker 4 is gone
  for (int i : {0, 1, 2}) ASSERT_TRUE(Beat(workers_ids_[i]).ok());
  manager_->Tick();
  EXPECT_EQ(Job(id).restarts(), 1);
  EXPECT_EQ(Job(id).lost_replicas_size(), 0);
}

}  // namespace
}  // namespace stagecoach::coordinator::carry_on_test
