// User TorchScript models trained across real processes: the fixtures of
// tests/models/make_models.py (written here by Debian's python3-torch), a coordinator and
// workers on loopback, jobs submitted with stagectl (one model uploaded with --model), and
// data.kind tensors files written by Python.
//   - sequential.pt split 4 ways by split.points and by each policy (equal-layers, equal-params,
//     profiled) trains 3 steps to the losses and final parameters of the single-process
//     reference (tests/support/reference_torchscript.h; final parameters read from the
//     checkpoint's stage-<s>.state_dict.pt files), rtol 1e-5 + atol 1e-6;
//   - skip.pt (a value of stage 0 used by stage 2) split 3 ways trains equal to its reference;
//     the skip value goes from rank 0 to rank 2 directly (per-peer byte counters, computed from
//     the tensors' shapes), and each rank holds exactly its stages' parameters;
//   - profiled on heavy.pt gives another split than two layers a stage and a lower slowest stage;
//   - an unknown split point and a file that is not TorchScript are refused with clear errors.
// Skipped when /usr/bin/python3 cannot import torch.
#include <torch/script.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/job_predicates.h"
#include "tests/support/local_cluster.h"
#include "tests/support/python.h"
#include "tests/support/reference_mlp.h"
#include "tests/support/reference_torchscript.h"
#include "tests/support/stage_files.h"
#include "tests/support/test_paths.h"

namespace stagecoach::testing::torchscript_training_test {
namespace {

using ::testing::HasSubstr;

constexpr double kRtol = 1e-5;
constexpr double kAtol = 1e-6;
constexpr int64_t kSteps = 3;

// argv: path, rows, in, out, loss, seed. Inputs float64 (workers read them as float32); targets
// class indices in [0, out) for cross_entropy, values [rows, out] for mse.
constexpr char kWriter[] = R"PY(
import sys, torch
path, loss = sys.argv[1], sys.argv[5]
n, d_in, d_out, seed = (int(a) for a in sys.argv[2:5] + sys.argv[6:7])
g = torch.Generator().manual_seed(seed)
X = torch.randn(n, d_in, generator=g, dtype=torch.float64)
Y = torch.randint(0, d_out, (n,), generator=g) if loss == "cross_entropy" else \
    torch.randn(n, d_out, generator=g)
torch.save({"inputs": X, "targets": Y}, path)
)PY";

// A top-level layer of a fixture and the parameters its submodule owns, read from the file with
// LibTorch (named_children), independently of the worker's inspection.
struct Layer {
  std::string name;
  int64_t parameters = 0;
};

std::vector<Layer> ChildLayers(const std::string& path) {
  torch::jit::Module m = torch::jit::load(path);
  std::vector<Layer> out;
  for (const auto& child : m.named_children()) {
    Layer layer{child.name, 0};
    for (const auto& p : child.value.parameters()) layer.parameters += p.numel();
    out.push_back(layer);
  }
  return out;
}

int64_t TotalParameters(const std::string& path) {
  int64_t n = 0;
  for (const auto& p : torch::jit::load(path).parameters()) n += p.numel();
  return n;
}

// The fixtures, written once per test binary.
class Fixtures {
 public:
  static const Fixtures& Get() {
    static Fixtures f;  // destroyed at exit, removing the directory
    return f;
  }
  std::string Path(const std::string& name) const { return dir_.path() + "/" + name; }
  bool ok() const { return ok_; }

 private:
  Fixtures() {
    ok_ =
        std::system(
            absl::StrCat(kPython, " '", MakeModelsScript(), "' '", dir_.path(), "'").c_str()) == 0;
  }
  TempDir dir_;
  bool ok_ = false;
};

struct Job {
  std::string name;
  std::string model;  // fixture file
  std::string split;  // the `split:` flow map
  int workers = 4;
  int stages = 4;
  std::string schedule = "1F1B";
  int microbatches = 4;
  bool upload = false;  // stagectl submit --model
  TorchScriptReferenceConfig ref;
  int64_t rows = 20;  // rows of the data file
  int64_t in = 16;    // input width
  int64_t out = 4;    // output width (classes for cross_entropy)
  std::string data;   // written by Start
  std::string ckpt;   // training.checkpoint.dir
  std::string id;     // once submitted
};

std::string SpecYaml(const Job& j, const std::string& model_path) {
  return absl::StrCat("name: ", j.name, "\n",                       //
                      "model:\n  torchscript: ", model_path, "\n",  //
                      "split: ", j.split, "\n",                     //
                      "schedule: {kind: ", j.schedule, ", microbatches: ", j.microbatches, "}\n",
                      "placement: {workers: ", j.workers, "}\n",  //
                      "training:\n  batch_size: ", j.ref.batch_size, "\n  steps: ", j.ref.steps,
                      "\n  loss: ", j.ref.loss, "\n  optimizer: ", TorchScriptOptimizerYaml(j.ref),
                      "\n  checkpoint: {dir: ", j.ckpt, "}\n",  //
                      "data: {kind: tensors, path: ", j.data, "}\n");
}

TorchScriptReferenceConfig Ref(int64_t batch, int microbatches, std::string loss,
                               std::string optimizer, double lr, double momentum = 0.0) {
  TorchScriptReferenceConfig r;
  r.batch_size = batch;
  r.microbatches = microbatches;
  r.steps = kSteps;
  r.loss = std::move(loss);
  r.optimizer = std::move(optimizer);
  r.lr = lr;
  r.momentum = momentum;
  return r;
}

// Writes the job's data file with Python; sets j.data and j.ckpt.
void WriteData(LocalCluster& cluster, Job& j) {
  j.data = absl::StrCat(cluster.dir(), "/", j.name, ".data.pt");
  j.ckpt = absl::StrCat(cluster.dir(), "/ckpt-", j.name);
  const std::string script = cluster.WriteFile("write_data.py", kWriter);
  ASSERT_EQ(std::system(absl::StrCat(kPython, " '", script, "' '", j.data, "' ", j.rows, " ", j.in,
                                     " ", j.out, " ", j.ref.loss, " ", 100 + j.rows)
                            .c_str()),
            0);
}

// Writes the job's data and spec and submits it; fills j.id.
void Submit(LocalCluster& cluster, Job& j) {
  WriteData(cluster, j);
  if (::testing::Test::HasFatalFailure()) return;
  const std::string model = Fixtures::Get().Path(j.model);
  // An uploaded model's spec names a file the workers do not have: only the upload can work.
  const std::string spec = cluster.WriteFile(absl::StrCat(j.name, ".yaml"),
                                             SpecYaml(j, j.upload ? "uploaded-model.pt" : model));
  std::vector<std::string> args = {"submit", spec};
  if (j.upload) args.insert(args.end(), {"--model", model});
  CommandResult submit = cluster.Stagectl(args);
  ASSERT_EQ(submit.exit_code, 0) << j.name << ": " << submit.out << submit.err;
  j.id = LastLine(submit.out);
  ASSERT_FALSE(j.id.empty()) << submit.out;
}

// The union of the checkpoint's export files after kSteps steps, each name in one stage only.
std::map<std::string, torch::Tensor> CheckpointParameters(const std::string& dir, int stages) {
  std::map<std::string, torch::Tensor> all;
  for (int s = 0; s < stages; ++s) {
    const std::string path = absl::StrFormat("%s/step-%06d/stage-%d.state_dict.pt", dir, kSteps, s);
    for (auto& [name, tensor] : LoadStageFile(path)) {
      EXPECT_EQ(all.count(name), 0u) << name << " is in two stages";
      all[name] = tensor;
    }
  }
  return all;
}

// The stage boundaries of a job as planned: first layer of each stage, then the layer count.
std::vector<int> Boundaries(const v1::Job& job) {
  std::vector<int> out;
  for (const v1::StageAssignment& s : job.stages()) out.push_back(s.first_layer());
  if (job.stages_size() > 0) out.push_back(job.stages(job.stages_size() - 1).end_layer());
  return out;
}

// Checks a finished job against its reference and the layers of its model file.
void CheckTrainedJob(const v1::Job& job, const Job& j, const std::vector<Layer>& layers,
                     const std::map<std::string, int64_t>& extra_params_by_layer = {}) {
  SCOPED_TRACE(j.name);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason();

  // The planned layers are the file's top-level layers, in order, with their parameters.
  ASSERT_EQ(job.layers_size(), static_cast<int>(layers.size()));
  for (size_t i = 0; i < layers.size(); ++i) {
    EXPECT_EQ(job.layers(i).name(), layers[i].name) << "layer " << i;
    const auto extra = extra_params_by_layer.find(layers[i].name);
    EXPECT_EQ(job.layers(i).parameters(),
              layers[i].parameters + (extra == extra_params_by_layer.end() ? 0 : extra->second))
        << layers[i].name;
  }
  // Stages are contiguous, non-empty, cover every layer.
  ASSERT_EQ(job.stages_size(), j.stages);
  const std::vector<int> bounds = Boundaries(job);
  EXPECT_EQ(bounds.front(), 0);
  EXPECT_EQ(bounds.back(), static_cast<int>(layers.size()));
  for (int s = 0; s < j.stages; ++s) {
    EXPECT_EQ(job.stages(s).stage(), s);
    EXPECT_LT(job.stages(s).first_layer(), job.stages(s).end_layer()) << "stage " << s;
    if (s > 0) {
      EXPECT_EQ(job.stages(s).first_layer(), job.stages(s - 1).end_layer());
    }
  }

  // Losses and final parameters equal the reference's.
  TorchScriptReferenceConfig config = j.ref;
  config.model_path = Fixtures::Get().Path(j.model);
  const ReferenceDataset data = LoadReferenceDataset(j.data);
  ASSERT_TRUE(data.inputs.defined() && data.targets.defined());
  config.inputs = data.inputs;
  config.targets = data.targets;
  const TorchScriptReferenceResult ref = TrainTorchScriptReference(config);
  ASSERT_EQ(job.losses_size(), kSteps);
  for (int step = 0; step < kSteps; ++step) {
    EXPECT_NEAR(job.losses(step), ref.losses[step], kAtol + kRtol * std::abs(ref.losses[step]))
        << "step " << step;
  }
  std::map<std::string, torch::Tensor> got = CheckpointParameters(j.ckpt, j.stages);
  ASSERT_EQ(got.size(), ref.params.size());
  for (const auto& [name, want] : ref.params) {
    ASSERT_EQ(got.count(name), 1u) << name << " is in no stage's state_dict";
    ASSERT_EQ(got[name].sizes(), want.sizes()) << name;
    EXPECT_TRUE(torch::allclose(got[name], want, kRtol, kAtol))
        << name << " differs by " << (got[name] - want).abs().max().item<double>();
    EXPECT_GT((want - ref.initial_params.at(name)).abs().max().item<double>(), 100 * kAtol)
        << name << " barely changed in training";
  }

  // Each rank holds its stages' parameters only.
  const int64_t total = TotalParameters(config.model_path);
  for (const v1::RankStatus& rank : job.ranks()) {
    int64_t share = 0;
    for (int s : rank.stages()) {
      for (int l = job.stages(s).first_layer(); l < job.stages(s).end_layer(); ++l) {
        const auto extra = extra_params_by_layer.find(layers[l].name);
        share += layers[l].parameters + (extra == extra_params_by_layer.end() ? 0 : extra->second);
      }
    }
    EXPECT_EQ(rank.parameters(), share) << "rank " << rank.rank();
    EXPECT_LT(rank.parameters(), total) << "rank " << rank.rank() << " holds the whole model";
    EXPECT_EQ(rank.steps_done(), kSteps) << "rank " << rank.rank();
  }
}

class TorchScriptTraining : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!PythonHasTorch()) GTEST_SKIP() << kPython << " cannot import torch";
    ASSERT_TRUE(Fixtures::Get().ok()) << "python3 " << MakeModelsScript() << " failed";
  }
};

TEST_F(TorchScriptTraining, SequentialFourWaysByPointsAndEveryPolicyMatchesTheReference) {
  ClusterOptions options;
  options.workers = 4;
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::vector<Layer> layers = ChildLayers(Fixtures::Get().Path("sequential.pt"));
  ASSERT_EQ(layers.size(), 8u);

  std::vector<Job> jobs(4);
  jobs[0].name = "seq-points";
  jobs[0].split = R"({points: {"2": beginning, "3": end, "6": beginning}})";
  jobs[0].upload = true;
  jobs[0].ref = Ref(8, 4, "mse", "sgd", 0.05, 0.9);
  jobs[1].name = "seq-equal-layers";
  jobs[1].split = "{stages: 4, policy: equal-layers}";
  jobs[1].schedule = "GPipe";
  jobs[1].ref = Ref(12, 4, "mse", "adamw", 0.01);
  jobs[2].name = "seq-equal-params";
  jobs[2].split = "{stages: 4, policy: equal-params}";
  jobs[2].microbatches = 5;  // 11 rows: 3, 2, 2, 2, 2
  jobs[2].ref = Ref(11, 5, "cross_entropy", "sgd", 0.1);
  jobs[3].name = "seq-profiled";
  jobs[3].split = "{stages: 4, policy: profiled}";
  jobs[3].ref = Ref(8, 4, "mse", "adamw", 0.02);
  for (Job& j : jobs) {
    j.model = "sequential.pt";
    j.rows = 20 + (&j - jobs.data());
    Submit(**cluster, j);
    if (HasFatalFailure()) return;
  }
  for (const Job& j : jobs) {
    auto job = (*cluster)->WaitForJob(j.id, IsFinal, absl::Seconds(180));
    ASSERT_TRUE(job.ok()) << j.name << ": " << job.status() << (*cluster)->Logs();
    CheckTrainedJob(*job, j, layers);
    if (j.name == "seq-points" || j.name == "seq-equal-layers") {
      // Points 2 beginning, 3 end, 6 beginning; 8 layers in 4 equal parts: the same cut.
      EXPECT_EQ(Boundaries(*job), (std::vector<int>{0, 2, 4, 6, 8})) << j.name;
    }
    if (j.name == "seq-equal-params") {
      // The cut minimises the largest stage's parameters: check no other 4-way cut does better.
      std::vector<int64_t> prefix = {0};
      for (const Layer& l : layers) prefix.push_back(prefix.back() + l.parameters);
      auto largest = [&](const std::vector<int>& b) {
        int64_t m = 0;
        for (size_t s = 0; s + 1 < b.size(); ++s) m = std::max(m, prefix[b[s + 1]] - prefix[b[s]]);
        return m;
      };
      int64_t best = prefix.back();
      for (int a = 1; a < 8; ++a)
        for (int b = a + 1; b < 8; ++b)
          for (int c = b + 1; c < 8; ++c) best = std::min(best, largest({0, a, b, c, 8}));
      EXPECT_EQ(largest(Boundaries(*job)), best);
    }
    if (j.name == "seq-profiled") {
      for (const v1::LayerInfo& l : job->layers()) {
        EXPECT_GT(l.forward_seconds() + l.backward_seconds(), 0.0) << l.name() << " not profiled";
      }
    }
    if (HasFailure()) std::cerr << (*cluster)->Logs();
  }
}

TEST_F(TorchScriptTraining, SkipConnectionSplitThreeWaysMatchesTheReferenceAndGoesDirect) {
  ClusterOptions options;
  options.workers = 3;
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string model = Fixtures::Get().Path("skip.pt");
  const std::vector<Layer> layers = ChildLayers(model);
  std::vector<std::string> names;
  for (const Layer& l : layers) names.push_back(l.name);
  ASSERT_EQ(absl::StrJoin(names, ","), "a,b,c,d,e,f");

  Job j;
  j.name = "skip-3";
  j.model = "skip.pt";
  // Stages {a, b}, {c, d}, {e, f}: h0 = a(x) is used by e, two boundaries later.
  j.split = R"({points: {"c": beginning, "e": beginning}})";
  j.workers = 3;
  j.stages = 3;
  j.microbatches = 4;
  j.ref = Ref(10, 4, "mse", "adamw", 0.01);
  j.rows = 17;
  Submit(**cluster, j);
  if (HasFatalFailure()) return;
  auto job = (*cluster)->WaitForJob(j.id, IsFinal, absl::Seconds(180));
  ASSERT_TRUE(job.ok()) << job.status() << (*cluster)->Logs();
  // The top-level parameter `scale` (32 elements) is read between e's and f's calls: it belongs
  // to the first layer that uses it, e.
  CheckTrainedJob(*job, j, layers, {{"e", 32}});
  ASSERT_EQ(job->ranks_size(), 3);

  // Per-peer bytes over kSteps steps of batch_size rows, float32 (4 bytes). Forward: stage 0
  // sends h1 = b(h0) [rows, 32] and x [rows, 16] (stage 1 uses x.sum) to stage 1, and h0
  // [rows, 32] straight to stage 2; stage 1 sends h3 [rows, 32] to stage 2. Backward: gradients
  // of h0 (stage 2 -> 0), h3 (2 -> 1) and h1 (1 -> 0); x needs no gradient.
  const int64_t rows = kSteps * j.ref.batch_size;
  const int64_t h = rows * 32 * 4, x = rows * 16 * 4;
  std::map<int, const v1::RankStatus*> by_rank;
  for (const v1::RankStatus& r : job->ranks()) by_rank[r.rank()] = &r;
  ASSERT_EQ(by_rank.size(), 3u);
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(by_rank[r]->stages_size(), 1);
    ASSERT_EQ(by_rank[r]->stages(0), r);
  }
  auto sent = [&](int from, int to) {
    const auto& m = by_rank[from]->bytes_sent_to();
    return m.count(to) ? m.at(to) : 0;
  };
  auto received = [&](int at, int from) {
    const auto& m = by_rank[at]->bytes_received_from();
    return m.count(from) ? m.at(from) : 0;
  };
  EXPECT_EQ(sent(0, 2), h) << "the skip value h0 goes from rank 0 to rank 2 directly";
  EXPECT_EQ(received(2, 0), h);
  EXPECT_EQ(sent(0, 1), h + x);
  EXPECT_EQ(received(1, 0), h + x);
  EXPECT_EQ(sent(1, 2), h) << "rank 1 passes on h3 only, not the skip value";
  EXPECT_EQ(received(2, 1), h);
  EXPECT_EQ(sent(2, 0), h) << "h0's gradient comes back directly";
  EXPECT_EQ(received(0, 2), h);
  EXPECT_EQ(sent(2, 1), h);
  EXPECT_EQ(sent(1, 0), h);
  if (HasFailure()) std::cerr << (*cluster)->Logs();
}

// Largest per-stage forward + backward time of the cut `bounds` over the profiled `layers`.
double SlowestStage(const v1::Job& profiled, const std::vector<int>& bounds) {
  double slowest = 0;
  for (size_t s = 0; s + 1 < bounds.size(); ++s) {
    double t = 0;
    for (int l = bounds[s]; l < bounds[s + 1]; ++l) {
      t += profiled.layers(l).forward_seconds() + profiled.layers(l).backward_seconds();
    }
    slowest = std::max(slowest, t);
  }
  return slowest;
}

TEST_F(TorchScriptTraining, ProfiledSplitsAHeavyLayerOffAndLowersTheSlowestStage) {
  ClusterOptions options;
  options.workers = 3;
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::vector<Layer> layers = ChildLayers(Fixtures::Get().Path("heavy.pt"));
  ASSERT_EQ(layers.size(), 6u);

  std::vector<Job> jobs(2);
  // Two layers a stage, as counting layers cuts it (equal-layers itself weighs these layers by
  // their parameters, orders of magnitude apart, and puts the heavy one alone).
  jobs[0].name = "heavy-two-layers-a-stage";
  jobs[0].split = R"({points: {"2": beginning, "4": beginning}})";
  jobs[1].name = "heavy-profiled";
  jobs[1].split = "{stages: 3, policy: profiled}";
  jobs[1].upload = true;
  for (Job& j : jobs) {
    j.model = "heavy.pt";
    j.workers = 3;
    j.stages = 3;
    // SGD: AdamW's first steps move every weight by about lr whatever its gradient, so the
    // 512x512 layers' near-zero gradients would turn float rounding into visible differences.
    j.ref = Ref(8, 4, "mse", "sgd", 0.2, 0.9);
    Submit(**cluster, j);
    if (HasFatalFailure()) return;
  }
  std::vector<v1::Job> done;
  for (const Job& j : jobs) {
    auto job = (*cluster)->WaitForJob(j.id, IsFinal, absl::Seconds(240));
    ASSERT_TRUE(job.ok()) << j.name << ": " << job.status() << (*cluster)->Logs();
    CheckTrainedJob(*job, j, layers);
    done.push_back(*job);
  }
  if (HasFatalFailure()) return;
  const std::vector<int> equal = Boundaries(done[0]), profiled = Boundaries(done[1]);
  EXPECT_EQ(equal, (std::vector<int>{0, 2, 4, 6}));
  EXPECT_NE(profiled, equal);
  for (const v1::LayerInfo& l : done[1].layers()) {
    ASSERT_GT(l.forward_seconds() + l.backward_seconds(), 0.0) << l.name() << " not profiled";
  }
  const double t_equal = SlowestStage(done[1], equal), t_profiled = SlowestStage(done[1], profiled);
  std::cerr << "slowest stage: two layers a stage " << t_equal << " s, profiled " << t_profiled
            << " s; profiled cut " << absl::StrJoin(profiled, ",") << "\n";
  EXPECT_LT(t_profiled, t_equal);
  if (HasFailure()) std::cerr << (*cluster)->Logs();
}

TEST_F(TorchScriptTraining, AnUnknownSplitPointAndAFileThatIsNotTorchScriptAreClearErrors) {
  ClusterOptions options;
  options.workers = 2;
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();

  Job j;
  j.name = "bad-point";
  j.model = "sequential.pt";
  j.split = R"({points: {"layer9": beginning}})";
  j.workers = 2;
  j.stages = 2;
  j.ref = Ref(8, 2, "mse", "sgd", 0.01);
  WriteData(**cluster, j);
  if (HasFatalFailure()) return;
  const std::string spec =
      (*cluster)->WriteFile("bad-point.yaml", SpecYaml(j, Fixtures::Get().Path("sequential.pt")));
  CommandResult r = (*cluster)->Stagectl({"submit", spec, "--wait"}, absl::Seconds(120));
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("split.points"));
  EXPECT_THAT(r.err, HasSubstr("layer9"));
  // The valid names are listed.
  EXPECT_THAT(r.err, HasSubstr("0, 1, 2, 3, 4, 5, 6, 7")) << r.err;

  // A file that is not TorchScript, by path and uploaded.
  const std::string junk = (*cluster)->WriteFile("junk.pt", "this is not a TorchScript archive\n");
  j.name = "not-torchscript";
  j.split = "{stages: 2}";
  const std::string by_path = (*cluster)->WriteFile("junk-path.yaml", SpecYaml(j, junk));
  r = (*cluster)->Stagectl({"submit", by_path, "--wait"}, absl::Seconds(120));
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("model.torchscript"));
  EXPECT_THAT(r.err, HasSubstr(junk));
  EXPECT_THAT(r.err, HasSubstr("TorchScript"));

  const std::string uploaded =
      (*cluster)->WriteFile("junk-upload.yaml", SpecYaml(j, "uploaded-model.pt"));
  r = (*cluster)->Stagectl({"submit", uploaded, "--model", junk, "--wait"}, absl::Seconds(120));
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("model.torchscript"));
  EXPECT_THAT(r.err, HasSubstr("TorchScript"));
  if (HasFailure()) std::cerr << (*cluster)->Logs();
}

}  // namespace
}  // namespace stagecoach::testing::torchscript_training_test
