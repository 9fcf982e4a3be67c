// A long-lived coordinator stays bounded, end to end: 300 queued jobs are all listed by
// `stagectl list` across ListJobs pages; once they end, retention keeps the newest
// --retain-finished-jobs of them in memory and as records on disk; and over 1,200 jobs the
// coordinator's resident memory stays flat.
#include <filesystem>
#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/support/job_predicates.h"
#include "tests/support/local_cluster.h"

namespace stagecoach::testing {
namespace {

constexpr int kRetained = 100;
constexpr int kRound = 300;

constexpr char kSpec[] =
    "name: r\nmodel: {builtin: {family: mlp, sizes: [4, 8, 8, 2]}}\nsplit: {stages: 2}\n"
    "schedule: {kind: 1F1B, microbatches: 2}\ntraining: {batch_size: 4, steps: 5}\n";

// Resident memory of process `pid` in KiB (VmRSS), or -1.
int64_t ResidentKiB(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) != 0) continue;
    std::vector<std::string> parts = absl::StrSplit(line, ' ', absl::SkipEmpty());
    int64_t kib = -1;
    if (parts.size() >= 2 && absl::SimpleAtoi(parts[1], &kib)) return kib;
  }
  return -1;
}

class JobRetention : public ::testing::Test {
 protected:
  void SetUp() override {
    ClusterOptions options;
    options.workers = 0;  // jobs queue; nothing runs
    options.coordinator_args = {"--retain-finished-jobs", absl::StrCat(kRetained), "--data-dir",
                                "DATA_DIR"};
    data_dir_ = std::filesystem::temp_directory_path() / absl::StrCat("retention-", getpid());
    std::filesystem::remove_all(data_dir_);
    options.coordinator_args[3] = data_dir_.string();
    auto started = LocalCluster::Start(options);
    ASSERT_TRUE(started.ok()) << started.status();
    cluster_ = *std::move(started);
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
  // Waits (polling, bounded) until retention and the job table on disk have caught up.
  bool Settled(int listed, int records) {
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (absl::Now() < deadline) {
      if (static_cast<int>(Listed().size()) == listed && RecordsOnDisk() == records) return true;
      absl::SleepFor(absl::Milliseconds(200));
    }
    return false;
  }

  std::filesystem::path data_dir_;
  std::unique_ptr<LocalCluster> cluster_;
};

TEST_F(JobRetention, ListPagesThroughEveryJobAndFinishedOnesAreKeptByCount) {
  std::vector<std::string> ids = SubmitJobs(kRound);
  const std::vector<std::string> listed = Listed();
  ASSERT_EQ(listed.size(), static_cast<size_t>(kRound)) << "every job, over several pages";
  EXPECT_EQ(listed.front(), ids.front());
  EXPECT_EQ(listed.back(), ids.back());
  ASSERT_TRUE(Settled(kRound, kRound)) << "a record per job on disk";

  Cancel(ids);
  ASSERT_TRUE(Settled(kRetained, kRetained));
  const std::vector<std::string> kept = Listed();
  EXPECT_EQ(kept.front(), ids[kRound - kRetained]) << "the most recently finished are kept";
  const int64_t after_first = ResidentKiB(cluster_->coordinator().pid());
  ASSERT_GT(after_first, 0);

  // Three more rounds: 1,200 jobs in all, memory flat.
  for (int round = 0; round < 3; ++round) {
    Cancel(SubmitJobs(kRound));
    ASSERT_TRUE(Settled(kRetained, kRetained)) << "round " << round;
  }
  const int64_t after_all = ResidentKiB(cluster_->coordinator().pid());
  std::cout << "coordinator resident memory: " << after_first << " KiB after " << kRound
            << " jobs, " << after_all << " KiB after " << 4 * kRound << " jobs\n";
  // Unbounded, 900 more jobs would add their records (several KiB each); bounded, allocator
  // noise remains (about 0.1 MiB measured).
  EXPECT_LT(after_all - after_first, 1024) << "KiB grown over 900 more jobs";
}

}  // namespace
}  // namespace stagecoach::testing
