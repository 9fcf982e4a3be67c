// JobManager planning from a worker's InspectModel, with fake workers: TorchScript models are
// planned from the layers a live worker reports, split.policy profiled from its measured times;
// split points are checked against those layers; no worker, a worker that refuses the model and
// a worker that does not answer are errors and nothing is queued.
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/spec/hf_model_spec.h"
#include "coordinator/job_manager.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/coordinator_test_fakes.h"

namespace stagecoach::coordinator::job_manager_inspect_test {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A TorchScript model's spec trained on a tensors file.
std::string TorchScriptSpec(const std::string& split) {
  return absl::StrCat("name: ts\nmodel: {torchscript: /models/net.pt}\nsplit: ", split,
                      "\nschedule: {kind: GPipe, microbatches: 2}\n",
                      "training: {batch_size: 4, steps: 2}\n",
                      "data: {kind: tensors, path: /data/train.pt}\n");
}

// Layers named `names`, parameters 100, 200, ..., forward times `forward` (seconds, backward
// twice as long) when given.
v1::InspectModelResponse Inspection(const std::vector<std::string>& names,
                                    const std::vector<double>& forward = {}) {
  v1::InspectModelResponse out;
  for (size_t i = 0; i < names.size(); ++i) {
    v1::LayerInfo* layer = out.add_layers();
    layer->set_name(names[i]);
    layer->set_parameters(100 * static_cast<int64_t>(i + 1));
    if (i < forward.size()) {
      layer->set_forward_seconds(forward[i]);
      layer->set_backward_seconds(2 * forward[i]);
    }
  }
  out.set_sequential(true);
  out.set_model_sha256(std::string(64, 'a'));
  return out;
}

std::vector<std::pair<int, int>> Ranges(const v1::Job& job) {
  std::vector<std::pair<int, int>> out;
  for (const auto& s : job.stages()) out.emplace_back(s.first_layer(), s.end_layer());
  return out;
}

using JobManagerInspectTest = JobManagerFixture;

TEST_F(JobManagerInspectTest, TorchScriptModelIsPlannedFromTheLayersAWorkerReports) {
  Register(1);
  workers_.SetInspection(Inspection({"embed", "blocks.0", "blocks.1", "head"}));
  const std::string spec = TorchScriptSpec("{stages: 2, policy: equal-params}");
  auto id = manager_->SubmitJob(spec, "ts.yaml");
  ASSERT_TRUE(id.ok()) << id.status();

  // The worker was asked for the layers of the submitted spec, without profiling.
  const auto requests = workers_.Inspected(Address(1));
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].spec_yaml(), spec);
  EXPECT_FALSE(requests[0].profile());

  // Parameters 100 200 300 400: embed blocks.0 blocks.1 | head.
  auto job = manager_->GetJob(*id);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->layers_size(), 4);
  EXPECT_EQ(job->layers(1).name(), "blocks.0");
  EXPECT_EQ(job->layers(3).parameters(), 400);
  EXPECT_THAT(Ranges(*job), ElementsAre(std::pair(0, 3), std::pair(3, 4)));
  EXPECT_EQ(job->stages(0).parameters(), 600);
  EXPECT_EQ(job->stages(1).parameters(), 400);

  // Placed: every rank learns the layer names the plan was made from and its stage's share.
  Register(2);
  ASSERT_TRUE(Eventually([&] { return workers_.Started(Address(2)).size() == 1; }));
  const v1::TaskAssignment task = workers_.Started(Address(2))[0];
  EXPECT_THAT(task.layer_names(), ElementsAre("embed", "blocks.0", "blocks.1", "head"));
  ASSERT_EQ(task.stages_size(), 1);
  EXPECT_EQ(task.stages(0).first_layer(), 3);
  EXPECT_EQ(task.stages(0).parameters(), 400);
}

TEST_F(JobManagerInspectTest, SplitPointsAreCheckedAgainstTheInspectedLayers) {
  Register(1);
  workers_.SetInspection(Inspection({"embed", "blocks.0", "blocks.1", "head"}));
  auto planned = manager_->SubmitJob(TorchScriptSpec("{points: {\"blocks.1\": beginning}}"), "t");
  ASSERT_TRUE(planned.ok()) << planned.status();
  EXPECT_THAT(Ranges(*manager_->GetJob(*planned)), ElementsAre(std::pair(0, 2), std::pair(2, 4)));

  auto unknown = manager_->SubmitJob(TorchScriptSpec("{points: {\"layers.1\": beginning}}"), "t");
  ASSERT_FALSE(unknown.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(unknown.status()));
  EXPECT_THAT(std::string(unknown.status().message()),
              HasSubstr("split.points.layers.1: 'layers.1' is not a layer of the model (its 4 "
                        "layers: embed, blocks.0, blocks.1, head)"));
  EXPECT_EQ(manager_->ListJobs().size(), 1u) << "a refused spec queues nothing";
}

TEST_F(JobManagerInspectTest, NoLiveWorkerToInspectIsAnErrorAndQueuesNothing) {
  auto refused = manager_->SubmitJob(TorchScriptSpec("{stages: 2}"), "t");
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(refused.status())) << refused.status();
  EXPECT_EQ(refused.status().message(),
            "no live worker to inspect model.torchscript; start a worker first");
  EXPECT_TRUE(manager_->ListJobs().empty());

  // A lost worker does not count.
  Register(1);
  clock_.Advance(absl::Seconds(6));  // past the 5 s lease
  manager_->Tick();
  refused = manager_->SubmitJob(TorchScriptSpec("{stages: 2}"), "t");
  EXPECT_TRUE(absl::IsFailedPrecondition(refused.status())) << refused.status();
  EXPECT_TRUE(workers_.Inspected(Address(1)).empty());

  // A built-in model needs no worker to be planned.
  auto builtin = manager_->SubmitJob(
      "name: b\nmodel: {builtin: {family: mlp, sizes: [4, 8, 2]}}\nsplit: {stages: 2}\n"
      "schedule: {kind: GPipe, microbatches: 2}\ntraining: {batch_size: 4}\n",
      "b");
  EXPECT_TRUE(builtin.ok()) << builtin.status();
}

TEST_F(JobManagerInspectTest, WorkerErrorsComeBackWithTheWorkersMessage) {
  Register(1);
  workers_.SetInspection(absl::InvalidArgumentError(
      "model.torchscript: '/models/net.pt' is not a TorchScript archive"));
  auto refused = manager_->SubmitJob(TorchScriptSpec("{stages: 2}"), "t");
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(refused.status()));
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("model.torchscript: '/models/net.pt' is not a TorchScript archive"));
  EXPECT_TRUE(manager_->ListJobs().empty());

  // Unreachable: not UNAVAILABLE, which a client reads as the coordinator being unreachable.
  workers_.SetUnreachable(Address(1));
  auto unreachable = manager_->SubmitJob(TorchScriptSpec("{stages: 2}"), "t");
  ASSERT_FALSE(unreachable.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(unreachable.status())) << unreachable.status();
  EXPECT_THAT(std::string(unreachable.status().message()),
              HasSubstr(absl::StrCat("could not inspect model.torchscript: no live worker could "
                                     "be reached (w-1 at ",
                                     Address(1), ": ")));
  EXPECT_TRUE(manager_->ListJobs().empty());
}

TEST_F(JobManagerInspectTest, AnUnreachableWorkerIsPassedOverForTheNextLiveOne) {
  Register(2);
  workers_.SetInspection(Inspection({"0", "1", "2", "3"}, {0.001, 0.001, 0.001, 0.001}));
  workers_.SetUnreachable(Address(1));  // died; its heartbeats have not yet run out
  auto id = manager_->SubmitJob(TorchScriptSpec("{stages: 2}"), "t");
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(workers_.Inspected(Address(2)).size(), 1u);
}

TEST_F(JobManagerInspectTest, ProfiledPolicyBalancesTheTimesTheWorkerMeasured) {
  Register(1);
  // An MLP of four layers: parameters would cut 0 1 | 2 3, the times (layer 0 slow) 0 | 1 2 3.
  v1::InspectModelResponse inspection =
      Inspection({"0", "1", "2", "3"}, {0.009, 0.001, 0.001, 0.001});
  workers_.SetInspection(inspection);
  auto id = manager_->SubmitJob(
      "name: p\nmodel: {builtin: {family: mlp, sizes: [4, 8, 8, 8, 2]}}\n"
      "split: {stages: 2, policy: profiled}\nschedule: {kind: GPipe, microbatches: 2}\n"
      "training: {batch_size: 4}\n",
      "p");
  ASSERT_TRUE(id.ok()) << id.status();
  const auto requests = workers_.Inspected(Address(1));
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_TRUE(requests[0].profile());
  auto job = manager_->GetJob(*id);
  ASSERT_TRUE(job.ok());
  EXPECT_THAT(Ranges(*job), ElementsAre(std::pair(0, 1), std::pair(1, 4)));
  EXPECT_DOUBLE_EQ(job->layers(0).forward_seconds(), 0.009);
  EXPECT_DOUBLE_EQ(job->layers(0).backward_seconds(), 0.018);

  // A worker that reports no times cannot serve a profiled plan.
  workers_.SetInspection(Inspection({"0", "1", "2", "3"}));
  auto unmeasured = manager_->SubmitJob(
      "name: p\nmodel: {builtin: {family: mlp, sizes: [4, 8, 8, 8, 2]}}\n"
      "split: {stages: 2, policy: profiled}\nschedule: {kind: GPipe, microbatches: 2}\n"
      "training: {batch_size: 4}\n",
      "p");
  ASSERT_FALSE(unmeasured.ok());
  EXPECT_THAT(std::string(unmeasured.status().message()),
              HasSubstr("split.policy: 'profiled' needs each layer's measured forward and "
                        "backward time"));
}

// A GPT on two workers under ZBVZeroBubble whose spec leaves the split to its default.
std::string DefaultSplitGpt(int d_model) {
  return absl::StrCat("name: g\nmodel: {builtin: {family: gpt, vocab: 64, d_model: ", d_model,
                      ", layers: 4, heads: 4, seq: 16}}\nsplit: {stages: 4}\n",
                      "schedule: {kind: ZBVZeroBubble, microbatches: 4}\n",
                      "placement: {workers: 2}\ntraining: {batch_size: 8, loss: cross_entropy}\n");
}

// The GPT's seven layers, measured: embed 1 ms, each block 4 ms, norm 0.1 ms, head 3 ms
// forward (backward twice as long).
v1::InspectModelResponse GptProfile() {
  return Inspection({"embed", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "norm", "head"},
                    {0.001, 0.004, 0.004, 0.004, 0.004, 0.0001, 0.003});
}

TEST_F(JobManagerInspectTest, TheDefaultSplitProfilesACheapModelAndBalancesItsRanks) {
  Register(1);
  Register(2);
  workers_.SetInspection(GptProfile());
  auto id = manager_->SubmitJob(DefaultSplitGpt(32), "g");
  ASSERT_TRUE(id.ok()) << id.status();
  std::vector<v1::InspectModelRequest> asked = workers_.Inspected(Address(1));
  asked.insert(asked.end(), workers_.Inspected(Address(2)).begin(),
               workers_.Inspected(Address(2)).end());
  ASSERT_EQ(asked.size(), 1u);
  EXPECT_TRUE(asked[0].profile());
  auto job = manager_->GetJob(*id);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->split(), "profiled (default: profiling the model was cheap)");
  // Rank 0 holds stages 0 and 3, rank 1 stages 1 and 2 (the V). By forward + backward a block
  // costs 12 ms, and the embedding, norm and head 12.3 ms together: a rank takes three blocks
  // (36 ms), the other one block and the rest (24.3 ms), the most even split the layers allow;
  // balancing the stages instead (embed b0 | b1 | b2 | b3 norm head) gives rank 0 36.3 ms. Of
  // the splits with rank totals of 36 ms, the one whose largest stage is smallest (two blocks,
  // 24 ms), its boundaries first: embed | b0 | b1 b2 | b3 norm head.
  EXPECT_THAT(Ranges(*job), ElementsAre(std::pair(0, 1), std::pair(1, 2), std::pair(2, 4),
                                        std::pair(4, 7)));
  ASSERT_EQ(job->balance_size(), 2);
  EXPECT_TRUE(job->predicted_compute_in_seconds());
  EXPECT_GT(job->balance(1).predicted_compute(), job->balance(0).predicted_compute());
}

TEST_F(JobManagerInspectTest, TheDefaultSplitIsByParametersWhenProfilingIsNotCheapOrFails) {
  Register(1);
  Register(2);
  // Too large to profile by default: not asked at all.
  workers_.SetInspection(GptProfile());
  auto large = manager_->SubmitJob(DefaultSplitGpt(2048), "g");
  ASSERT_TRUE(large.ok()) << large.status();
  EXPECT_TRUE(workers_.Inspected(Address(1)).empty());
  EXPECT_TRUE(workers_.Inspected(Address(2)).empty());
  auto job = manager_->GetJob(*large);
  ASSERT_TRUE(job.ok());
  EXPECT_THAT(job->split(), ::testing::StartsWith("equal-params (default: profiling the model "
                                                "would take about "));
  EXPECT_FALSE(job->predicted_compute_in_seconds());
  ASSERT_TRUE(manager_->CancelJob(*large, "test").ok());

  // A worker that cannot profile it: split by parameters all the same, and the job admitted.
  workers_.SetInspection(absl::InternalError("out of memory"));
  auto failed = manager_->SubmitJob(DefaultSplitGpt(32), "g");
  ASSERT_TRUE(failed.ok()) << failed.status();
  job = manager_->GetJob(*failed);
  ASSERT_TRUE(job.ok());
  EXPECT_THAT(job->split(), ::testing::StartsWith("equal-params (default: profiling the model "
                                                "failed: "));
  EXPECT_THAT(job->split(), HasSubstr("out of memory"));
}

TEST_F(JobManagerInspectTest, TheDefaultSplitNeedsNoWorkerAndNoProfileForOneStage) {
  auto id = manager_->SubmitJob(DefaultSplitGpt(32), "g");
  ASSERT_TRUE(id.ok()) << id.status();  // queued until workers come
  auto job = manager_->GetJob(*id);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->split(), "equal-params (default: no live worker to profile the model)");

  Register(1);
  auto one = manager_->SubmitJob(
      "name: o\nmodel: {builtin: {family: mlp, sizes: [4, 8, 2]}}\nsplit: {stages: 1}\n"
      "schedule: {kind: GPipe, microbatches: 2}\ntraining: {batch_size: 4}\n",
      "o");
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_TRUE(workers_.Inspected(Address(1)).empty());
  job = manager_->GetJob(*one);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->split(), "equal-params (default: one stage or one worker: no ranks to balance)");
}

TEST_F(JobManagerInspectTest, AnIdleWorkerIsAskedBeforeABusyOne) {
  Register(1);
  Register(2);
  // A one-stage job keeps worker 1 busy.
  auto busy = manager_->SubmitJob(
      "name: b\nmodel: {builtin: {family: mlp, sizes: [4, 8, 2]}}\nsplit: {stages: 1}\n"
      "schedule: {kind: GPipe, microbatches: 2}\ntraining: {batch_size: 4, steps: 100}\n",
      "b");
  ASSERT_TRUE(busy.ok()) << busy.status();
  ASSERT_TRUE(Eventually([&] { return workers_.Started(Address(1)).size() == 1; }));
  workers_.SetInspection(Inspection({"a", "b"}));
  ASSERT_TRUE(manager_->SubmitJob(TorchScriptSpec("{stages: 2}"), "t").ok());
  EXPECT_TRUE(workers_.Inspected(Address(1)).empty());
  EXPECT_EQ(workers_.Inspected(Address(2)).size(), 1u);
}

TEST_F(JobManagerInspectTest, InferPlansATorchScriptModelWithoutItsDataSection) {
  Register(1);
  workers_.SetInspection(Inspection({"a", "b"}));
  v1::TensorData inputs;
  inputs.set_dtype("float32");
  inputs.add_shape(2);
  inputs.add_shape(1);
  inputs.set_data(std::string(8, '\0'));
  // Two stages, one worker: the job is queued, then the call times out and cancels it.
  absl::StatusOr<InferenceResult> result = absl::UnknownError("not called");
  std::thread call([&] {
    result = manager_->Infer(TorchScriptSpec("{stages: 2}"), "t", inputs, absl::Milliseconds(50));
  });
  // The call's deadline is on the manager's clock: it passes once the job is queued.
  ASSERT_TRUE(Eventually([&] { return manager_->ListJobs().size() == 1; }));
  clock_.Advance(absl::Milliseconds(50));
  call.join();
  EXPECT_TRUE(absl::IsDeadlineExceeded(result.status())) << result.status();
  const auto requests = workers_.Inspected(Address(1));
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_THAT(requests[0].spec_yaml(), HasSubstr("ForwardOnly"));
  ASSERT_EQ(manager_->ListJobs().size(), 1u);
  EXPECT_EQ(manager_->ListJobs()[0].num_stages(), 2);
}

// `stagectl inspect`: the model is loaded by a live worker, without profiling, from a spec that
// names it (a path with YAML's special characters survives); the worker's candidates come back
// with its id; nothing is queued. Without a worker: FAILED_PRECONDITION.
TEST_F(JobManagerInspectTest, DescribeModelAsksAWorkerAndQueuesNothing) {
  EXPECT_TRUE(absl::IsFailedPrecondition(manager_->DescribeModel("/m/net.pt", "").status()));
  Register(1);
  v1::InspectModelResponse inspection = Inspection({"stem", "encoder.layers.0", "head"});
  v1::SplitCandidate* c = inspection.add_split_candidates();
  c->set_name("encoder");
  c->set_parameters(200);
  workers_.SetInspection(inspection);
  const std::string path = "/models/a: b, {c}.pt";
  auto described = manager_->DescribeModel(path, "cpu");
  ASSERT_TRUE(described.ok()) << described.status();
  EXPECT_EQ(described->layers_size(), 3);
  ASSERT_EQ(described->split_candidates_size(), 1);
  EXPECT_EQ(described->split_candidates(0).name(), "encoder");
  EXPECT_EQ(described->inspected_by(), manager_->ListWorkers()[0].id());
  EXPECT_EQ(described->model_sha256(), std::string(64, 'a'));
  const auto requests = workers_.Inspected(Address(1));
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_FALSE(requests[0].profile());
  auto spec = spec::ReadJobSpec(requests[0].spec_yaml(), "sent");
  ASSERT_TRUE(spec.ok()) << spec.status() << "\n" << requests[0].spec_yaml();
  EXPECT_EQ(spec->model.torchscript.value_or(""), path);
  EXPECT_EQ(spec->placement.device, "cpu");
  EXPECT_TRUE(manager_->ListJobs().empty());
}

}  // namespace
}  // namespace stagecoach::coordinator::job_manager_inspect_test
