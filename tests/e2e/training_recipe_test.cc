// The training recipe (docs/training-recipe.md) across real processes: a coordinator and workers
// on loopback train an MLP with a learning-rate schedule, global gradient clipping, skipped
// non-finite steps and validation passes, and every step's loss, learning rate, gradient norm,
// skip and eval loss, and every stage's final parameters, equal the single-process reference
// (tests/support/reference_mlp.h: torch's own clip_grad_norm_, the schedule written from its
// definition) within rtol 1e-5 + atol 1e-6.
//   - lr: cosine with warmup over 20 steps; linear with warmup, resumed from a mid-run checkpoint,
//     gives the straight run's losses and learning rates.
//   - clipping on 1F1B, ZBVZeroBubble and DualPipeV with max_norm at the reference's median
//     norm (some steps clip, some do not), where clipping each rank's layers by their own norm
//     would give other parameters; and on 2 ZeRO-sharded replicas.
//   - a NaN row in a tensors file: the steps that read it are skipped on every rank (the job's
//     loss NaN, the event naming the ranks), the parameters after a skipped step are those
//     before it, and the steps after it go on; a file of NaN only fails the job after
//     training.max_skipped_steps steps in a row, naming them.
//   - eval passes every 2 steps equal the reference's forward on the held-out batches.
#include <torch/serialize.h>
#include <torch/torch.h>

#include <cmath>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/support/job_predicates.h"
#include "tests/support/local_cluster.h"
#include "tests/support/reference_mlp.h"
#include "tests/support/stage_files.h"

namespace stagecoach::testing::training_recipe_test {
namespace {

using ::testing::HasSubstr;

constexpr double kRtol = 1e-5;
constexpr double kAtol = 1e-6;

bool Near(double got, double want) { return std::abs(got - want) <= kAtol + kRtol * std::abs(want); }

// What a step_completed event of `stagectl watch -o json` says about the recipe.
struct StepEvent {
  std::optional<double> loss;
  double lr = 0;
  std::optional<double> grad_norm;
  bool skipped = false;
  std::vector<int> nonfinite_ranks;
  std::optional<double> eval_loss;
};

std::vector<StepEvent> StepEvents(LocalCluster& cluster, const std::string& job_id) {
  CommandResult watch = cluster.Stagectl({"watch", job_id, "-o", "json"});
  std::vector<StepEvent> out;
  for (absl::string_view line : absl::StrSplit(watch.out, '\n', absl::SkipEmpty())) {
    const nlohmann::json e = nlohmann::json::parse(line.begin(), line.end());
    if (e["event"] != "step_completed") continue;
    StepEvent s;
    if (e["loss"].is_number()) s.loss = e["loss"].get<double>();
    s.lr = e["learning_rate"].get<double>();
    if (e["grad_norm"].is_number()) s.grad_norm = e["grad_norm"].get<double>();
    s.skipped = e["skipped"].get<bool>();
    s.nonfinite_ranks = e["nonfinite_ranks"].get<std::vector<int>>();
    if (e.contains("eval_loss")) s.eval_loss = e["eval_loss"].get<double>();
    out.push_back(s);
  }
  return out;
}

// The 4-layer MLP the tests train (one layer per stage with 4 stages).
ReferenceConfig Mlp(int64_t steps, std::string optimizer = "sgd", double lr = 0.1) {
  return MlpReference({8, 16, 16, 16, 4}, 3, 11, 16, 4, steps, "mse", std::move(optimizer), lr,
                      /*momentum=*/0.0, /*weight_decay=*/0.0);
}

// The recipe's spec keys for `c`, in the training section, and `eval` after it.
std::string RecipeYaml(const ReferenceConfig& c, int64_t max_skipped = 0) {
  std::string out = absl::StrFormat("\n  lr_schedule: {kind: %s, warmup_steps: %d%s}",
                                    c.lr_schedule, c.warmup_steps,
                                    c.lr_schedule == "constant"
                                        ? ""
                                        : absl::StrFormat(", min_lr: %.17g", c.min_lr));
  if (c.max_norm.has_value()) {
    absl::StrAppend(&out, absl::StrFormat("\n  grad_clip: {max_norm: %.17g}", *c.max_norm));
  }
  if (max_skipped > 0) absl::StrAppend(&out, "\n  max_skipped_steps: ", max_skipped);
  return out;
}

struct Layout {
  std::string schedule;
  int stages = 2;
  int workers = 2;
  int replicas = 1;
  bool shard = false;
  int microbatches = 4;  // per replica
};

// The job spec: MlpSpecYaml with the recipe, checkpoints every `every` steps, `eval` when the
// reference evaluates, and `data_yaml` (empty: synthetic).
std::string Spec(const std::string& name, const ReferenceConfig& c, const Layout& l,
                 const std::string& ckpt, int64_t every = 0, const std::string& data_yaml = "",
                 int64_t max_skipped = 0, const std::string& resume_from = "") {
  std::string spec = MlpSpecYaml(c, {name, l.schedule, l.stages, l.workers, l.microbatches}, ckpt,
                                 data_yaml);
  const std::string ckpt_line = absl::StrCat("\n  checkpoint: {dir: ", ckpt, "}");
  std::string training_extra = RecipeYaml(c, max_skipped);
  if (!resume_from.empty()) absl::StrAppend(&training_extra, "\n  resume_from: ", resume_from);
  spec = absl::StrReplaceAll(
      spec, {{ckpt_line, absl::StrCat(training_extra, "\n  checkpoint: {dir: ", ckpt,
                                      every > 0 ? absl::StrCat(", every_steps: ", every) : "",
                                      "}")},
             {absl::StrCat("placement: {workers: ", l.workers, "}"),
              absl::StrCat("placement: {workers: ", l.workers, ", replicas: ", l.replicas,
                           ", shard_optimizer: ", l.shard ? "true" : "false", "}")}});
  if (c.eval_every > 0) {
    absl::StrAppend(&spec, "eval: {every_steps: ", c.eval_every, ", batches: ", c.eval_batches,
                    ", data: {kind: synthetic, seed: ", c.eval_data_seed, "}}\n");
  }
  return spec;
}

class TrainingRecipe : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("OMP_NUM_THREADS", "1", 1);
    setenv("MKL_NUM_THREADS", "1", 1);
  }

  // Starts the test's cluster of `workers` workers.
  void EnsureCluster(int workers) {
    if (cluster_ != nullptr && cluster_->num_workers() >= workers) return;
    cluster_.reset();
    ClusterOptions options;
    options.workers = workers;
    auto cluster = LocalCluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);
  }

  // Runs `spec_yaml` on the cluster (EnsureCluster first) to its end and returns the job.
  v1::Job Run(int workers, const std::string& spec_yaml) {
    EnsureCluster(workers);
    if (cluster_ == nullptr) return v1::Job();
    const std::string spec = cluster_->WriteFile(absl::StrCat("spec-", ++specs_, ".yaml"), spec_yaml);
    CommandResult submit = cluster_->Stagectl({"submit", spec, "--wait"});
    const std::string job_id = LastLine(submit.out);
    auto job = cluster_->GetJob(job_id);
    EXPECT_TRUE(job.ok()) << submit.out << submit.err << cluster_->Logs();
    return job.ok() ? *job : v1::Job();
  }

  // A path in the cluster's directory (EnsureCluster first).
  std::string Dir(const std::string& name) { return absl::StrCat(cluster_->dir(), "/", name); }

  std::unique_ptr<LocalCluster> cluster_;
  int specs_ = 0;
};

// Every step's loss and learning rate equal the reference's.
void ExpectStepsMatch(const v1::Job& job, const std::vector<StepEvent>& events,
                      const ReferenceResult& ref, int64_t first = 0) {
  ASSERT_EQ(static_cast<size_t>(job.losses_size()), ref.losses.size() - first);
  ASSERT_EQ(events.size(), ref.losses.size() - first);
  for (size_t i = 0; i < events.size(); ++i) {
    const size_t k = i + first;
    SCOPED_TRACE(absl::StrCat("step ", k));
    EXPECT_EQ(events[i].skipped, ref.skipped[k]);
    if (ref.skipped[k]) {
      EXPECT_TRUE(std::isnan(job.losses(i)));
      EXPECT_FALSE(events[i].loss.has_value());
    } else {
      EXPECT_TRUE(Near(job.losses(i), ref.losses[k])) << job.losses(i) << " vs " << ref.losses[k];
    }
    EXPECT_NEAR(events[i].lr, ref.lrs[k], 1e-12 * ref.lrs[k]);
  }
}

TEST_F(TrainingRecipe, CosineWithWarmupFollowsTheReferenceOverTwentySteps) {
  ReferenceConfig c = Mlp(20);
  c.lr_schedule = "cosine";
  c.warmup_steps = 3;
  c.min_lr = 0.01;
  const Layout l{"1F1B", 2, 2};
  ASSERT_NO_FATAL_FAILURE(EnsureCluster(2));
  const std::string ckpt = Dir("ckpt-cosine");
  const v1::Job done = Run(2, Spec("cosine", c, l, ckpt));
  ASSERT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.reason() << cluster_->Logs();
  const ReferenceResult ref = TrainReference(c);
  // Warmup rises to the base, the decay ends exactly at min_lr.
  EXPECT_DOUBLE_EQ(ref.lrs[0], 0.1 / 4);
  EXPECT_DOUBLE_EQ(ref.lrs[3], 0.1);
  EXPECT_DOUBLE_EQ(ref.lrs[19], 0.01);
  ExpectStepsMatch(done, StepEvents(*cluster_, done.id()), ref);
  ExpectParamsMatchReference(LoadAllStageFiles(ckpt, 20, 2), ref, kRtol, kAtol);
  EXPECT_DOUBLE_EQ(done.learning_rate(), 0.01);
}

TEST_F(TrainingRecipe, LinearScheduleResumesFromAMidRunCheckpointWithTheStraightRunsNumbers) {
  ReferenceConfig c = Mlp(10, "adamw", 0.01);
  c.lr_schedule = "linear";
  c.warmup_steps = 2;
  c.min_lr = 0.001;
  const Layout l{"GPipe", 2, 2};
  ASSERT_NO_FATAL_FAILURE(EnsureCluster(2));
  const std::string ckpt = Dir("ckpt-linear");
  const v1::Job straight = Run(2, Spec("linear", c, l, ckpt, /*every=*/5));
  ASSERT_EQ(straight.state(), v1::JOB_STATE_SUCCEEDED) << straight.reason() << cluster_->Logs();
  const ReferenceResult ref = TrainReference(c);
  ExpectStepsMatch(straight, StepEvents(*cluster_, straight.id()), ref);

  // Resumed at step 5 for 5 more steps: T = 5 + 5, the same timeline.
  ReferenceConfig rest = c;
  rest.steps = 5;
  const std::string ckpt2 = Dir("ckpt-linear-resumed");
  const v1::Job resumed =
      Run(2, Spec("linear-resumed", rest, l, ckpt2, 0, "", 0, absl::StrCat(ckpt, "/step-000005")));
  ASSERT_EQ(resumed.state(), v1::JOB_STATE_SUCCEEDED) << resumed.reason() << cluster_->Logs();
  const std::vector<StepEvent> events = StepEvents(*cluster_, resumed.id());
  ExpectStepsMatch(resumed, events, ref, /*first=*/5);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(resumed.losses(i), straight.losses(5 + i)) << i;
  ExpectParamsMatchReference(LoadAllStageFiles(ckpt2, 10, 2), ref, kRtol, kAtol);
}

struct ClipCase {
  std::string name;
  Layout layout;
  // The layers each rank holds, for the per-rank clipping the job must not do.
  std::vector<std::vector<int>> rank_layers;
};

class GradientClipping : public TrainingRecipe, public ::testing::WithParamInterface<ClipCase> {};

TEST_P(GradientClipping, ClipsByTheGlobalNormOfEveryStage) {
  const ClipCase& cc = GetParam();
  ReferenceConfig c = Mlp(6);
  c.microbatches = cc.layout.microbatches * cc.layout.replicas;
  // max_norm at the median of the unclipped norms: some steps clip, some do not.
  ReferenceConfig probe = c;
  probe.max_norm = 1e30;
  std::vector<double> norms = TrainReference(probe).grad_norms;
  std::sort(norms.begin(), norms.end());
  c.max_norm = norms[norms.size() / 2];
  const ReferenceResult ref = TrainReference(c);
  int clipped = 0;
  for (double n : ref.grad_norms) clipped += n > *c.max_norm ? 1 : 0;
  EXPECT_GT(clipped, 0);
  EXPECT_LT(clipped, 6);
  // Clipping each rank's layers alone would give other parameters.
  ReferenceConfig per_rank = c;
  per_rank.clip_groups = cc.rank_layers;
  const ReferenceResult alone = TrainReference(per_rank);
  double apart = 0;
  for (const auto& [name, p] : ref.params) {
    apart = std::max(apart, (p - alone.params.at(name)).abs().max().item<double>());
  }
  EXPECT_GT(apart, 100 * kAtol);

  const int workers = cc.layout.workers * cc.layout.replicas;
  ASSERT_NO_FATAL_FAILURE(EnsureCluster(workers));
  const std::string ckpt = Dir(absl::StrCat("ckpt-", cc.name));
  const v1::Job job = Run(workers, Spec(cc.name, c, cc.layout, ckpt));
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason() << cluster_->Logs();
  const std::vector<StepEvent> events = StepEvents(*cluster_, job.id());
  ExpectStepsMatch(job, events, ref);
  for (size_t k = 0; k < events.size(); ++k) {
    ASSERT_TRUE(events[k].grad_norm.has_value()) << k;
    EXPECT_TRUE(Near(*events[k].grad_norm, ref.grad_norms[k]))
        << "step " << k << ": " << *events[k].grad_norm << " vs " << ref.grad_norms[k];
  }
  ASSERT_TRUE(job.has_grad_norm());
  const double diff = ExpectParamsMatchReference(LoadAllStageFiles(ckpt, 6, cc.layout.stages), ref,
                                                 kRtol, kAtol);
  std::cerr << cc.name << ": " << clipped << " of 6 steps clipped; largest |param - ref| " << diff
            << ", per-rank clipping would differ by " << apart << "\n";
}

INSTANTIATE_TEST_SUITE_P(
    Schedules, GradientClipping,
    ::testing::Values(ClipCase{"clip-1f1b", {"1F1B", 2, 2}, {{0, 1}, {2, 3}}},
                      ClipCase{"clip-zbv", {"ZBVZeroBubble", 4, 2}, {{0, 3}, {1, 2}}},
                      ClipCase{"clip-dualpipev", {"DualPipeV", 4, 2}, {{0, 3}, {1, 2}}},
                      ClipCase{"clip-zero-replicas",
                               {"1F1B", 2, 2, /*replicas=*/2, /*shard=*/true, /*microbatches=*/2},
                               {{0, 1}, {2, 3}}}),
    [](const ::testing::TestParamInfo<ClipCase>& info) {
      return absl::StrReplaceAll(info.param.name, {{"-", "_"}});
    });

// A tensors file of `rows` rows ([rows, 8] inputs, [rows, 4] targets) with NaN inputs in
// `nan_rows`, written with torch's pickler (what torch.save writes).
std::string WriteDataset(const std::string& path, int64_t rows, const std::vector<int64_t>& nan_rows,
                         ReferenceConfig& c) {
  at::Generator gen = at::detail::createCPUGenerator(5);
  torch::Tensor x = torch::randn({rows, 8}, gen, torch::kFloat32);
  torch::Tensor y = torch::tanh(torch::randn({rows, 4}, gen, torch::kFloat32));
  for (int64_t r : nan_rows) x[r][2] = std::nan("");
  c10::Dict<std::string, torch::Tensor> dict;
  dict.insert("inputs", x);
  dict.insert("targets", y);
  const std::vector<char> bytes = torch::pickle_save(c10::IValue(dict));
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  c.dataset_inputs = x;
  c.dataset_targets = y;
  return absl::StrCat("{kind: tensors, path: ", path, "}");
}

TEST_F(TrainingRecipe, ANonFiniteStepIsSkippedOnEveryRankAndTrainingGoesOn) {
  // 48 rows, 16 a step: row 20 is in steps 1 and 4.
  ReferenceConfig c = Mlp(6, "adamw", 0.01);
  ASSERT_NO_FATAL_FAILURE(EnsureCluster(2));
  const std::string data = WriteDataset(Dir("nan.pt"), 48, {20}, c);
  const std::string ckpt = Dir("ckpt-nan");
  const v1::Job job = Run(2, Spec("nan", c, {"1F1B", 2, 2}, ckpt, /*every=*/1, data));
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason() << cluster_->Logs();
  const ReferenceResult ref = TrainReference(c);
  ASSERT_EQ(ref.skipped, (std::vector<bool>{false, true, false, false, true, false}));
  const std::vector<StepEvent> events = StepEvents(*cluster_, job.id());
  ExpectStepsMatch(job, events, ref);
  EXPECT_THAT(job.skipped_steps(), ::testing::ElementsAre(1, 4));
  EXPECT_EQ(job.consecutive_skipped_steps(), 0);
  ASSERT_EQ(events.size(), 6u);
  // The NaN input spreads to every stage's gradients: both ranks saw it.
  EXPECT_THAT(events[1].nonfinite_ranks, ::testing::ElementsAre(0, 1));
  EXPECT_TRUE(events[2].nonfinite_ranks.empty());
  // The skipped step left every stage's parameters as they were, bit for bit.
  for (int stage = 0; stage < 2; ++stage) {
    const auto before = LoadStageFile(StageFilePath(ckpt, 1, stage));
    const auto after = LoadStageFile(StageFilePath(ckpt, 2, stage));
    ASSERT_FALSE(before.empty());
    for (const auto& [name, p] : before) {
      EXPECT_TRUE(torch::equal(p, after.at(name))) << "stage " << stage << " " << name;
    }
  }
  ExpectParamsMatchReference(LoadAllStageFiles(ckpt, 6, 2), ref, kRtol, kAtol);

  // Only NaN: the job fails after max_skipped_steps steps in a row, naming them.
  ReferenceConfig all_nan = Mlp(10);
  const std::string bad = WriteDataset(Dir("all-nan.pt"), 16, {0, 4, 8, 12}, all_nan);
  const v1::Job failed = Run(2, Spec("all-nan", all_nan, {"1F1B", 2, 2}, Dir("ckpt-all-nan"), 0,
                                     bad, /*max_skipped=*/2));
  EXPECT_EQ(failed.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(failed.reason(), HasSubstr("2 steps in a row (global steps 0 to 1) were skipped "
                                         "for non-finite gradients"));
  EXPECT_THAT(failed.reason(), HasSubstr("training.max_skipped_steps: 2"));
}

TEST_F(TrainingRecipe, ActivationRecomputationGivesTheSameBits) {
  // ZBVZeroBubble (split I/W) on 4 stages with clipping: the same job with and without
  // recomputation ends with the same losses and parameters, bit for bit.
  ReferenceConfig c = Mlp(4, "adamw", 0.01);
  c.max_norm = 0.5;
  const Layout l{"ZBVZeroBubble", 4, 2};
  ASSERT_NO_FATAL_FAILURE(EnsureCluster(2));
  const std::string plain_ckpt = Dir("ckpt-plain");
  const std::string full_ckpt = Dir("ckpt-full");
  const v1::Job plain = Run(2, Spec("plain", c, l, plain_ckpt));
  const std::string full_spec = absl::StrReplaceAll(
      Spec("recompute", c, l, full_ckpt), {{"\n  grad_clip:", "\n  activation_checkpointing: full\n  grad_clip:"}});
  ASSERT_THAT(full_spec, HasSubstr("activation_checkpointing: full"));
  const v1::Job full = Run(2, full_spec);
  ASSERT_EQ(plain.state(), v1::JOB_STATE_SUCCEEDED) << plain.reason() << cluster_->Logs();
  ASSERT_EQ(full.state(), v1::JOB_STATE_SUCCEEDED) << full.reason() << cluster_->Logs();
  ASSERT_EQ(full.losses_size(), 4);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(full.losses(i), plain.losses(i)) << i;
  const auto want = LoadAllStageFiles(plain_ckpt, 4, 4);
  const auto got = LoadAllStageFiles(full_ckpt, 4, 4);
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, p] : want) EXPECT_TRUE(torch::equal(got.at(name), p)) << name;
  ExpectParamsMatchReference(got, TrainReference(c), kRtol, kAtol);
}

// bf16 held to the bf16 reference within the contract's rtol 1e-5 + atol 1e-6. Why that holds
// for bf16: both round at the same places (autocast's bf16 matmuls; the MLP's values between
// layers are bf16 in both, so the stage boundaries round nothing more) and sum gradients in fp32
// in the same microbatch order, so they compute the same bits (measured: identical); the
// tolerance leaves room for a differently ordered fp32 sum. It is 10x tighter than the gap
// between the bf16 and fp32 runs, which the test also checks, so it tells bf16 from fp32.
TEST_F(TrainingRecipe, Bf16FollowsTheBf16ReferenceAndHalvesTheWireBytes) {
  ReferenceConfig c = Mlp(3);
  const Layout l{"1F1B", 2, 2};
  ASSERT_NO_FATAL_FAILURE(EnsureCluster(2));
  const std::string fp32_ckpt = Dir("ckpt-fp32");
  const std::string bf16_ckpt = Dir("ckpt-bf16");
  const v1::Job fp32 = Run(2, Spec("fp32", c, l, fp32_ckpt));
  const std::string bf16_spec = absl::StrReplaceAll(
      Spec("bf16", c, l, bf16_ckpt), {{"\n  lr_schedule:", "\n  precision: bf16\n  lr_schedule:"}});
  ASSERT_THAT(bf16_spec, HasSubstr("precision: bf16"));
  const v1::Job bf16 = Run(2, bf16_spec);
  ASSERT_EQ(fp32.state(), v1::JOB_STATE_SUCCEEDED) << fp32.reason() << cluster_->Logs();
  ASSERT_EQ(bf16.state(), v1::JOB_STATE_SUCCEEDED) << bf16.reason() << cluster_->Logs();

  ReferenceConfig bf16_ref_config = c;
  bf16_ref_config.bf16 = true;
  const ReferenceResult ref = TrainReference(bf16_ref_config);
  const ReferenceResult fp32_ref = TrainReference(c);
  constexpr double kBf16Rtol = kRtol, kBf16Atol = kAtol;
  ASSERT_EQ(bf16.losses_size(), 3);
  double loss_gap = 0;
  for (int k = 0; k < 3; ++k) {
    EXPECT_NEAR(bf16.losses(k), ref.losses[k], kBf16Atol + kBf16Rtol * std::abs(ref.losses[k]))
        << "step " << k;
    loss_gap = std::max(loss_gap, std::abs(ref.losses[k] - fp32_ref.losses[k]) /
                                      std::abs(fp32_ref.losses[k]));
  }
  const double diff =
      ExpectParamsMatchReference(LoadAllStageFiles(bf16_ckpt, 3, 2), ref, kBf16Rtol, kBf16Atol);
  std::cerr << "bf16: largest |parameter - bf16 reference| " << diff
            << "; the bf16 reference's losses differ from fp32's by up to " << loss_gap
            << " relative\n";
  // The reference's bf16 really rounds: away from the fp32 run.
  EXPECT_GT(loss_gap, 10 * kBf16Rtol);
  // Activations and their gradients cross in bf16: exactly half the bytes of the fp32 job.
  ASSERT_EQ(bf16.ranks_size(), 2);
  for (int r = 0; r < 2; ++r) {
    EXPECT_GT(fp32.ranks(r).bytes_sent(), 0);
    EXPECT_EQ(2 * bf16.ranks(r).bytes_sent(), fp32.ranks(r).bytes_sent()) << "rank " << r;
    EXPECT_EQ(2 * bf16.ranks(r).bytes_received(), fp32.ranks(r).bytes_received()) << "rank " << r;
  }

  // A GPT (LayerNorm, softmax and attention) trains in bf16 too, close to its fp32 run.
  auto gpt = [&](const std::string& name, const std::string& precision) {
    return absl::StrCat(
        "name: ", name, "\nmodel:\n  builtin: {family: gpt, vocab: 32, d_model: 16, layers: 2, "
        "heads: 2, seq: 8, seed: 4}\nsplit: {stages: 2}\nschedule: {kind: 1F1B, microbatches: 2}\n"
        "training:\n  batch_size: 4\n  steps: 2\n  loss: cross_entropy\n  precision: ",
        precision, "\n  optimizer: {kind: adamw, lr: 0.01}\n");
  };
  const v1::Job gpt32 = Run(2, gpt("gpt-fp32", "fp32"));
  const v1::Job gpt16 = Run(2, gpt("gpt-bf16", "bf16"));
  ASSERT_EQ(gpt32.state(), v1::JOB_STATE_SUCCEEDED) << gpt32.reason();
  ASSERT_EQ(gpt16.state(), v1::JOB_STATE_SUCCEEDED) << gpt16.reason() << cluster_->Logs();
  for (int k = 0; k < 2; ++k) {
    EXPECT_NEAR(gpt16.losses(k), gpt32.losses(k), 0.05 * gpt32.losses(k)) << "step " << k;
    EXPECT_NE(gpt16.losses(k), gpt32.losses(k)) << "step " << k;
  }
}

TEST_F(TrainingRecipe, EvalLossesEqualTheReferencesForwardOnTheHeldOutBatches) {
  ReferenceConfig c = Mlp(4);
  c.eval_every = 2;
  c.eval_batches = 3;
  c.eval_data_seed = 99;
  ASSERT_NO_FATAL_FAILURE(EnsureCluster(2));
  const std::string ckpt = Dir("ckpt-eval");
  const v1::Job job = Run(2, Spec("eval", c, {"GPipe", 2, 2}, ckpt));
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason() << cluster_->Logs();
  const ReferenceResult ref = TrainReference(c);
  ASSERT_EQ(ref.evals.size(), 2u);
  const std::vector<StepEvent> events = StepEvents(*cluster_, job.id());
  ExpectStepsMatch(job, events, ref);
  ASSERT_EQ(job.evals_size(), 2);
  int i = 0;
  for (const auto& [step, loss] : ref.evals) {
    EXPECT_EQ(job.evals(i).global_step(), step);
    EXPECT_TRUE(Near(job.evals(i).loss(), loss)) << job.evals(i).loss() << " vs " << loss;
    ASSERT_TRUE(events[step].eval_loss.has_value());
    EXPECT_DOUBLE_EQ(*events[step].eval_loss, job.evals(i).loss());
    ++i;
  }
  EXPECT_FALSE(events[0].eval_loss.has_value());
  CommandResult status = cluster_->Stagectl({"status", job.id()});
  EXPECT_THAT(status.out, HasSubstr("Eval loss:"));
  EXPECT_THAT(status.out, HasSubstr("LR:"));
}

}  // namespace
}  // namespace stagecoach::testing::training_recipe_test
