// A long-lived coordinator stays bounded, end to end: 300 queued jobs are all listed by
// `stagectl list` across ListJobs pages; once they end, retention keeps the newest
// --retain-finished-jobs of them in memory and as records on disk; and over 1,200 jobs the
// coordinator's heap stays flat: what 600 more jobs leave behind is a small fraction of what 300
// jobs held in the table take (the coordinator's own stagecoach_process_heap_in_use_bytes, which
// unlike resident memory does not move with the allocator's free lists).
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/support/job_predicates.h"
#include "tests/support/local_cluster.h"
#include "tests/support/prometheus_scrape.h"

namespace stagecoach::testing::job_retention_test {
namespace {

constexpr int kRetained = 100;
constexpr int kRound = 300;

constexpr char kSpec[] =
    "name: r\nmodel: {builtin: {family: mlp, sizes: [4, 8, 8, 2]}}\nsplit: {stages: 2}\n"
    "schedule: {kind: 1F1B, microbatches: 2}\ntraining: {batch_size: 4, steps: 5}\n";

class JobRetention : public ::testing::Test {
 protected:
  void SetUp() override {
    ClusterOptions options;
    options.workers = 0;  // jobs queue; nothing runs
    options.coordinator_args = {"--retain-finished-jobs", absl::StrCat(kRetained), "--data-dir",
                                "DATA_DIR", "--metrics-listen", "127.0.0.1:0"};
    data_dir_ = std::filesystem::temp_directory_path() / absl::StrCat("retention-", getpid());
    std::filesystem::remove_all(data_dir_);
    options.coordinator_args[3] = data_dir_.string();
    auto started = LocalCluster::Start(options);
    ASSERT_TRUE(started.ok()) << started.status();
    cluster_ = *std::move(started);
    auto metrics = ReadMetricsAddress(cluster_->coordinator());
    ASSERT_TRUE(metrics.ok()) << metrics.status();
    metrics_ = *metrics;
  }
  void TearDown() override {
    if (HasFailure()) std::cerr << cluster_->Logs();
    cluster_.reset();
    std::filesystem::remove_all(data_dir_);
  }

  std::vector<std::string> SubmitJobs(int n) {
    std::vector<std::string> ids;
    for (int i = 0; i < n; ++i) {
      absl::StatusOr<std::string> id = cluster_->Submit(kSpec);
      EXPECT_TRUE(id.ok()) << id.status();
      ids.push_back(id.ok() ? *id : "");
    }
    return ids;
  }
  void Cancel(const std::vector<std::string>& ids) {
    for (const std::string& id : ids) {
      absl::Status cancelled = cluster_->Cancel(id);
      EXPECT_TRUE(cancelled.ok()) << id << ": " << cancelled;
    }
  }
  // Jobs `stagectl list -o json` shows (it follows every page).
  std::vector<std::string> Listed() {
    CommandResult r = cluster_->Stagectl({"-o", "json", "list"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    std::vector<std::string> out;
    for (const auto& job : nlohmann::json::parse(r.out)) out.push_back(job["id"]);
    return out;
  }
  int RecordsOnDisk() {
    int n = 0;
    for (const auto& e : std::filesystem::directory_iterator(data_dir_ / "jobs")) {
      if (e.path().extension() == ".pb") ++n;
    }
    return n;
  }
  // Waits (polling, bounded) until retention and the job table on disk have caught up; an
  // assertion result that says what it saw last when they have not.
  ::testing::AssertionResult Settled(int listed, int records) {
    const absl::Time start = absl::Now();
    int seen_listed = -1;
    int seen_records = -1;
    while (absl::Now() < start + absl::Seconds(120)) {
      seen_listed = static_cast<int>(Listed().size());
      seen_records = RecordsOnDisk();
      if (seen_listed == listed && seen_records == records) return ::testing::AssertionSuccess();
      absl::SleepFor(absl::Milliseconds(200));
    }
    return ::testing::AssertionFailure()
           << "after 120s: " << seen_listed << " jobs listed (want " << listed << "), "
           << seen_records << " records on disk (want " << records << ")";
  }
  // The coordinator's memory gauge `name` (stagecoach_process_*_bytes), or -1.
  double Memory(const std::string& name) {
    auto samples = Scrape(metrics_);
    EXPECT_TRUE(samples.ok()) << samples.status();
    if (!samples.ok()) return -1;
    auto it = samples->find(name);
    EXPECT_NE(it, samples->end()) << name;
    return it == samples->end() ? -1 : it->second;
  }
  double Heap() { return Memory("stagecoach_process_heap_in_use_bytes"); }

  std::filesystem::path data_dir_;
  std::unique_ptr<LocalCluster> cluster_;
  std::string metrics_;
};

TEST_F(JobRetention, ListPagesThroughEveryJobAndFinishedOnesAreKeptByCount) {
  const double empty = Heap();
  std::vector<std::string> ids = SubmitJobs(kRound);
  const std::vector<std::string> listed = Listed();
  ASSERT_EQ(listed.size(), static_cast<size_t>(kRound)) << "every job, over several pages";
  EXPECT_EQ(listed.front(), ids.front());
  EXPECT_EQ(listed.back(), ids.back());
  ASSERT_TRUE(Settled(kRound, kRound)) << "a record per job on disk";
  // What the table takes for each job it holds: the yardstick of a leak below.
  const double per_job = (Heap() - empty) / kRound;
  ASSERT_GT(per_job, 0);

  Cancel(ids);
  ASSERT_TRUE(Settled(kRetained, kRetained));
  const std::vector<std::string> kept = Listed();
  EXPECT_EQ(kept.front(), ids[kRound - kRetained]) << "the most recently finished are kept";

  // Three more rounds: 1,200 jobs in all. The first warms what is made once (gRPC's and the
  // allocator's caches); over the last two, 600 jobs come and go.
  double warm = 0;
  double warm_resident = 0;
  for (int round = 0; round < 3; ++round) {
    Cancel(SubmitJobs(kRound));
    ASSERT_TRUE(Settled(kRetained, kRetained)) << "round " << round;
    if (round == 0) {
      warm = Heap();
      warm_resident = Memory("stagecoach_process_resident_memory_bytes");
    }
  }
  const double grown = Heap() - warm;
  const double resident = Memory("stagecoach_process_resident_memory_bytes");
  std::cout << "coordinator: " << per_job << " heap bytes per job held; heap " << warm / 1024
            << " KiB after " << 2 * kRound << " jobs, grown by " << grown / 1024 << " KiB over "
            << 2 * kRound << " more (resident " << warm_resident / 1024 << " -> "
            << resident / 1024 << " KiB)\n";
  // Kept, 600 jobs would add 600 * per_job; a leak of a tenth of each, 60 jobs' worth. What
  // comes and goes with a request (a ListJobs page, gRPC's buffers) stays well below 30.
  EXPECT_LT(grown, 30 * per_job) << "heap bytes left behind by " << 2 * kRound
                                 << " jobs that came and went (" << per_job << " per job held)";
}

}  // namespace
}  // namespace stagecoach::testing::job_retention_test
