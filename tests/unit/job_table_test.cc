// The job table alone: ids, lookup, paged listing, retention of finished jobs by count and age
// (with the records on disk following), and the bounded event log; the job writer alone:
// records written off the caller's thread, coalesced, in order, removals after saves.
#include "coordinator/jobs/job_table.h"

#include <map>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/util/executor.h"
#include "coordinator/jobs/event_log.h"
#include "coordinator/jobs/job_writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/coordinator_test_fakes.h"

namespace stagecoach::coordinator::job_table_test {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

const absl::Time kT0 = absl::FromUnixSeconds(1'700'000'000);

// Adds a job that moves to `state` at `at` (through the state machine's transitions).
Job& AddJob(JobTable& table, v1::JobState state, absl::Time at) {
  absl::MutexLock lock(&table.mu());
  Job& job = table.CreateLocked();
  EXPECT_TRUE(job.TransitionTo(v1::JOB_STATE_PLANNING, "submitted", at).ok());
  EXPECT_TRUE(job.TransitionTo(v1::JOB_STATE_PENDING, "planned", at).ok());
  if (state != v1::JOB_STATE_PENDING) {
    EXPECT_TRUE(job.TransitionTo(state, "ended", at).ok());
  }
  table.PersistLocked(job);
  return job;
}

// A job table whose records go to a store in memory, written when the test runs the executor.
struct PersistedTable {
  explicit PersistedTable(JobTableOptions options) : table(options, &writer) {}
  MemoryJobStore store;
  ManualExecutor executor;
  JobWriter writer{&store, &executor};
  JobTable table;
};

std::vector<std::string> Ids(const std::vector<v1::Job>& jobs) {
  std::vector<std::string> out;
  for (const auto& j : jobs) out.push_back(j.id());
  return out;
}

TEST(JobTable, IdsCountUpAndLookupsNameTheMissingJob) {
  JobTable table({}, nullptr);
  const std::string a = AddJob(table, v1::JOB_STATE_PENDING, kT0).id;
  const std::string b = AddJob(table, v1::JOB_STATE_PENDING, kT0).id;
  EXPECT_EQ(a, "job-1");
  EXPECT_EQ(b, "job-2");
  absl::MutexLock lock(&table.mu());
  EXPECT_NE(table.FindLocked("job-2"), nullptr);
  EXPECT_EQ(table.FindLocked("job-02"), nullptr);
  EXPECT_EQ(table.FindLocked("nope"), nullptr);
  EXPECT_THAT(std::string(table.FindOrErrorLocked("job-9").status().message()),
              HasSubstr("no job 'job-9'"));
  auto recovered = std::make_shared<Job>();
  recovered->id = "job-7";
  ASSERT_TRUE(table.InsertLocked(recovered).ok());
  EXPECT_EQ(table.CreateLocked().id, "job-8") << "new ids come after recovered ones";
  auto twice = std::make_shared<Job>();
  twice->id = "job-7";
  EXPECT_TRUE(absl::IsAlreadyExists(table.InsertLocked(twice)));
  auto bad = std::make_shared<Job>();
  bad->id = "seven";
  EXPECT_TRUE(absl::IsInvalidArgument(table.InsertLocked(bad)));
}

TEST(JobTable, ListingPagesThroughEveryJobInOrder) {
  JobTableOptions options;
  options.default_page_size = 4;
  options.max_page_size = 6;
  JobTable table(options, nullptr);
  for (int i = 0; i < 10; ++i) AddJob(table, v1::JOB_STATE_PENDING, kT0);
  auto first = table.List(0, "");
  ASSERT_TRUE(first.ok());
  EXPECT_THAT(Ids(first->jobs), ElementsAre("job-1", "job-2", "job-3", "job-4"));
  ASSERT_FALSE(first->next_page_token.empty());
  auto second = table.List(100, first->next_page_token);  // capped at 6
  ASSERT_TRUE(second.ok());
  EXPECT_THAT(Ids(second->jobs),
              ElementsAre("job-5", "job-6", "job-7", "job-8", "job-9", "job-10"));
  EXPECT_TRUE(second->next_page_token.empty()) << "the last page";
  // A job dropped between pages does not break the listing.
  {
    absl::MutexLock lock(&table.mu());
    Job* job = table.FindLocked("job-5");
    ASSERT_TRUE(job->TransitionTo(v1::JOB_STATE_CANCELLED, "x", kT0).ok());
  }
  EXPECT_TRUE(absl::IsInvalidArgument(table.List(-1, "").status()));
  auto bad = table.List(2, "job-3");
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status()));
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("page_token"));
  // Summaries: no spec text, no action lists.
  {
    absl::MutexLock lock(&table.mu());
    Job* job = table.FindLocked("job-1");
    job->spec_yaml = "name: x\n";
    job->ranks.emplace_back().actions = {"0F0"};
  }
  auto summary = table.List(1, "");
  EXPECT_TRUE(summary->jobs[0].spec_yaml().empty());
  EXPECT_EQ(summary->jobs[0].ranks(0).assigned_actions_size(), 0);
}

TEST(JobTable, FinishedJobsAreKeptByCountAndAgeWithTheirRecords) {
  JobTableOptions options;
  options.retain_finished_jobs = 3;
  options.retain_finished_for = absl::Hours(1);
  PersistedTable t(options);
  JobTable& table = t.table;
  MemoryJobStore& store = t.store;
  ManualExecutor& executor = t.executor;
  // job-1 finished long ago, jobs 2..6 recently (in order), job-7 still pending.
  AddJob(table, v1::JOB_STATE_CANCELLED, kT0 - absl::Hours(2));
  for (int i = 0; i < 5; ++i) {
    AddJob(table, v1::JOB_STATE_FAILED, kT0 + absl::Minutes(i));
  }
  AddJob(table, v1::JOB_STATE_PENDING, kT0 - absl::Hours(5));
  executor.RunUntilIdle();
  EXPECT_EQ(store.ids().size(), 7u);
  std::vector<std::string> pruned;
  {
    absl::MutexLock lock(&table.mu());
    pruned = table.PruneLocked(kT0 + absl::Minutes(10));
  }
  EXPECT_THAT(pruned, ElementsAre("job-1", "job-2", "job-3"))
      << "too old, then beyond the 3 most recently finished";
  executor.RunUntilIdle();
  EXPECT_THAT(store.ids(), ElementsAre("job-4", "job-5", "job-6", "job-7"));
  // Age alone: an hour later every finished job has aged out; the pending one stays.
  {
    absl::MutexLock lock(&table.mu());
    pruned = table.PruneLocked(kT0 + absl::Minutes(70));
    EXPECT_EQ(table.SizeLocked(), 1);
  }
  EXPECT_THAT(pruned, ElementsAre("job-4", "job-5", "job-6"));
  executor.RunUntilIdle();
  EXPECT_THAT(store.ids(), ElementsAre("job-7"));
}

TEST(JobTable, TenThousandJobsLeaveABoundedTable) {
  JobTableOptions options;
  options.retain_finished_jobs = 100;
  PersistedTable t(options);
  JobTable& table = t.table;
  ManualExecutor& executor = t.executor;
  size_t most = 0;
  for (int i = 0; i < 10000; ++i) {
    AddJob(table, v1::JOB_STATE_CANCELLED, kT0 + absl::Seconds(i));
    if (i % 50 == 49) {
      absl::MutexLock lock(&table.mu());
      table.PruneLocked(kT0 + absl::Seconds(i));
      most = std::max(most, static_cast<size_t>(table.SizeLocked()));
    }
    executor.RunUntilIdle();
  }
  EXPECT_LE(most, 100u);
  const std::set<std::string> kept = t.store.ids();
  EXPECT_EQ(kept.size(), 100u);
  EXPECT_EQ(kept.count("job-9901"), 1u) << "the 100 most recently finished";
  EXPECT_EQ(kept.count("job-9900"), 0u);
}

TEST(JobTable, ShareKeepsAJobAliveAfterItIsDropped) {
  JobTableOptions options;
  options.retain_finished_jobs = 0;
  JobTable table(options, nullptr);
  AddJob(table, v1::JOB_STATE_CANCELLED, kT0);
  absl::MutexLock lock(&table.mu());
  std::shared_ptr<Job> held = table.ShareLocked("job-1");
  ASSERT_NE(held, nullptr);
  EXPECT_THAT(table.PruneLocked(kT0), ElementsAre("job-1"));
  EXPECT_EQ(table.FindLocked("job-1"), nullptr);
  EXPECT_EQ(held->id, "job-1");
  EXPECT_EQ(held->state, v1::JOB_STATE_CANCELLED);
}

TEST(JobTable, AJobWhoseStartIsInFlightIsKeptUntilItReturns) {
  JobTableOptions options;
  options.retain_finished_jobs = 0;
  JobTable table(options, nullptr);
  Job& job = AddJob(table, v1::JOB_STATE_CANCELLED, kT0);
  absl::MutexLock lock(&table.mu());
  job.starting = true;  // cancelled while its StartTask calls run
  EXPECT_TRUE(table.PruneLocked(kT0 + absl::Hours(1000)).empty());
  job.starting = false;
  EXPECT_THAT(table.PruneLocked(kT0 + absl::Hours(1000)), ElementsAre("job-1"));
}

TEST(EventLog, KeepsTheNewestEventsAndTellsAWatcherWhatItMissed) {
  EventLog log(3);
  for (int i = 0; i < 5; ++i) {
    v1::JobEvent e;
    e.mutable_step_completed()->set_step(i);
    log.Add(e, "job-1", kT0 + absl::Seconds(i));
  }
  EXPECT_EQ(log.next_sequence(), 5);
  EXPECT_EQ(log.first_kept(), 2);
  EXPECT_EQ(log.size(), 3);
  EventLog::Slice all = log.Since(0);
  EXPECT_EQ(all.dropped_from, 0);
  EXPECT_EQ(all.dropped_to, 2);
  ASSERT_EQ(all.events.size(), 3u);
  EXPECT_EQ(all.events[0].sequence(), 2);
  EXPECT_EQ(all.events[0].step_completed().step(), 2);
  EXPECT_EQ(all.events[2].job_id(), "job-1");
  EventLog::Slice recent = log.Since(4);
  EXPECT_EQ(recent.dropped_to, 0) << "nothing asked for was dropped";
  ASSERT_EQ(recent.events.size(), 1u);
  EXPECT_EQ(recent.events[0].sequence(), 4);
  EXPECT_TRUE(log.Since(5).events.empty());
}

TEST(JobWriter, SavesCoalesceAndRemovalsFollowSavesInOrder) {
  MemoryJobStore store;
  ManualExecutor executor;
  JobWriter writer(&store, &executor);
  v1::Job a;
  a.set_id("job-1");
  a.set_state(v1::JOB_STATE_PENDING);
  writer.Save(a);
  a.set_state(v1::JOB_STATE_RUNNING);
  writer.Save(a);  // replaces the queued record
  v1::Job b;
  b.set_id("job-2");
  b.set_state(v1::JOB_STATE_PENDING);
  writer.Save(b);
  writer.Remove("job-2");  // replaces b's queued save
  EXPECT_TRUE(store.calls().empty()) << "nothing is written on the caller's thread";
  EXPECT_EQ(executor.pending(), 1) << "one drain at a time";
  executor.RunUntilIdle();
  EXPECT_THAT(store.calls(), ElementsAre("save job-1 JOB_STATE_RUNNING", "remove job-2"));
  EXPECT_EQ(writer.writes(), 2);
  // What is queued when the writer goes away is written by its destructor; a drain queued
  // before that finds nothing left to do.
  writer.Save(b);
  {
    JobWriter other(&store, &executor);
    other.Save(a);
  }
  EXPECT_EQ(store.calls().back(), "save job-1 JOB_STATE_RUNNING");
  executor.RunUntilIdle();
  EXPECT_EQ(store.calls().back(), "save job-2 JOB_STATE_PENDING");
}

TEST(JobWriter, ASlowDiskDoesNotDelayTheCaller) {
  MemoryJobStore store;
  absl::Notification release;
  store.BlockSaves(&release);
  ManualExecutor executor;
  JobWriter writer(&store, &executor);
  v1::Job a;
  a.set_id("job-1");
  writer.Save(a);
  std::thread disk([&] { executor.RunUntilIdle(); });
  store.entered().WaitForNotification();  // the write is stuck in the store
  // The caller goes on queueing while the disk is stuck.
  a.set_state(v1::JOB_STATE_RUNNING);
  writer.Save(a);
  writer.Remove("job-5");
  release.Notify();
  disk.join();
  executor.RunUntilIdle();
  EXPECT_THAT(store.calls(), ElementsAre("save job-1 JOB_STATE_UNSPECIFIED",
                                         "save job-1 JOB_STATE_RUNNING", "remove job-5"));
}

}  // namespace
}  // namespace stagecoach::coordinator::job_table_test
