// JobManager's checkpoints with fake workers: manifests written last once every stage's files are
// in (also files reported after later steps: asynchronous checkpoints), resume verified at
// submit and read by name on another layout, checkpoints on demand.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "absl/strings/str_cat.h"
#include "common/util/sha256.h"
#include "coordinator/checkpoints/checkpoint_manifest.h"
#include "coordinator/job_manager.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"
#include "tests/unit/coordinator_test_fakes.h"

namespace stagecoach::coordinator::job_manager_checkpoint_test {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// --- Checkpoints: manifests written last, resume verified at submit, checkpoint on demand. ---

// A two-stage (4 layers: [0, 2), [2, 4)) training spec writing checkpoints under `dir` (none
// when empty), and resuming from `resume_from` when given.
std::string CheckpointSpec(const std::string& dir, const std::string& resume_from = "",
                           int stages = 2, const std::string& schedule = "GPipe", int steps = 3) {
  std::string training = absl::StrCat("training: {batch_size: 8, steps: ", steps);
  if (!dir.empty()) absl::StrAppend(&training, ", checkpoint: {dir: ", dir, "}");
  if (!resume_from.empty()) absl::StrAppend(&training, ", resume_from: ", resume_from);
  return absl::StrCat("name: t\nmodel: {builtin: {family: mlp, sizes: [4, 8, 8, 8, 2]}}\n",
                      "split: {stages: ", stages, "}\n", "schedule: {kind: ", schedule,
                      ", microbatches: 4}\n", training, "}\n");
}

class JobManagerCheckpointTest : public JobManagerFixture {
 protected:
  // Writes stage `stage`'s two files of the checkpoint at `step` under `dir` as a worker would,
  // and returns their entries.
  std::vector<v1::StageCheckpointFile> WriteStageFiles(const std::string& dir, int64_t step,
                                                       int stage) {
    const std::string step_dir = CheckpointStepDirectory(dir, step);
    std::filesystem::create_directories(step_dir);
    std::vector<v1::StageCheckpointFile> files;
    for (const std::string& name :
         {absl::StrCat("stage-", stage, ".pt"), absl::StrCat("stage-", stage, ".state_dict.pt")}) {
      const std::string bytes = absl::StrCat("contents of ", name, " at step ", step);
      std::ofstream(step_dir + "/" + name, std::ios::binary) << bytes;
      v1::StageCheckpointFile& f = files.emplace_back();
      f.set_stage(stage);
      f.set_file(name);
      f.set_size_bytes(static_cast<int64_t>(bytes.size()));
      f.set_sha256(Sha256Hex(bytes));
    }
    return files;
  }

  // A complete two-stage checkpoint at `step` (layers [0, split) and [split, 4)) under dir_.
  std::string WriteCheckpoint(int64_t step, int split = 2) {
    CheckpointManifest m;
    m.job_id = "job-0";
    m.step = step;
    m.data_position = step;
    m.num_stages = 2;
    m.schedule = "GPipe";
    for (int s = 0; s < 2; ++s) {
      ManifestStage& st = m.stages.emplace_back();
      st.stage = s;
      st.first_layer = s == 0 ? 0 : split;
      st.end_layer = s == 0 ? split : 4;
      for (int l = st.first_layer; l < st.end_layer; ++l) st.layers.push_back(absl::StrCat(l));
      st.files = WriteStageFiles(dir_, step, s);
    }
    const std::string step_dir = CheckpointStepDirectory(dir_, step);
    EXPECT_TRUE(WriteManifest(step_dir, m).ok());
    return step_dir;
  }

  absl::Status StepWithFiles(const std::string& job, const std::string& worker, int rank, int step,
                             int64_t global_step, const std::vector<v1::StageCheckpointFile>& files,
                             bool checkpoint_only = false) {
    v1::ReportStepRequest r;
    r.set_checkpoint_only(checkpoint_only);
    r.set_worker_id(worker);
    r.set_job_id(job);
    r.set_attempt(1);
    r.set_rank(rank);
    r.set_step(step);
    r.set_global_step(global_step);
    if (rank == 1 && !checkpoint_only) {
      for (int i = 0; i < 4; ++i) r.add_microbatch_losses(1.0);
    }
    for (const auto& f : files) *r.add_checkpoint_files() = f;
    return manager_->ReportStep(r);
  }

  stagecoach::testing::TempDir tmp_{"job_manager_checkpoint"};
  const std::string dir_ = tmp_.path();
};

TEST_F(JobManagerCheckpointTest, ManifestIsWrittenLastWhenEveryStageFileHasArrived) {
  const std::string w1 = Register(1), w2 = Register(2);
  auto id = manager_->SubmitJob(CheckpointSpec(dir_), "spec.yaml");
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE(Eventually([&] { return State(*id) == v1::JOB_STATE_RUNNING; }));
  const auto files0 = WriteStageFiles(dir_, 1, 0);
  const auto files1 = WriteStageFiles(dir_, 1, 1);
  const std::string step_dir = CheckpointStepDirectory(dir_, 1);

  // Reports that do not fit are refused whole: a wrong global step, another rank's stage.
  EXPECT_TRUE(absl::IsInvalidArgument(StepWithFiles(*id, w1, 0, 0, 5, files0)));
  EXPECT_TRUE(absl::IsInvalidArgument(StepWithFiles(*id, w1, 0, 0, 1, files1)));
  EXPECT_EQ(Job(*id).ranks(0).steps_done(), 0);

  ASSERT_TRUE(StepWithFiles(*id, w1, 0, 0, 1, files0).ok());
  EXPECT_FALSE(std::filesystem::exists(ManifestPath(step_dir))) << "stage 1 has not reported";
  EXPECT_EQ(Job(*id).checkpoints_size(), 0);

  ASSERT_TRUE(StepWithFiles(*id, w2, 1, 0, 1, files1).ok());
  ASSERT_EQ(Job(*id).checkpoints_size(), 1);
  const v1::JobCheckpoint c = Job(*id).checkpoints(0);
  EXPECT_EQ(c.step(), 1);
  EXPECT_EQ(c.directory(), step_dir);
  EXPECT_EQ(c.manifest(), step_dir + "/manifest.json");
  auto m = VerifyCheckpoint(step_dir);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->job_id, *id);
  EXPECT_EQ(m->step, 1);
  EXPECT_EQ(m->data_position, 1);
  EXPECT_EQ(m->num_stages, 2);
  EXPECT_EQ(m->schedule, "GPipe");
  EXPECT_THAT(m->model_json, HasSubstr("\"family\":\"mlp\""));
  EXPECT_EQ(m->stages[1].first_layer, 2);
  EXPECT_EQ(m->stages[1].end_layer, 4);
  EXPECT_THAT(m->stages[1].layers, ElementsAre("2", "3"));
  ASSERT_EQ(m->stages[0].files.size(), 2u);
  EXPECT_EQ(m->stages[0].files[1].sha256(), files0[1].sha256());
}

// An asynchronous checkpoint's files come in a checkpoint_only report of the step they hold,
// after the ranks went on: the manifest is written once both ranks' files are in. A
// checkpoint_only report of a step the rank has not done is refused.
TEST_F(JobManagerCheckpointTest, FilesReportedAfterLaterStepsCompleteTheirCheckpoint) {
  const std::string w1 = Register(1), w2 = Register(2);
  auto id = manager_->SubmitJob(CheckpointSpec(dir_, "", 2, "GPipe", 5), "spec.yaml");
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE(Eventually([&] { return State(*id) == v1::JOB_STATE_RUNNING; }));
  for (int step = 0; step < 3; ++step) {
    ASSERT_TRUE(StepWithFiles(*id, w1, 0, step, step + 1, {}).ok());
    ASSERT_TRUE(StepWithFiles(*id, w2, 1, step, step + 1, {}).ok());
  }
  auto only = [&](const std::string& worker, int rank, int step,
                  const std::vector<v1::StageCheckpointFile>& files) {
    return StepWithFiles(*id, worker, rank, step, step + 1, files, /*checkpoint_only=*/true);
  };
  const auto files0 = WriteStageFiles(dir_, 2, 0);
  const auto files1 = WriteStageFiles(dir_, 2, 1);
  const absl::Status ahead = only(w1, 0, 3, files0);
  EXPECT_TRUE(absl::IsInvalidArgument(ahead)) << ahead;
  EXPECT_THAT(std::string(ahead.message()), HasSubstr("must report its files at a step it did"));
  // Step 1 (global step 2), reported after step 2.
  ASSERT_TRUE(only(w1, 0, 1, files0).ok());
  EXPECT_EQ(Job(*id).checkpoints_size(), 0) << "stage 1's files are not in yet";
  ASSERT_TRUE(only(w2, 1, 1, files1).ok());
  ASSERT_EQ(Job(*id).checkpoints_size(), 1);
  EXPECT_EQ(Job(*id).checkpoints(0).step(), 2);
  EXPECT_TRUE(VerifyCheckpoint(CheckpointStepDirectory(dir_, 2)).ok());
  EXPECT_EQ(Job(*id).global_steps_done(), 3);
}

TEST_F(JobManagerCheckpointTest, CheckpointWithAMissingFileGetsNoManifest) {
  const std::string w1 = Register(1), w2 = Register(2);
  auto id = manager_->SubmitJob(CheckpointSpec(dir_), "spec.yaml");
  ASSERT_TRUE(Eventually([&] { return State(*id) == v1::JOB_STATE_RUNNING; }));
  const auto files0 = WriteStageFiles(dir_, 1, 0);
  const auto files1 = WriteStageFiles(dir_, 1, 1);
  std::filesystem::remove(CheckpointStepDirectory(dir_, 1) + "/stage-1.state_dict.pt");
  ASSERT_TRUE(StepWithFiles(*id, w1, 0, 0, 1, files0).ok());
  ASSERT_TRUE(StepWithFiles(*id, w2, 1, 0, 1, files1).ok());
  EXPECT_EQ(Job(*id).steps_done(), 1) << "the step itself counts";
  EXPECT_EQ(Job(*id).checkpoints_size(), 0);
  EXPECT_FALSE(std::filesystem::exists(ManifestPath(CheckpointStepDirectory(dir_, 1))));
}

TEST_F(JobManagerCheckpointTest, ResumeGivesEveryRankItsStagesFilesAndContinuesTheSteps) {
  const std::string from = WriteCheckpoint(7);
  const std::string w1 = Register(1), w2 = Register(2);
  // Another schedule than the checkpoint's: only the stages must match.
  auto id = manager_->SubmitJob(CheckpointSpec(dir_, from, 2, "1F1B"), "spec.yaml");
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE(Eventually([&] { return State(*id) == v1::JOB_STATE_RUNNING; }));
  EXPECT_EQ(Job(*id).resumed_from().step(), 7);
  EXPECT_EQ(Job(*id).resumed_from().directory(), from);
  EXPECT_EQ(Job(*id).resumed_from().manifest(), from + "/manifest.json");
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_EQ(workers_.Started(Address(rank + 1)).size(), 1u);
    const v1::ResumeTask resume = workers_.Started(Address(rank + 1))[0].resume();
    EXPECT_EQ(resume.directory(), from);
    EXPECT_EQ(resume.step(), 7);
    ASSERT_EQ(resume.files_size(), 2) << "rank " << rank;
    EXPECT_EQ(resume.files(0).stage(), rank);
    EXPECT_EQ(resume.files(0).file(), absl::StrCat("stage-", rank, ".pt"));
    EXPECT_EQ(resume.files(1).file(), absl::StrCat("stage-", rank, ".state_dict.pt"));
  }
  // Global steps continue from 7: the first step brings the timeline to 8.
  EXPECT_TRUE(absl::IsInvalidArgument(StepWithFiles(*id, w1, 0, 0, 1, {})));
  const auto files0 = WriteStageFiles(dir_, 8, 0);
  const auto files1 = WriteStageFiles(dir_, 8, 1);
  ASSERT_TRUE(StepWithFiles(*id, w1, 0, 0, 8, files0).ok());
  ASSERT_TRUE(StepWithFiles(*id, w2, 1, 0, 8, files1).ok());
  ASSERT_EQ(Job(*id).checkpoints_size(), 1);
  EXPECT_EQ(Job(*id).checkpoints(0).step(), 8);
  EXPECT_EQ(Job(*id).checkpoints(0).directory(), CheckpointStepDirectory(dir_, 8));
}

TEST_F(JobManagerCheckpointTest, AJobThatWouldOverwriteACheckpointIsRefusedAtSubmit) {
  Register(1);
  Register(2);
  // A three-step job writes step-000003 at its end: another job's checkpoint is already there.
  const std::string existing = WriteCheckpoint(3);
  auto refused = manager_->SubmitJob(CheckpointSpec(dir_), "spec.yaml");
  ASSERT_TRUE(absl::IsInvalidArgument(refused.status())) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr(absl::StrCat("training.checkpoint.dir: ", existing, " already exists")));
  EXPECT_TRUE(manager_->ListJobs().empty());
  // A longer job does not write step 3 (no every_steps): it runs.
  EXPECT_TRUE(manager_->SubmitJob(CheckpointSpec(dir_, "", 2, "GPipe", 4), "spec.yaml").ok());
}

TEST_F(JobManagerCheckpointTest, ResumeFromAPartialOrCorruptCheckpointIsRefused) {
  // No manifest.
  WriteStageFiles(dir_, 3, 0);
  WriteStageFiles(dir_, 3, 1);
  auto partial = manager_->SubmitJob(CheckpointSpec(dir_, CheckpointStepDirectory(dir_, 3)), "s");
  EXPECT_TRUE(absl::IsInvalidArgument(partial.status()));
  EXPECT_EQ(partial.status().message(),
            absl::StrCat("training.resume_from: partial checkpoint: ",
                         CheckpointStepDirectory(dir_, 3), " has no manifest.json"));
  // A file changed after the manifest was written.
  const std::string from = WriteCheckpoint(5);
  {
    std::fstream f(from + "/stage-1.pt", std::ios::in | std::ios::out | std::ios::binary);
    f.put('X');
  }
  auto corrupt = manager_->SubmitJob(CheckpointSpec(dir_, from), "s");
  EXPECT_TRUE(absl::IsInvalidArgument(corrupt.status()));
  EXPECT_THAT(std::string(corrupt.status().message()),
              HasSubstr("training.resume_from: checkpoint "));
  EXPECT_THAT(std::string(corrupt.status().message()), HasSubstr("stage-1.pt has sha256"));
  // A directory that is not there.
  auto missing = manager_->SubmitJob(CheckpointSpec(dir_, dir_ + "/step-000099"), "s");
  EXPECT_TRUE(absl::IsInvalidArgument(missing.status()));
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("step-000099"));
  EXPECT_TRUE(manager_->ListJobs().empty());
}

// A checkpoint resumes on another layout: each stage reads, by name, every checkpoint stage that
// holds one of its layers (resume_layout.h). A model with a layer the checkpoint lacks is refused
// naming it.
TEST_F(JobManagerCheckpointTest, ResumeOnAnotherStageLayoutReadsTheOverlappingStagesByName) {
  const std::string from = WriteCheckpoint(5);
  auto four = manager_->SubmitJob(CheckpointSpec(dir_ + "/four", from, 4), "s");
  ASSERT_TRUE(four.ok()) << four.status();
  for (int w = 1; w <= 4; ++w) Register(w);
  ASSERT_TRUE(Eventually([&] { return workers_.Started(Address(4)).size() == 1; }));
  // Stage s of four holds layer s: stages 0 and 1 read checkpoint stage 0, 2 and 3 stage 1.
  for (int w = 1; w <= 4; ++w) {
    const v1::TaskAssignment task = workers_.Started(Address(w))[0];
    ASSERT_TRUE(task.has_resume()) << "rank " << task.rank();
    EXPECT_TRUE(task.resume().by_name());
    EXPECT_EQ(task.resume().step(), 5);
    ASSERT_EQ(task.resume().files_size(), 1) << "rank " << task.rank();
    EXPECT_EQ(task.resume().files(0).file(), task.rank() < 2 ? "stage-0.pt" : "stage-1.pt");
  }
  // Another model: a fifth layer that no checkpoint stage holds.
  const std::string other =
      absl::StrCat("name: t\nmodel: {builtin: {family: mlp, sizes: [4, 8, 8, 8, 8, 2]}}\n",
                   "split: {stages: 2}\nschedule: {kind: GPipe, microbatches: 4}\n",
                   "training: {batch_size: 8, steps: 3, resume_from: ", from, "}\n");
  auto refused = manager_->SubmitJob(other, "s");
  ASSERT_TRUE(absl::IsInvalidArgument(refused.status())) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("training.resume_from: layer '4' of this job's model (stage 1) is in no "
                        "stage of checkpoint " +
                        from));
}

// A spec that leaves the split to its default resumes on the stages its checkpoint was written
// with (here [0, 1) and [1, 4), which no policy would choose for this model), and says so.
TEST_F(JobManagerCheckpointTest, ResumeWithTheDefaultSplitTakesTheCheckpointsPartition) {
  const std::string from = WriteCheckpoint(5, /*split=*/1);
  auto id = manager_->SubmitJob(CheckpointSpec(dir_ + "/next", from), "s");
  ASSERT_TRUE(id.ok()) << id.status();
  auto job = manager_->GetJob(*id);
  ASSERT_TRUE(job.ok());
  ASSERT_EQ(job->stages_size(), 2);
  EXPECT_EQ(job->stages(0).end_layer(), 1);
  EXPECT_EQ(job->split(), "recorded (default: the partition of the checkpoint it resumes)");
}

TEST_F(JobManagerCheckpointTest, CheckpointOnDemandAsksEveryRankForTheNextStep) {
  // Refused for a job that is not running, and for one without a checkpoint directory.
  auto pending = manager_->SubmitJob(CheckpointSpec(dir_, "", 2, "GPipe", 10), "spec.yaml");
  ASSERT_TRUE(pending.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(manager_->CheckpointJob(*pending).status()));
  EXPECT_TRUE(absl::IsNotFound(manager_->CheckpointJob("job-99").status()));
  const std::string w1 = Register(1), w2 = Register(2);
  ASSERT_TRUE(Eventually([&] { return State(*pending) == v1::JOB_STATE_RUNNING; }));

  // Rank 0 finished step 0; step 1 is the earliest no rank has finished: after it the timeline
  // holds 2 steps.
  ASSERT_TRUE(StepWithFiles(*pending, w1, 0, 0, 1, {}).ok());
  auto asked = manager_->CheckpointJob(*pending);
  ASSERT_TRUE(asked.ok()) << asked.status();
  EXPECT_EQ(asked->step(), 2);
  EXPECT_EQ(asked->directory(), CheckpointStepDirectory(dir_, 2));
  for (int n : {1, 2}) {
    EXPECT_THAT(workers_.CheckpointRequests(Address(n)),
                ElementsAre(std::make_pair(*pending, int64_t{2})));
  }

  // A worker that has already passed the step: the next one is asked for.
  workers_.SetCheckpointAnswer(Address(2), [](int64_t step) {
    return step <= 2 ? absl::FailedPreconditionError("task has passed that step")
                     : absl::OkStatus();
  });
  asked = manager_->CheckpointJob(*pending);
  ASSERT_TRUE(asked.ok()) << asked.status();
  EXPECT_EQ(asked->step(), 3);
  EXPECT_EQ(workers_.CheckpointRequests(Address(2)).back().second, 3);

  // Another error is passed on naming the rank.
  workers_.SetCheckpointAnswer(Address(2), [](int64_t) { return absl::InternalError("disk"); });
  asked = manager_->CheckpointJob(*pending);
  EXPECT_TRUE(absl::IsInternal(asked.status()));
  EXPECT_THAT(std::string(asked.status().message()), HasSubstr("rank 1: disk"));

  // Workers that keep passing the step asked for: given up after a few tries.
  workers_.SetCheckpointAnswer(Address(2), [](int64_t) {
    return absl::FailedPreconditionError("task has passed that step");
  });
  asked = manager_->CheckpointJob(*pending);
  EXPECT_TRUE(absl::IsAborted(asked.status())) << asked.status();
}

TEST_F(JobManagerCheckpointTest, CheckpointOnDemandAtTheEndIsTheFinalCheckpoint) {
  const std::string w1 = Register(1), w2 = Register(2);
  auto id = manager_->SubmitJob(CheckpointSpec(dir_, "", 2, "GPipe", 2), "spec.yaml");
  ASSERT_TRUE(Eventually([&] { return State(*id) == v1::JOB_STATE_RUNNING; }));
  ASSERT_TRUE(StepWithFiles(*id, w1, 0, 0, 1, {}).ok());
  ASSERT_TRUE(StepWithFiles(*id, w1, 0, 1, 2, {}).ok());
  // Rank 0 has done both steps: the end-of-job checkpoint (step 2) is the one; nobody is asked.
  auto asked = manager_->CheckpointJob(*id);
  ASSERT_TRUE(asked.ok()) << asked.status();
  EXPECT_EQ(asked->step(), 2);
  EXPECT_EQ(asked->directory(), CheckpointStepDirectory(dir_, 2));
  EXPECT_TRUE(workers_.CheckpointRequests(Address(1)).empty());
}

TEST_F(JobManagerCheckpointTest, CheckpointOnDemandNeedsACheckpointDirectory) {
  Register(1);
  Register(2);
  auto id = manager_->SubmitJob(CheckpointSpec(""), "spec.yaml");
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE(Eventually([&] { return State(*id) == v1::JOB_STATE_RUNNING; }));
  auto asked = manager_->CheckpointJob(*id);
  EXPECT_TRUE(absl::IsFailedPrecondition(asked.status()));
  EXPECT_THAT(std::string(asked.status().message()), HasSubstr("training.checkpoint.dir"));
}

}  // namespace
}  // namespace stagecoach::coordinator::job_manager_checkpoint_test
