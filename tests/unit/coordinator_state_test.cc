// The coordinator's small stateful parts: the rendezvous store, the worker registry and the
// job state machine.
#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "coordinator/jobs/job.h"
#include "coordinator/workers/kv_store.h"
#include "coordinator/workers/worker_registry.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stagecoach::coordinator::coordinator_state_test {
namespace {

using ::testing::HasSubstr;

TEST(KvStore, GetWaitsForTheKeyAndTimesOutNamingIt) {
  KvStore kv;
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(50));
    ASSERT_TRUE(kv.Set("a/b", "value").ok());
  });
  auto got = kv.Get("a/b", absl::Seconds(5));
  setter.join();
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, "value");
  auto missing = kv.Get("a/c", absl::Milliseconds(20));
  EXPECT_TRUE(absl::IsDeadlineExceeded(missing.status()));
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("'a/c'"));
  absl::Status wait = kv.Wait({"a/b", "x", "y"}, absl::Milliseconds(20));
  EXPECT_THAT(std::string(wait.message()), HasSubstr("x, y"));
  EXPECT_TRUE(kv.Wait({"a/b"}, absl::ZeroDuration()).ok());
}

TEST(KvStore, DeletePrefixAndLimits) {
  KvStore kv;
  ASSERT_TRUE(kv.Set("jobs/1/a", "1").ok());
  ASSERT_TRUE(kv.Set("jobs/1/b", "2").ok());
  ASSERT_TRUE(kv.Set("jobs/10/a", "3").ok());
  EXPECT_EQ(kv.DeletePrefix("jobs/1/"), 2);
  EXPECT_EQ(kv.size(), 1u);
  EXPECT_TRUE(absl::IsInvalidArgument(kv.Set("", "x")));
  EXPECT_TRUE(absl::IsInvalidArgument(kv.Set("k", std::string(KvStore::kMaxValueBytes + 1, 'x'))));
}

TEST(WorkerRegistry, SparesAreHeldForTheirJobOnly) {
  WorkerRegistry registry(absl::Seconds(3));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  auto a = registry.Register("a", "h:1", "cpu", {"gloo"}, t0);
  auto b = registry.Register("b", "h:2", "cpu", {"gloo"}, t0);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(registry.Reserve(*b, "job-1").ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(registry.Reserve(*b, "job-2")));
  EXPECT_EQ(registry.Idle("cpu", "gloo").size(), 1u) << "held for job-1";
  EXPECT_EQ(registry.Idle("cpu", "gloo", "job-2").size(), 1u);
  ASSERT_EQ(registry.Idle("cpu", "gloo", "job-1").size(), 2u);
  EXPECT_EQ(registry.Idle("cpu", "gloo", "job-1")[0].id, *b) << "its own spare first";
  v1::WorkerInfo info;
  registry.Find(*b)->ToProto(&info);
  EXPECT_EQ(info.reserved_for_job(), "job-1");
  // Taking a rank ends the hold; so does the job letting its spares go.
  ASSERT_TRUE(registry.Assign(*b, "job-1", 0).ok());
  EXPECT_EQ(registry.Find(*b)->reserved_for, "");
  ASSERT_TRUE(registry.Reserve(*a, "job-1").ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(registry.Reserve(*b, "job-1"))) << "busy";
  registry.Unreserve("job-1");
  EXPECT_EQ(registry.Idle("cpu", "gloo", "job-2").size(), 1u);
}

TEST(WorkerRegistry, LeasesExpireAndLostWorkersMustRegisterAgain) {
  WorkerRegistry registry(absl::Seconds(3));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  auto a = registry.Register("a", "h:1", "cpu", {"gloo"}, t0);
  auto b = registry.Register("b", "h:2", "cuda:0", {"gloo"}, t0);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, "w-1");
  EXPECT_TRUE(absl::IsAlreadyExists(registry.Register("a2", "h:1", "cpu", {}, t0).status()));
  ASSERT_TRUE(registry.Heartbeat(*a, t0 + absl::Seconds(2)).ok());
  EXPECT_THAT(registry.ExpireLeases(t0 + absl::Seconds(4)), ::testing::ElementsAre(*b));
  EXPECT_EQ(registry.Find(*b)->state, v1::WORKER_STATE_LOST);
  EXPECT_THAT(registry.Find(*b)->reason, HasSubstr("no heartbeat for 4s"));
  EXPECT_TRUE(absl::IsNotFound(registry.Heartbeat(*b, t0 + absl::Seconds(5))));
  // Registering again at the lost worker's address replaces its entry.
  auto again = registry.Register("b", "h:2", "cuda:0", {}, t0 + absl::Seconds(6));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, "w-3");
  EXPECT_EQ(registry.Find(*b), std::nullopt);
}

TEST(WorkerRegistry, AssignAndReleaseAndDeviceMatching) {
  WorkerRegistry registry(absl::Seconds(3));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  auto cpu = registry.Register("a", "h:1", "cpu", {}, t0);
  auto gpu = registry.Register("b", "h:2", "cuda:1", {}, t0);
  EXPECT_EQ(registry.Idle("cpu", "gloo").size(), 1u);
  EXPECT_EQ(registry.Idle("cuda", "gloo").size(), 1u);
  ASSERT_TRUE(registry.Assign(*cpu, "job-1", 0).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(registry.Assign(*cpu, "job-2", 0)));
  EXPECT_TRUE(registry.Idle("cpu", "gloo").empty());
  registry.Release(*cpu, "job-2");  // not its job: no-op
  EXPECT_EQ(registry.Find(*cpu)->state, v1::WORKER_STATE_BUSY);
  registry.Release(*cpu, "job-1");
  EXPECT_EQ(registry.Find(*cpu)->state, v1::WORKER_STATE_IDLE);
  EXPECT_EQ(registry.Find(*cpu)->rank, -1);
  EXPECT_FALSE(DeviceMatches("cpu", "cuda:0"));
  // Transports: a worker without nccl is not a candidate for an nccl job.
  auto nccl = registry.Register("c", "h:3", "cuda:0", {"gloo", "nccl"}, t0);
  ASSERT_TRUE(nccl.ok());
  ASSERT_EQ(registry.Idle("cuda", "nccl").size(), 1u);
  EXPECT_EQ(registry.Idle("cuda", "nccl")[0].id, *nccl);
  EXPECT_EQ(registry.Idle("cuda", "gloo").size(), 2u);
  EXPECT_TRUE(DeviceMatches("cuda", "cuda:3"));
  (void)gpu;
}

// The registry finds a worker by id and by address through indexes of its own (issue 43: a
// heartbeat must not scan the fleet); they must follow every registration, replacement and loss.
TEST(WorkerRegistry, EveryWorkerOfAFleetIsFoundByIdAfterReplacements) {
  WorkerRegistry registry(absl::Seconds(3));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  std::vector<std::string> ids;
  for (int i = 0; i < 300; ++i) {
    auto id = registry.Register(absl::StrCat("w", i), absl::StrCat("h:", 7000 + i), "cpu", {}, t0);
    ASSERT_TRUE(id.ok()) << id.status();
    ids.push_back(*id);
  }
  // Every third worker is lost and comes back at its address under a new id.
  for (int i = 0; i < 300; i += 3) {
    ASSERT_TRUE(registry.MarkLost(ids[i], "gone"));
    auto again = registry.Register("back", absl::StrCat("h:", 7000 + i), "cpu", {}, t0);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(registry.Find(ids[i]), std::nullopt) << "the replaced entry is gone";
    EXPECT_TRUE(absl::IsNotFound(registry.Heartbeat(ids[i], t0)));
    EXPECT_EQ(registry.LastHeartbeat(ids[i]), absl::InfinitePast());
    ids[i] = *again;
  }
  const absl::Time t1 = t0 + absl::Seconds(1);
  for (int i = 0; i < 300; ++i) {
    ASSERT_TRUE(registry.Heartbeat(ids[i], t1).ok()) << ids[i];
    const std::optional<WorkerRecord> w = registry.Find(ids[i]);
    ASSERT_TRUE(w.has_value()) << ids[i];
    EXPECT_EQ(w->address, absl::StrCat("h:", 7000 + i));
    EXPECT_EQ(registry.LastHeartbeat(ids[i]), t1);
  }
  EXPECT_EQ(registry.All().size(), 300u) << "one entry per address";
  EXPECT_TRUE(absl::IsAlreadyExists(registry.Register("dup", "h:7001", "cpu", {}, t1).status()));
  EXPECT_TRUE(absl::IsNotFound(registry.Heartbeat("w-100000", t1)));
  EXPECT_TRUE(absl::IsFailedPrecondition(registry.Assign("w-100000", "job-1", 0)));
}

TEST(WorkerRegistry, CountsWorkersByStateWithoutListingThem) {
  WorkerRegistry registry(absl::Seconds(3));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  EXPECT_TRUE(registry.Counts().empty());
  auto a = registry.Register("a", "h:1", "cpu", {}, t0);
  auto b = registry.Register("b", "h:2", "cpu", {}, t0);
  auto c = registry.Register("c", "h:3", "cpu", {}, t0);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  ASSERT_TRUE(registry.Assign(*a, "job-1", 0).ok());
  ASSERT_TRUE(registry.MarkLost(*b, "gone"));
  const std::map<v1::WorkerState, int> counts = registry.Counts();
  EXPECT_EQ(counts.size(), 3u);
  EXPECT_EQ(counts.at(v1::WORKER_STATE_IDLE), 1);
  EXPECT_EQ(counts.at(v1::WORKER_STATE_BUSY), 1);
  EXPECT_EQ(counts.at(v1::WORKER_STATE_LOST), 1);
}

TEST(JobStateMachine, OnlyTheDiagramsTransitionsAreAllowed) {
  using S = v1::JobState;
  const std::vector<std::pair<S, S>> edges = {
      {S::JOB_STATE_PLANNING, S::JOB_STATE_PENDING},
      {S::JOB_STATE_PENDING, S::JOB_STATE_STARTING},
      {S::JOB_STATE_STARTING, S::JOB_STATE_RUNNING},
      {S::JOB_STATE_STARTING, S::JOB_STATE_PAUSED},
      {S::JOB_STATE_STARTING, S::JOB_STATE_RESTARTING},
      {S::JOB_STATE_RUNNING, S::JOB_STATE_PAUSED},
      {S::JOB_STATE_RUNNING, S::JOB_STATE_SUCCEEDED},
      {S::JOB_STATE_RUNNING, S::JOB_STATE_RESTARTING},
      {S::JOB_STATE_PAUSED, S::JOB_STATE_RUNNING},
      {S::JOB_STATE_PAUSED, S::JOB_STATE_RESTARTING},
      {S::JOB_STATE_RESTARTING, S::JOB_STATE_STARTING},
  };
  const std::vector<S> all = {S::JOB_STATE_PLANNING,  S::JOB_STATE_PENDING, S::JOB_STATE_STARTING,
                              S::JOB_STATE_RUNNING,   S::JOB_STATE_PAUSED,  S::JOB_STATE_RESTARTING,
                              S::JOB_STATE_SUCCEEDED, S::JOB_STATE_FAILED,  S::JOB_STATE_CANCELLED};
  for (S from : all) {
    for (S to : all) {
      const bool final_from = IsFinal(from);
      const bool expected =
          !final_from &&
          ((to == S::JOB_STATE_FAILED || to == S::JOB_STATE_CANCELLED) ||
           std::find(edges.begin(), edges.end(), std::make_pair(from, to)) != edges.end());
      EXPECT_EQ(CheckTransition(from, to).ok(), expected)
          << JobStateName(from) << " -> " << JobStateName(to);
    }
  }
  Job job;
  job.id = "job-1";
  const absl::Time t = absl::FromUnixSeconds(5);
  job.state = S::JOB_STATE_PENDING;
  ASSERT_TRUE(job.TransitionTo(S::JOB_STATE_STARTING, "placed", t).ok());
  ASSERT_TRUE(job.TransitionTo(S::JOB_STATE_RUNNING, "go", t).ok());
  ASSERT_TRUE(job.TransitionTo(S::JOB_STATE_FAILED, "worker w-2 (rank 1) lost", t).ok());
  absl::Status again = job.TransitionTo(S::JOB_STATE_RUNNING, "", t);
  EXPECT_THAT(std::string(again.message()), HasSubstr("cannot go from FAILED to RUNNING"));
  EXPECT_EQ(job.history.size(), 3u);
  EXPECT_EQ(job.events.size(), 3u);
  EXPECT_EQ(job.reason, "worker w-2 (rank 1) lost");
}

}  // namespace
}  // namespace stagecoach::coordinator::coordinator_state_test
