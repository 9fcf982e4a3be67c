// Models as users write them (tests/models/nested_models.py, scripted here by Debian's
// python3-torch) trained by a coordinator and workers on loopback, held to plain PyTorch (the
// eager nn.Module in /usr/bin/python3 trained on the same batches by the numerical contract,
// sharing no code with the worker).
//
// A ResNet-style model with BatchNorm, for the state beyond parameters:
//   - per-step training losses, and the eval losses after every step (eval mode: the running
//     statistics), on 1F1B (2 stages) and ZBVZeroBubble (4 stages on 2 workers), so the shape
//     probes before the first step leave the running statistics alone;
//   - with activation recomputation, where each forward runs twice (a BatchNorm updates its
//     statistics once per microbatch all the same);
//   - every parameter and buffer after training (rtol 1e-5, atol 1e-6; num_batches_tracked
//     exactly), read from the checkpoint's export files, which together load into the original
//     nn.Module with load_state_dict(strict=True);
//   - a job resumed from the checkpoint after step 2 gives the uninterrupted run's eval losses
//     and final state (the running statistics restored, not reset);
//   - with 2 replicas, every replica's buffers are replica 0's after each step
//     (worker/runtime/training/replica_buffers.h): the eval losses (each replica evaluates its
//     share with its own buffers) and the checkpoint match a reference that keeps replica 0's.
// Nested layers (worker/model/torchscript_model.h "Nested layers"), by the same measures:
//   - a ViT-style model whose blocks live in an nn.Sequential inside `encoder`, cut between
//     blocks at nested names on 1F1B and ZBVZeroBubble, cut by split.policy between blocks,
//     and resumed mid-run;
//   - a model whose top-level forward adds a parameter of a module it never calls, on 1F1B and
//     ZBVZeroBubble, with the parameter in a later stage than the first.
// Skipped when /usr/bin/python3 cannot import torch.
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/support/local_cluster.h"
#include "tests/support/python.h"
#include "tests/support/test_paths.h"

namespace stagecoach::testing::model_state_test {
namespace {

constexpr double kRtol = 1e-5;
constexpr double kAtol = 1e-6;
constexpr int kMicrobatches = 4;
constexpr int kEvalBatches = 2;
constexpr double kLr = 0.05;
constexpr double kMomentum = 0.9;

// Arguments: MODELS_DIR (tests/models) MODEL (a nested_models.BUILDERS name), then
// make DIR: every nested_models model scripted (MODEL.pt), train.pt and eval.pt ({inputs,
//   targets}, torch.save).
// reference DIR STEPS OUT.json STATE.pt: trains the eager MODEL from MODEL.pt's initial state by
//   the contract (DESIGN.md "Numerical contract"); writes the per-step losses and eval losses,
//   and the final state_dict.
// compare CKPT_STEP_DIR STAGES STATE.pt: merges the stage export files, loads them into a fresh
//   eager module with strict=True, and compares every tensor with STATE.pt.
constexpr char kScript[] = R"PY(
import json, sys, torch
import torch.nn.functional as F
sys.path.insert(0, sys.argv[1])
import nested_models

MODEL = sys.argv[2]
B, M, D, EVAL_BATCHES, LR, MOMENTUM = (int(sys.argv[-6]), int(sys.argv[-5]), int(sys.argv[-4]),
                                        int(sys.argv[-3]), float(sys.argv[-2]), float(sys.argv[-1]))
args = sys.argv[3:-6]

def batch(data, k):
    n = data["inputs"].shape[0]
    rows = torch.tensor([(k * B + i) % n for i in range(B)])
    return data["inputs"][rows].float(), data["targets"][rows]

def microbatch_losses(model, x, y):
    return [F.cross_entropy(model(xm), ym) for xm, ym in zip(torch.tensor_split(x, D * M),
                                                           torch.tensor_split(y, D * M))]

# One training step's microbatch losses, their mean's gradient accumulated: D replicas, replica r
# taking microbatches r*M ... (r+1)*M-1; the buffers after the step are replica 0's (the
# documented rule), so the other replicas run first and the buffers are put back before replica 0.
def train_step(model, x, y):
    xs, ys = torch.tensor_split(x, D * M), torch.tensor_split(y, D * M)
    saved = [b.clone() for b in model.buffers()]
    losses = [0.0] * (D * M)
    for r in list(range(1, D)) + [0]:
        if r == 0:
            with torch.no_grad():
                for b, v in zip(model.buffers(), saved):
                    b.copy_(v)
        for i in range(r * M, (r + 1) * M):
            loss = F.cross_entropy(model(xs[i]), ys[i])
            (loss / (D * M)).backward()
            losses[i] = loss.item()
    return losses

if args[0] == "make":
    d = args[1]
    nested_models.main(d)
    g = torch.Generator().manual_seed(7)
    for name, n in (("train", 24), ("eval", 16)):
        torch.save({"inputs": torch.randn(n, 3, 8, 8, generator=g, dtype=torch.float64),
                    "targets": torch.randint(0, 5, (n,), generator=g)}, d + "/" + name + ".pt")
elif args[0] == "reference":
    d, steps, out, state = args[1], int(args[2]), args[3], args[4]
    model = nested_models.BUILDERS[MODEL]()
    model.load_state_dict(torch.jit.load(d + "/" + MODEL + ".pt").state_dict(), strict=True)
    train, held_out = torch.load(d + "/train.pt"), torch.load(d + "/eval.pt")
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    losses, evals = [], []
    for k in range(steps):
        model.train()
        opt.zero_grad()
        mb = train_step(model, *batch(train, k))
        opt.step()
        losses.append(sum(mb) / (D * M))
        model.eval()
        with torch.no_grad():
            evals.append(sum(sum(l.item() for l in microbatch_losses(model, *batch(held_out, j)))
                             / (D * M) for j in range(EVAL_BATCHES)) / EVAL_BATCHES)
    torch.save(model.state_dict(), state)
    json.dump({"losses": losses, "evals": evals}, open(out, "w"))
elif args[0] == "compare":
    step_dir, stages, state = args[1], int(args[2]), args[3]
    merged = {}
    for s in range(stages):
        part = torch.load("%s/stage-%d.state_dict.pt" % (step_dir, s))
        for name in part:
            assert name not in merged, name + " is in two stages"
        merged.update(part)
    nested_models.BUILDERS[MODEL]().load_state_dict(merged, strict=True)
    want = torch.load(state)
    bad = []
    for name, w in want.items():
        g = merged[name]
        if w.dtype == torch.int64:
            ok = torch.equal(g, w)
        else:
            ok = torch.allclose(g, w, rtol=1e-5, atol=1e-6)
        if not ok:
            bad.append("%s: got %s, want %s" % (name, g.flatten()[:4].tolist(), w.flatten()[:4].tolist()))
    print("\n".join(bad) if bad else "%d tensors equal" % len(want))
    sys.exit(1 if bad else 0)
)PY";

struct Reference {
  std::vector<double> losses;
  std::vector<double> evals;
  std::string state;  // the final state_dict's file
};

class ModelState : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!PythonHasTorch()) GTEST_SKIP() << kPython << " cannot import torch";
    ClusterOptions options;
    options.workers = 4;
    auto cluster = LocalCluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = std::move(*cluster);
    script_ = cluster_->WriteFile("model_state.py", kScript);
    ASSERT_EQ(Python({"make", cluster_->dir()}), 0);
  }

  // Runs the script with `args` (and the contract's constants); its exit code.
  int Python(const std::vector<std::string>& args) {
    std::string command = absl::StrCat(kPython, " '", script_, "' '", TestDataDir(),
                                       "/../models' ", model_);
    for (const std::string& a : args) absl::StrAppend(&command, " '", a, "'");
    absl::StrAppend(&command, " ", batch_, " ", kMicrobatches, " ", replicas_, " ", kEvalBatches,
                    " ", kLr, " ", kMomentum, " > '", cluster_->dir(), "/python.out' 2>&1");
    return std::system(command.c_str());
  }
  std::string PythonOutput() {
    std::ifstream in(cluster_->dir() + "/python.out");
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  Reference RunReference(int steps, const std::string& name) {
    Reference ref;
    const std::string out = absl::StrCat(cluster_->dir(), "/", name, ".json");
    ref.state = absl::StrCat(cluster_->dir(), "/", name, ".state.pt");
    EXPECT_EQ(Python({"reference", cluster_->dir(), std::to_string(steps), out, ref.state}), 0)
        << PythonOutput();
    std::ifstream in(out);
    const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) {
      ADD_FAILURE() << "the reference wrote no JSON: " << PythonOutput();
      return ref;
    }
    ref.losses = j["losses"].get<std::vector<double>>();
    ref.evals = j["evals"].get<std::vector<double>>();
    return ref;
  }

  // The job's spec: model_ split by `split`, `steps` steps on `schedule`, a checkpoint after
  // every step, an eval pass after every step.
  std::string Spec(const std::string& name, const std::string& schedule, const std::string& split,
                   int steps, const std::string& extra_training = "") {
    const std::string& d = cluster_->dir();
    return absl::StrCat(
        "name: ", name, "\nmodel: {torchscript: ", d, "/", model_, ".pt}\nsplit: ", split,
        "\nschedule: {kind: ", schedule, ", microbatches: ", kMicrobatches,
        "}\nplacement: {workers: 2, replicas: ", replicas_, "}\ntraining:\n  batch_size: ", batch_,
        "\n  steps: ", steps,
        "\n  loss: cross_entropy\n  optimizer: {kind: sgd, lr: ", kLr, ", momentum: ", kMomentum,
        "}\n  checkpoint: {dir: ", d, "/ckpt-", name, ", every_steps: 1}\n", extra_training,
        "data: {kind: tensors, path: ", d, "/train.pt}\neval: {every_steps: 1, batches: ",
        kEvalBatches, ", data: {kind: tensors, path: ", d, "/eval.pt}}\n");
  }

  v1::Job Run(const std::string& spec_yaml) {
    auto job = cluster_->SubmitAndWait(spec_yaml, false, v1::JOB_STATE_SUCCEEDED,
                                       absl::Minutes(4));
    EXPECT_TRUE(job.ok()) << job.status() << cluster_->Logs();
    if (!job.ok()) return v1::Job();
    EXPECT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED) << job->reason() << cluster_->Logs();
    return *job;
  }

  // The job's losses and evals against the reference's from step `first` on, and its last
  // checkpoint's exports (`stages` of them) against the reference's final state.
  void Check(const v1::Job& job, const Reference& ref, int first, const std::string& name,
             int stages) {
    SCOPED_TRACE(name);
    ASSERT_EQ(job.losses_size() + first, static_cast<int>(ref.losses.size()));
    for (int i = 0; i < job.losses_size(); ++i) {
      const double want = ref.losses[first + i];
      EXPECT_NEAR(job.losses(i), want, kAtol + kRtol * std::abs(want)) << "loss of step " << i;
    }
    ASSERT_EQ(job.evals_size() + first, static_cast<int>(ref.evals.size()));
    for (int i = 0; i < job.evals_size(); ++i) {
      const double want = ref.evals[first + i];
      EXPECT_NEAR(job.evals(i).loss(), want, kAtol + kRtol * std::abs(want))
          << "eval after global step " << job.evals(i).global_step();
    }
    const std::string step_dir = absl::StrFormat("%s/ckpt-%s/step-%06d", cluster_->dir(), name,
                                                 static_cast<int>(ref.losses.size()));
    EXPECT_EQ(Python({"compare", step_dir, std::to_string(stages), ref.state}), 0)
        << PythonOutput();
  }

  std::unique_ptr<LocalCluster> cluster_;
  std::string script_;
  std::string model_ = "resnet";
  int batch_ = 8;
  int replicas_ = 1;
};

TEST_F(ModelState, BatchNormTrainsAndEvaluatesAsPlainPyTorchOn1F1BAndZbv) {
  const Reference ref = RunReference(3, "ref3");
  const v1::Job one_f_one_b =
      Run(Spec("bn-1f1b", "1F1B", "{points: {layer2: beginning}}", 3));
  Check(one_f_one_b, ref, 0, "bn-1f1b", 2);
  const v1::Job zbv = Run(Spec("bn-zbv", "ZBVZeroBubble",
                               "{points: {layer1: beginning, layer2: beginning, head: beginning}}",
                               3));
  Check(zbv, ref, 0, "bn-zbv", 4);
}

TEST_F(ModelState, RecomputedForwardsUpdateRunningStatisticsOnce) {
  const Reference ref = RunReference(3, "ref3");
  const v1::Job job = Run(Spec("bn-recompute", "1F1B", "{points: {layer2: beginning}}", 3,
                               "  activation_checkpointing: full\n"));
  Check(job, ref, 0, "bn-recompute", 2);
}

TEST_F(ModelState, AResumedJobKeepsTheRunningStatistics) {
  const Reference ref = RunReference(4, "ref4");
  const v1::Job first = Run(Spec("bn-first", "1F1B", "{points: {layer2: beginning}}", 2));
  ASSERT_EQ(first.state(), v1::JOB_STATE_SUCCEEDED);
  const std::string resumed_spec =
      Spec("bn-resumed", "1F1B", "{points: {layer2: beginning}}", 2,
           absl::StrCat("  resume_from: ", cluster_->dir(), "/ckpt-bn-first/step-000002\n"));
  const v1::Job resumed = Run(resumed_spec);
  Check(resumed, ref, 2, "bn-resumed", 2);
}

TEST_F(ModelState, ReplicasKeepReplicaZerosBuffers) {
  batch_ = 16;
  replicas_ = 2;
  const Reference ref = RunReference(3, "ref-replicas");
  const v1::Job job = Run(Spec("bn-replicas", "1F1B", "{points: {layer2: beginning}}", 3));
  Check(job, ref, 0, "bn-replicas", 2);
}

// The ViT's blocks live in encoder.layers (an nn.Sequential inside `encoder`): cut between them
// at nested names, the stages train and evaluate as the whole eager module does.
TEST_F(ModelState, AViTCutBetweenNestedBlocksTrainsAsPlainPyTorch) {
  model_ = "vit";
  const Reference ref = RunReference(3, "vit-ref3");
  const v1::Job one_f_one_b = Run(
      Spec("vit-1f1b", "1F1B", "{points: {encoder.layers.encoder_layer_2: beginning}}", 3));
  Check(one_f_one_b, ref, 0, "vit-1f1b", 2);
  ASSERT_EQ(one_f_one_b.stages_size(), 2);
  EXPECT_EQ(one_f_one_b.layers(one_f_one_b.stages(1).first_layer()).name(),
            "encoder.layers.encoder_layer_2");
  const v1::Job zbv = Run(Spec("vit-zbv", "ZBVZeroBubble",
                               "{points: {encoder.layers.encoder_layer_1: beginning, "
                               "encoder.layers.encoder_layer_3: beginning, encoder.ln: beginning}}",
                               3));
  Check(zbv, ref, 0, "vit-zbv", 4);
}

// Without points, a split policy cuts between the blocks (the encoder's call is opened because it
// wraps most of the model around them); a job resumed from its checkpoint after step 2 gives the
// uninterrupted run's losses, evals and state.
TEST_F(ModelState, APolicyCutsTheViTBetweenBlocksAndResumes) {
  model_ = "vit";
  const Reference ref = RunReference(4, "vit-ref4");
  const std::string split = "{stages: 2, policy: equal-params}";
  const v1::Job first = Run(Spec("vit-policy", "1F1B", split, 2));
  ASSERT_EQ(first.state(), v1::JOB_STATE_SUCCEEDED);
  ASSERT_EQ(first.stages_size(), 2);
  EXPECT_EQ(first.layers(first.stages(1).first_layer()).name(), "encoder.layers.encoder_layer_2");
  Check(first, RunReference(2, "vit-ref2"), 0, "vit-policy", 2);
  const v1::Job resumed =
      Run(Spec("vit-resumed", "1F1B", split, 2,
               absl::StrCat("  resume_from: ", cluster_->dir(), "/ckpt-vit-policy/step-000002\n")));
  Check(resumed, ref, 2, "vit-resumed", 2);
}

// `h + self.extras.pos_embedding` in the top-level forward, where `extras` is never called: the
// parameter trains in the stage that reads it (block1's), here not the first. On ZBV a point
// inside block2 (at its conv2) opens block2's call: its BatchNorm layers and the residual that
// crosses the cut train and evaluate as in the whole module.
TEST_F(ModelState, AParameterReadByAttributeTrainsInTheStageThatReadsIt) {
  model_ = "attrread";
  const Reference ref = RunReference(3, "attr-ref3");
  const v1::Job one_f_one_b = Run(Spec("attr-1f1b", "1F1B", "{points: {block1: beginning}}", 3));
  Check(one_f_one_b, ref, 0, "attr-1f1b", 2);
  const v1::Job zbv =
      Run(Spec("attr-zbv", "ZBVZeroBubble",
               "{points: {block1: beginning, block2.conv2: beginning, head: beginning}}", 3));
  Check(zbv, ref, 0, "attr-zbv", 4);
  std::vector<std::string> layers;
  for (const v1::LayerInfo& layer : zbv.layers()) layers.push_back(layer.name());
  EXPECT_EQ(layers, (std::vector<std::string>{"stem", "block1", "block2.conv1", "block2.bn1",
                                              "block2.conv2", "block2.bn2", "head"}));
}

// `stagectl inspect` lists the split points a model offers, nested ones included, with their
// parameter counts: from a path on the workers and from an uploaded file; a file that is not a
// model is refused with the worker's message.
TEST_F(ModelState, StagectlInspectListsNestedSplitPoints) {
  const std::string vit = cluster_->dir() + "/vit.pt";
  CommandResult json = cluster_->Stagectl({"inspect", vit, "-o", "json"}, absl::Seconds(60));
  ASSERT_EQ(json.exit_code, 0) << json.out << json.err << cluster_->Logs();
  const nlohmann::json j = nlohmann::json::parse(json.out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << json.out;
  EXPECT_EQ(j["layers"].size(), 7u);
  EXPECT_FALSE(j["sequential"].get<bool>());
  EXPECT_EQ(j["model_sha256"].get<std::string>().size(), 64u);
  std::map<std::string, nlohmann::json> by_name;
  for (const nlohmann::json& c : j["split_candidates"]) by_name[c["name"]] = c;
  EXPECT_EQ(by_name["encoder"]["parameters"].get<int64_t>(), 9008);
  EXPECT_FALSE(by_name["encoder"]["layer"].get<bool>());
  EXPECT_TRUE(by_name["encoder.layers.encoder_layer_2"]["layer"].get<bool>());
  EXPECT_EQ(by_name["encoder.layers.encoder_layer_2"]["depth"].get<int>(), 2);
  EXPECT_EQ(by_name["encoder.layers.encoder_layer_2.mlp.0"]["parameters"].get<int64_t>(),
            16 * 32 + 32);

  CommandResult table = cluster_->Stagectl({"inspect", "--upload", vit}, absl::Seconds(60));
  ASSERT_EQ(table.exit_code, 0) << table.out << table.err;
  EXPECT_THAT(table.out, ::testing::HasSubstr("7 layers, cut from its forward graph"));
  EXPECT_THAT(table.out, ::testing::ContainsRegex("\n    encoder.layers.encoder_layer_2 +2,224  layer\n"));
  EXPECT_THAT(table.out, ::testing::ContainsRegex("\n  encoder.layers +8,896\n"));
  std::cout << table.out;

  const std::string text = cluster_->WriteFile("not-a-model.pt", "not a model\n");
  CommandResult bad = cluster_->Stagectl({"inspect", text}, absl::Seconds(60));
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_THAT(bad.err, ::testing::HasSubstr("is not a TorchScript file"));
}

}  // namespace
}  // namespace stagecoach::testing::model_state_test
