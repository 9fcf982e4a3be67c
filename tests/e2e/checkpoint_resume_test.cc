// Checkpoints and exact resume across real processes, with a built-in GPT, a tokens file made
// here and AdamW (so both the optimizer state and the data position must be restored):
//   - 10 steps straight versus 5 steps with a checkpoint, then a new job with
//     training.resume_from on a different set of worker processes (the first ones stopped) and
//     another schedule of the same stage count (GPipe, then 1F1B): the losses are identical bit
//     for bit (every worker runs with one intra-op thread, so CPU sums are reproducible);
//   - a corrupt checkpoint (one byte of a stage file flipped) and a partial one (no
//     manifest.json) are refused at submit with clear errors, and nothing in any checkpoint
//     directory changes (file list and SHA-256 of every file compared before and after);
//   - `stagectl checkpoint JOB` on a running job produces a complete checkpoint (listed in
//     Job.checkpoints, with its manifest.json).
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/util/sha256.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/job_predicates.h"
#include "tests/support/local_cluster.h"
#include "tests/support/token_files.h"

namespace stagecoach::testing::checkpoint_resume_test {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr int kVocab = 64;

// 6000 tokens: 6 random phrases of 5 to 10 tokens repeated in random order.
std::string TokenFile() { return PhraseTokenFile(777, kVocab, 6, 5, 6, 6000); }

struct GptJob {
  std::string name;
  std::string schedule;
  int64_t steps = 5;
  std::string checkpoint_dir;  // training.checkpoint.dir, or none
  std::string resume_from;     // training.resume_from, or none
};

std::string SpecYaml(const GptJob& j, const std::string& data) {
  std::string training = absl::StrCat(
      "training:\n  batch_size: 8\n  steps: ", j.steps,
      "\n  loss: cross_entropy\n  optimizer: {kind: adamw, lr: 3.0e-3, weight_decay: 0.01}\n");
  if (!j.checkpoint_dir.empty())
    absl::StrAppend(&training, "  checkpoint: {dir: ", j.checkpoint_dir, "}\n");
  if (!j.resume_from.empty()) absl::StrAppend(&training, "  resume_from: ", j.resume_from, "\n");
  return absl::StrCat("name: ", j.name, "\n",  //
                      "model:\n  builtin: {family: gpt, vocab: ", kVocab,
                      ", d_model: 32, layers: 2, heads: 4, seq: 16, seed: 11}\n",  //
                      "split: {stages: 2}\n",                                      //
                      "schedule: {kind: ", j.schedule, ", microbatches: 4}\n",     //
                      "placement: {workers: 2}\n", training,                       //
                      "data: {kind: tokens, path: ", data, ", seed: 9}\n");
}

// Every regular file under `dir` (relative path) and its SHA-256.
std::map<std::string, std::string> Snapshot(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (!entry.is_regular_file()) {
      out[fs::relative(entry.path(), dir).string()] = "(directory)";
      continue;
    }
    auto sha = Sha256OfFile(entry.path().string());
    EXPECT_TRUE(sha.ok()) << sha.status();
    out[fs::relative(entry.path(), dir).string()] = sha.ok() ? *sha : "";
  }
  return out;
}

class CheckpointResume : public ::testing::Test {
 protected:
  void SetUp() override {
    // One intra-op thread in every worker (they inherit the environment), so that CPU kernels
    // sum in a fixed order and resumed losses can be compared bit for bit.
    setenv("OMP_NUM_THREADS", "1", 1);
    setenv("MKL_NUM_THREADS", "1", 1);
  }

  // Submits `j` and returns its id.
  std::string Submit(LocalCluster& cluster, const GptJob& j, const std::string& data) {
    const std::string spec = cluster.WriteFile(absl::StrCat(j.name, ".yaml"), SpecYaml(j, data));
    CommandResult submit = cluster.Stagectl({"submit", spec});
    EXPECT_EQ(submit.exit_code, 0) << j.name << ": " << submit.out << submit.err;
    return LastLine(submit.out);
  }

  absl::StatusOr<v1::Job> Done(LocalCluster& cluster, const std::string& id) {
    return cluster.WaitForJob(id, IsFinal, absl::Seconds(180));
  }
};

TEST_F(CheckpointResume, ResumeOnOtherWorkersWithAnotherScheduleIsBitExact) {
  ClusterOptions options;
  options.workers = 2;
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  const std::string data = c.WriteFile("train.bin", TokenFile());
  const std::string ckpt = c.dir() + "/ckpt-first";

  // 10 steps straight, then 5 steps with a checkpoint, both on workers 0 and 1 with GPipe.
  const std::string straight_id = Submit(c, {"gpt-straight", "GPipe", 10, "", ""}, data);
  ASSERT_FALSE(straight_id.empty());
  auto straight = Done(c, straight_id);
  ASSERT_TRUE(straight.ok()) << straight.status() << c.Logs();
  ASSERT_EQ(straight->state(), v1::JOB_STATE_SUCCEEDED) << straight->reason() << c.Logs();
  ASSERT_EQ(straight->losses_size(), 10);

  const std::string first_id = Submit(c, {"gpt-first-half", "GPipe", 5, ckpt, ""}, data);
  ASSERT_FALSE(first_id.empty());
  auto first = Done(c, first_id);
  ASSERT_TRUE(first.ok()) << first.status() << c.Logs();
  ASSERT_EQ(first->state(), v1::JOB_STATE_SUCCEEDED) << first->reason() << c.Logs();
  ASSERT_EQ(first->losses_size(), 5);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(first->losses(i), straight->losses(i)) << "step " << i;
  const std::string step_dir = absl::StrFormat("%s/step-%06d", ckpt, 5);
  ASSERT_TRUE(fs::exists(step_dir + "/manifest.json")) << step_dir;
  ASSERT_GE(first->checkpoints_size(), 1);
  const v1::JobCheckpoint& listed = first->checkpoints(first->checkpoints_size() - 1);
  EXPECT_EQ(listed.step(), 5);
  EXPECT_EQ(fs::path(listed.directory()).lexically_normal(), fs::path(step_dir).lexically_normal());
  EXPECT_TRUE(fs::exists(listed.manifest())) << listed.manifest();
  for (int s = 0; s < 2; ++s) {
    EXPECT_TRUE(fs::exists(absl::StrFormat("%s/stage-%d.pt", step_dir, s)));
    EXPECT_TRUE(fs::exists(absl::StrFormat("%s/stage-%d.state_dict.pt", step_dir, s)));
  }
  const std::map<std::string, std::string> before = Snapshot(ckpt);

  // A corrupt copy (one byte of stage-1.pt flipped) and a partial copy (no manifest.json).
  const std::string corrupt = c.dir() + "/ckpt-corrupt/step-000005";
  const std::string partial = c.dir() + "/ckpt-partial/step-000005";
  for (const std::string& copy : {corrupt, partial}) {
    fs::create_directories(copy);
    fs::copy(step_dir, copy, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  }
  {
    std::fstream f(corrupt + "/stage-1.pt", std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good());
    const auto size = fs::file_size(corrupt + "/stage-1.pt");
    f.seekg(static_cast<std::streamoff>(size / 2));
    char byte = 0;
    f.read(&byte, 1);
    f.seekp(static_cast<std::streamoff>(size / 2));
    byte = static_cast<char>(byte ^ 0x5a);
    f.write(&byte, 1);
  }
  fs::remove(partial + "/manifest.json");
  const std::map<std::string, std::string> corrupt_before = Snapshot(c.dir() + "/ckpt-corrupt");
  const std::map<std::string, std::string> partial_before = Snapshot(c.dir() + "/ckpt-partial");

  for (const auto& [dir, want] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {corrupt, {"stage-1.pt", "sha256"}}, {partial, {"partial", "manifest.json"}}}) {
    SCOPED_TRACE(dir);
    const std::string spec =
        c.WriteFile("bad-resume.yaml", SpecYaml({"gpt-bad-resume", "1F1B", 5, "", dir}, data));
    CommandResult r = c.Stagectl({"submit", spec});
    EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
    EXPECT_THAT(r.err, HasSubstr("training.resume_from"));
    EXPECT_THAT(r.err, HasSubstr(dir));
    for (const std::string& w : want) EXPECT_THAT(r.err, HasSubstr(w));
  }
  EXPECT_EQ(Snapshot(c.dir() + "/ckpt-corrupt"), corrupt_before);
  EXPECT_EQ(Snapshot(c.dir() + "/ckpt-partial"), partial_before);

  // Other workers: stop 0 and 1, start 2 and 3, and wait until only the new ones are idle.
  c.worker(0).Stop();
  c.worker(1).Stop();
  ASSERT_TRUE(c.AddWorker().ok());
  ASSERT_TRUE(c.AddWorker().ok());
  std::map<std::string, std::string> name_of;  // worker id -> --name
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (true) {
    auto workers = c.ListWorkers();
    ASSERT_TRUE(workers.ok()) << workers.status();
    std::vector<std::string> idle;
    name_of.clear();
    for (const v1::WorkerInfo& w : *workers) {
      name_of[w.id()] = w.name();
      if (w.state() == v1::WORKER_STATE_IDLE) idle.push_back(w.name());
    }
    std::sort(idle.begin(), idle.end());
    if (idle == std::vector<std::string>{"worker-2", "worker-3"}) break;
    ASSERT_LT(absl::Now(), deadline) << "idle workers: " << absl::StrJoin(idle, ", ");
    absl::SleepFor(absl::Milliseconds(100));
  }

  // The second half with 1F1B on the new workers, from the checkpoint.
  const std::string resumed_id =
      Submit(c, {"gpt-second-half", "1F1B", 5, c.dir() + "/ckpt-second", step_dir}, data);
  ASSERT_FALSE(resumed_id.empty());
  auto resumed = Done(c, resumed_id);
  ASSERT_TRUE(resumed.ok()) << resumed.status() << c.Logs();
  ASSERT_EQ(resumed->state(), v1::JOB_STATE_SUCCEEDED) << resumed->reason() << c.Logs();
  for (const v1::RankStatus& rank : resumed->ranks()) {
    EXPECT_THAT(name_of[rank.worker_id()], ::testing::AnyOf("worker-2", "worker-3"))
        << "rank " << rank.rank() << " ran on " << rank.worker_id();
  }
  EXPECT_EQ(resumed->resumed_from().step(), 5);
  // The resumed job's losses are the timeline's steps 5..9 (the last five entries, whether or
  // not the job also lists the checkpoint's earlier steps), equal bit for bit.
  ASSERT_TRUE(resumed->losses_size() == 5 || resumed->losses_size() == 10)
      << resumed->losses_size();
  const int offset = resumed->losses_size() - 5;
  std::cerr.precision(17);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(resumed->losses(offset + i), straight->losses(5 + i))
        << "step " << 5 + i << ": resumed " << resumed->losses(offset + i) << ", straight "
        << straight->losses(5 + i);
  }
  // Its own checkpoint holds 10 steps of the timeline.
  EXPECT_TRUE(fs::exists(absl::StrFormat("%s/ckpt-second/step-%06d/manifest.json", c.dir(), 10)));
  // The checkpoint it resumed from is untouched.
  EXPECT_EQ(Snapshot(ckpt), before);
  if (HasFailure()) std::cerr << c.Logs();
}

TEST_F(CheckpointResume, CheckpointOnDemandIsComplete) {
  ClusterOptions options;
  options.workers = 2;
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  const std::string data = c.WriteFile("train.bin", TokenFile());
  const std::string ckpt = c.dir() + "/ckpt-on-demand";
  const std::string id = Submit(c, {"gpt-long", "1F1B", 100000, ckpt, ""}, data);
  ASSERT_FALSE(id.empty());
  auto running = c.WaitForJob(
      id, [](const v1::Job& j) { return IsFinal(j) || j.steps_done() >= 2; }, absl::Seconds(120));
  ASSERT_TRUE(running.ok()) << running.status() << c.Logs();
  ASSERT_EQ(running->state(), v1::JOB_STATE_RUNNING) << running->reason();

  CommandResult r = c.Stagectl({"checkpoint", id});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  auto with_checkpoint = c.WaitForJob(
      id, [](const v1::Job& j) { return IsFinal(j) || j.checkpoints_size() > 0; },
      absl::Seconds(60));
  ASSERT_TRUE(with_checkpoint.ok()) << with_checkpoint.status() << c.Logs();
  ASSERT_GT(with_checkpoint->checkpoints_size(), 0) << with_checkpoint->reason();
  const v1::JobCheckpoint& cp = with_checkpoint->checkpoints(0);
  EXPECT_GE(cp.step(), 2);
  EXPECT_EQ(fs::path(cp.directory()).lexically_normal(),
            fs::path(absl::StrFormat("%s/step-%06d", ckpt, cp.step())).lexically_normal());
  EXPECT_TRUE(fs::exists(cp.manifest())) << cp.manifest();
  for (int s = 0; s < 2; ++s) {
    EXPECT_TRUE(fs::exists(absl::StrFormat("%s/stage-%d.pt", cp.directory(), s)));
    EXPECT_TRUE(fs::exists(absl::StrFormat("%s/stage-%d.state_dict.pt", cp.directory(), s)));
  }

  CommandResult cancel = c.Stagectl({"cancel", id});
  EXPECT_EQ(cancel.exit_code, 0) << cancel.out << cancel.err;
  auto end = c.WaitForJob(id, IsFinal, absl::Seconds(60));
  ASSERT_TRUE(end.ok()) << end.status();
  EXPECT_EQ(end->state(), v1::JOB_STATE_CANCELLED);
  if (HasFailure()) std::cerr << c.Logs();
}

}  // namespace
}  // namespace stagecoach::testing::checkpoint_resume_test
