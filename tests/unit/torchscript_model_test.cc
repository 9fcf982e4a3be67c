// TorchScriptModel (worker/model/torchscript_model.h) on the fixtures of
// tests/models/make_models.py, written by /usr/bin/python3 with PyTorch at test time: each model's
// layers and parameter counts, whether it is sequential, the wiring of several splits (a skip
// value goes straight from its producer to its consumer), the stages chained through that wiring
// against the whole module's forward and parameter gradients (backward run stage by stage across
// detached inputs, as a pipeline does), KeepOnlyStages, and every refused file and cut.
#include "worker/model/torchscript_model.h"

#include <torch/script.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/python.h"
#include "tests/support/test_paths.h"

namespace stagecoach::model::torchscript_model_test {
namespace {

using ::stagecoach::testing::kPython;
using ::stagecoach::testing::PythonHasTorch;

using ::testing::HasSubstr;
using ::testing::StartsWith;

// The result of running a model's stages chained through their wiring.
struct ChainRun {
  torch::Tensor output;
  // Parameter gradients by qualified name, from every stage.
  std::map<std::string, torch::Tensor> grads;
  // Names of the autograd nodes the stages recorded.
  std::set<std::string> grad_fns;
};

void CollectGradFns(const torch::Tensor& t, std::set<std::string>* names) {
  std::vector<std::shared_ptr<torch::autograd::Node>> todo;
  std::set<torch::autograd::Node*> seen;
  if (t.grad_fn()) todo.push_back(t.grad_fn());
  while (!todo.empty()) {
    std::shared_ptr<torch::autograd::Node> n = todo.back();
    todo.pop_back();
    if (!seen.insert(n.get()).second) continue;
    names->insert(n->name());
    for (const torch::autograd::Edge& e : n->next_edges()) {
      if (e.function) todo.push_back(e.function);
    }
  }
}

// Forward through every stage in order, each stage's inputs detached from their producers and
// (floating-point ones) requiring grad; then loss = sum(output * weight) and backward stage by
// stage, last first, each stage's input gradients handed to the outputs they came from.
ChainRun RunChain(std::vector<std::unique_ptr<StageModel>>& stages, const PipelineWiring& wiring,
                  const torch::Tensor& x, const torch::Tensor& weight) {
  const int n = static_cast<int>(stages.size());
  std::vector<std::vector<torch::Tensor>> inputs(n), outputs(n);
  ChainRun run;
  for (int s = 0; s < n; ++s) {
    for (const ValueSource& src : wiring[s].inputs) {
      torch::Tensor v = src.stage < 0 ? x : outputs[src.stage][src.index];
      // Values that are not floating point (masks, conditions) carry no gradient.
      inputs[s].push_back(v.detach().requires_grad_(v.is_floating_point()));
    }
    outputs[s] = stages[s]->ForwardValues(inputs[s]);
    EXPECT_EQ(static_cast<int>(outputs[s].size()), wiring[s].num_outputs) << "stage " << s;
    for (const torch::Tensor& o : outputs[s]) CollectGradFns(o, &run.grad_fns);
  }
  run.output = outputs[n - 1].at(0);
  std::vector<std::vector<torch::Tensor>> out_grads(n);
  for (int s = 0; s < n; ++s) out_grads[s].resize(outputs[s].size());
  for (int s = n - 1; s >= 0; --s) {
    if (s == n - 1) {
      torch::autograd::backward({(run.output * weight).sum()});
    } else {
      std::vector<torch::Tensor> roots, grads;
      for (size_t i = 0; i < outputs[s].size(); ++i) {
        if (!outputs[s][i].requires_grad() || !out_grads[s][i].defined()) continue;
        roots.push_back(outputs[s][i]);
        grads.push_back(out_grads[s][i]);
      }
      if (!roots.empty()) torch::autograd::backward(roots, grads);
    }
    for (size_t i = 0; i < inputs[s].size(); ++i) {
      const ValueSource& src = wiring[s].inputs[i];
      if (src.stage < 0 || !inputs[s][i].grad().defined()) continue;
      torch::Tensor& g = out_grads[src.stage][src.index];
      g = g.defined() ? g + inputs[s][i].grad() : inputs[s][i].grad();
    }
  }
  for (auto& stage : stages) {
    for (auto& [name, p] : stage->NamedParameters()) {
      EXPECT_EQ(run.grads.count(name), 0u) << name << " is in two stages";
      run.grads[name] = p.grad();
    }
  }
  return run;
}

class TorchScriptModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!PythonHasTorch()) return;
    char tmpl[] = "/tmp/torchscript_model_test_XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return;
    const std::string dir = tmpl;
    const std::string script = testing::MakeModelsScript();
    const std::string nested = testing::NestedModelsScript();
    if (std::system(absl::StrCat(kPython, " '", script, "' '", dir, "' && ", kPython, " '", nested,
                                 "' '", dir, "'")
                        .c_str()) == 0) {
      dir_ = dir;
    }
  }
  static void TearDownTestSuite() {
    if (!dir_.empty()) std::system(absl::StrCat("rm -rf '", dir_, "'").c_str());
    dir_.clear();
  }
  void SetUp() override {
    if (!PythonHasTorch()) GTEST_SKIP() << kPython << " cannot import torch";
    ASSERT_FALSE(dir_.empty()) << kPython << " did not write the TorchScript fixtures";
  }

  static std::string Path(const std::string& name) { return absl::StrCat(dir_, "/", name); }

  std::unique_ptr<TorchScriptModel> Load(const std::string& name,
                                         const std::vector<std::string>& toward = {}) {
    auto model = TorchScriptModel::Load(Path(name), "model.torchscript", toward);
    EXPECT_TRUE(model.ok()) << model.status();
    return model.ok() ? std::move(*model) : nullptr;
  }

  std::string LoadError(const std::string& path) {
    auto model = TorchScriptModel::Load(path);
    EXPECT_FALSE(model.ok()) << path;
    if (model.ok()) return "";
    EXPECT_TRUE(absl::IsInvalidArgument(model.status())) << model.status();
    return std::string(model.status().message());
  }

  std::string SplitError(const std::string& name, const std::vector<int>& cuts) {
    auto model = Load(name);
    if (!model) return "";
    auto wiring = model->Split(cuts);
    EXPECT_FALSE(wiring.ok()) << name;
    if (wiring.ok()) return "";
    EXPECT_TRUE(absl::IsInvalidArgument(wiring.status())) << wiring.status();
    return std::string(wiring.status().message());
  }

  // Splits `name` at `cuts`, runs the chained stages on `x` and compares the output and every
  // parameter gradient with the whole module's (loaded separately by LibTorch). Returns the wiring.
  PipelineWiring CheckSplit(const std::string& name, const std::vector<int>& cuts,
                            const torch::Tensor& x, const std::vector<std::string>& toward = {}) {
    SCOPED_TRACE(absl::StrCat(name, " cut at [", absl::StrJoin(cuts, ", "), "]"));
    auto model = Load(name, toward);
    if (!model) return {};
    auto wiring = model->Split(cuts);
    EXPECT_TRUE(wiring.ok()) << wiring.status();
    if (!wiring.ok()) return {};
    EXPECT_EQ(wiring->size(), cuts.size());
    std::vector<std::unique_ptr<StageModel>> stages;
    for (size_t s = 0; s < cuts.size(); ++s) {
      auto stage = model->Stage(static_cast<int>(s));
      EXPECT_TRUE(stage.ok()) << stage.status();
      if (!stage.ok()) return {};
      stages.push_back(std::move(*stage));
    }

    torch::jit::Module whole = torch::jit::load(Path(name));
    torch::Tensor expected = whole.forward({x}).toTensor();
    torch::Tensor weight = torch::linspace(-1.0, 1.0, expected.numel()).reshape(expected.sizes());
    (expected * weight).sum().backward();

    // Run several times: an optimising graph executor would switch plans after profiling runs.
    ChainRun run;
    for (int i = 0; i < 3; ++i) {
      for (auto& stage : stages) {
        for (auto& [n, p] : stage->NamedParameters()) p.mutable_grad() = torch::Tensor();
      }
      run = RunChain(stages, *wiring, x, weight);
    }
    EXPECT_LE((run.output - expected).abs().max().item<double>(), 1e-6);
    EXPECT_TRUE(run.grad_fns.count("AddmmBackward0"))
        << "no plain ATen nodes: " << absl::StrJoin(run.grad_fns, ", ");
    for (const std::string& fn : run.grad_fns) {
      EXPECT_THAT(fn, ::testing::Not(HasSubstr("DifferentiableGraph")));
    }
    std::set<std::string> names;
    for (const auto& p : whole.named_parameters(true)) {
      names.insert(p.name);
      auto it = run.grads.find(p.name);
      if (it == run.grads.end()) {
        ADD_FAILURE() << "no stage holds parameter " << p.name;
        continue;
      }
      // A branch not taken leaves its parameters without gradient, in both.
      EXPECT_EQ(it->second.defined(), p.value.grad().defined()) << p.name;
      if (!it->second.defined() || !p.value.grad().defined()) continue;
      EXPECT_LE((it->second - p.value.grad()).abs().max().item<double>(), 1e-6) << p.name;
    }
    EXPECT_EQ(names.size(), run.grads.size()) << "stages name parameters the module lacks";
    return *wiring;
  }

  static std::string dir_;
};

std::string TorchScriptModelTest::dir_;

struct LayerCase {
  std::string file;
  bool sequential;
  std::vector<std::pair<std::string, int64_t>> layers;
};

TEST_F(TorchScriptModelTest, LayersAndParameterCounts) {
  const std::vector<LayerCase> cases = {
      {"sequential.pt",
       true,
       {{"0", 16 * 32 + 32},
        {"1", 0},
        {"2", 32 * 32 + 32},
        {"3", 32 * 32 + 32},
        {"4", 32 * 32 + 32},
        {"5", 0},
        {"6", 32 * 24 + 24},
        {"7", 24 * 4 + 4}}},
      // e owns the top-level `scale` (32), read after e's call.
      {"skip.pt",
       false,
       {{"a", 16 * 32 + 32},
        {"b", 32 * 32 + 32},
        {"c", 32 * 32 + 32},
        {"d", 32 * 32 + 32},
        {"e", 32 * 32 + 32 + 32},
        {"f", 32 * 4 + 4}}},
      {"heavy.pt",
       true,
       {{"0", 16 * 16 + 16},
        {"1", 0},
        {"2", (16 * 512 + 512) + 2 * (512 * 512 + 512) + (512 * 16 + 16)},
        {"3", 16 * 16 + 16},
        {"4", 0},
        {"5", 16 * 4 + 4}}},
      {"blocks.pt",
       false,
       {{"embed", 8 * 16 + 16},
        {"blocks.0", 16 * 16 + 16},
        {"blocks.1", 16 * 16 + 16},
        {"blocks.2", 16 * 16 + 16},
        {"head", 16 * 4 + 4}}},
      {"branchy.pt", false, {{"a", 72}, {"b", 72}, {"c", 72}, {"d", 36}}},
      {"shared.pt", false, {{"a", 72}, {"b", 72}}},
      // a owns the top-level `bias` (8), first read after a's call.
      {"helper.pt", false, {{"a", 72 + 8}, {"b", 72}, {"c", 36}}},
      // body holds 816 of 1,028 parameters in a stack of blocks, but calls them inside an if:
      // not opened.
      {"gated.pt", true, {{"embed", 8 * 16 + 16}, {"body", 3 * (16 * 16 + 16)}, {"head", 68}}},
  };
  for (const LayerCase& c : cases) {
    SCOPED_TRACE(c.file);
    auto model = Load(c.file);
    ASSERT_NE(model, nullptr);
    EXPECT_EQ(model->sequential(), c.sequential);
    std::vector<std::pair<std::string, int64_t>> got;
    int64_t total = 0;
    for (const ModelLayer& layer : model->layers()) {
      got.emplace_back(layer.name, layer.parameters);
      total += layer.parameters;
    }
    EXPECT_EQ(got, c.layers);
    EXPECT_EQ(model->HeldParameterCount(), total);
  }
}

TEST_F(TorchScriptModelTest, SequentialSplitsAreChains) {
  torch::manual_seed(1);
  const torch::Tensor x = torch::randn({5, 16});
  EXPECT_TRUE(IsChain(CheckSplit("sequential.pt", {0, 2, 4, 6}, x)));
  EXPECT_TRUE(IsChain(CheckSplit("sequential.pt", {0, 3}, x)));
  EXPECT_TRUE(IsChain(CheckSplit("sequential.pt", {0}, x)));
  EXPECT_TRUE(IsChain(CheckSplit("heavy.pt", {0, 2, 3}, x)));
}

TEST_F(TorchScriptModelTest, SequentialStageNamesParametersAsTheModule) {
  auto model = Load("sequential.pt");
  ASSERT_NE(model, nullptr);
  ASSERT_TRUE(model->Split({0, 2, 4, 6}).ok());
  auto stage = model->Stage(1);
  ASSERT_TRUE(stage.ok()) << stage.status();
  std::vector<std::string> names;
  for (auto& [name, p] : (*stage)->NamedParameters()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"2.linear.weight", "2.linear.bias", "3.linear.weight",
                                             "3.linear.bias"}));
}

TEST_F(TorchScriptModelTest, SkipValueGoesFromProducerToConsumer) {
  torch::manual_seed(2);
  const torch::Tensor x = torch::randn({6, 16});
  PipelineWiring wiring = CheckSplit("skip.pt", {0, 2, 4}, x);
  ASSERT_EQ(wiring.size(), 3u);
  // Stage 0 (a, b) passes on x (used by d), h0 (used by e) and h1 (used by c), in that order.
  EXPECT_EQ(wiring[0].inputs, (std::vector<ValueSource>{{-1, 0}}));
  EXPECT_EQ(wiring[0].num_outputs, 3);
  // Stage 1 (c, d): x and h1 from stage 0.
  EXPECT_EQ(wiring[1].inputs, (std::vector<ValueSource>{{0, 0}, {0, 2}}));
  EXPECT_EQ(wiring[1].num_outputs, 1);
  // Stage 2 (e, f): h0 straight from stage 0, h3 from stage 1.
  EXPECT_EQ(wiring[2].inputs, (std::vector<ValueSource>{{0, 1}, {1, 0}}));
  EXPECT_EQ(wiring[2].num_outputs, 1);
  EXPECT_FALSE(IsChain(wiring));

  CheckSplit("skip.pt", {0, 1, 2, 3, 4, 5}, x);
  CheckSplit("skip.pt", {0, 3}, x);
  CheckSplit("skip.pt", {0}, x);
}

TEST_F(TorchScriptModelTest, GraphStageNamesParametersAsTheModule) {
  auto model = Load("skip.pt");
  ASSERT_NE(model, nullptr);
  ASSERT_TRUE(model->Split({0, 2, 4}).ok());
  auto stage = model->Stage(2);
  ASSERT_TRUE(stage.ok()) << stage.status();
  std::vector<std::string> names;
  for (auto& [name, p] : (*stage)->NamedParameters()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"e.linear.weight", "e.linear.bias", "f.weight",
                                             "f.bias", "scale"}));
}

TEST_F(TorchScriptModelTest, LoopedBlocksAndNonTensorValues) {
  torch::manual_seed(3);
  const torch::Tensor x = torch::randn({4, 8});
  // x.size(0) crosses to the last stage: recomputed there from x, which stage 0 passes on.
  PipelineWiring wiring = CheckSplit("blocks.pt", {0, 2, 4}, x);
  ASSERT_EQ(wiring.size(), 3u);
  EXPECT_EQ(wiring[2].inputs, (std::vector<ValueSource>{{0, 0}, {1, 0}}));
  CheckSplit("blocks.pt", {0, 1, 2, 3, 4}, x);
}

TEST_F(TorchScriptModelTest, HelperMethodsAndSharedTopLevelParameters) {
  torch::manual_seed(6);
  const torch::Tensor x = torch::randn({3, 8});
  // Stage 0 passes on `bias` (read first) and a(x) + bias; stage 1 adds bias again.
  PipelineWiring wiring = CheckSplit("helper.pt", {0, 1, 2}, x);
  ASSERT_EQ(wiring.size(), 3u);
  EXPECT_EQ(wiring[0].num_outputs, 2);
  EXPECT_EQ(wiring[1].inputs, (std::vector<ValueSource>{{0, 0}, {0, 1}}));
  EXPECT_EQ(wiring[2].inputs, (std::vector<ValueSource>{{1, 0}}));
  CheckSplit("helper.pt", {0, 2}, x);
}

TEST_F(TorchScriptModelTest, ControlFlowKeptWhole) {
  torch::manual_seed(4);
  for (double sign : {1.0, -1.0}) {
    const torch::Tensor x = sign * (torch::rand({3, 8}) + 1.0);
    // Stage 0 (a and the condition) passes on h and the condition's tensor; stage 1 runs the if.
    PipelineWiring wiring = CheckSplit("branchy.pt", {0, 1, 3}, x);
    ASSERT_EQ(wiring.size(), 3u);
    EXPECT_EQ(wiring[1].inputs, (std::vector<ValueSource>{{0, 0}, {0, 1}}));
    EXPECT_EQ(wiring[2].inputs, (std::vector<ValueSource>{{1, 0}}));
  }
}

TEST_F(TorchScriptModelTest, KeepOnlyStagesReleasesTheOthers) {
  auto model = Load("skip.pt");
  ASSERT_NE(model, nullptr);
  ASSERT_TRUE(model->Split({0, 2, 4}).ok());
  auto before = model->Stage(1);
  ASSERT_TRUE(before.ok());
  torch::manual_seed(5);
  const std::vector<torch::Tensor> inputs = {torch::randn({2, 16}), torch::randn({2, 32})};
  torch::Tensor expected = (*before)->ForwardValues(inputs).at(0);

  ASSERT_TRUE(model->KeepOnlyStages({1}).ok());
  const auto& layers = model->layers();
  EXPECT_EQ(model->HeldParameterCount(), layers[2].parameters + layers[3].parameters);
  EXPECT_FALSE(model->Stage(0).ok());
  EXPECT_FALSE(model->Stage(2).ok());
  auto kept = model->Stage(1);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_TRUE(torch::equal((*kept)->ForwardValues(inputs).at(0), expected));

  auto seq = Load("sequential.pt");
  ASSERT_NE(seq, nullptr);
  ASSERT_TRUE(seq->Split({0, 2, 4, 6}).ok());
  ASSERT_TRUE(seq->KeepOnlyStages({0, 2}).ok());
  const auto& sl = seq->layers();
  EXPECT_EQ(seq->HeldParameterCount(),
            sl[0].parameters + sl[1].parameters + sl[4].parameters + sl[5].parameters);
  EXPECT_TRUE(seq->Stage(2).ok());
  EXPECT_FALSE(seq->Stage(3).ok());
}

TEST_F(TorchScriptModelTest, RefusesFilesThatAreNotModels) {
  const std::string text = Path("text.pt");
  std::system(absl::StrCat("echo 'not a model' > '", text, "'").c_str());
  EXPECT_THAT(LoadError(text),
              StartsWith(absl::StrCat("model.torchscript: '", text,
                                      "' is not a TorchScript file (torch.jit.save): ")));
  const std::string state_dict = Path("state_dict.pt");
  EXPECT_THAT(LoadError(state_dict),
              StartsWith(absl::StrCat("model.torchscript: '", state_dict,
                                      "' is not a TorchScript file (torch.jit.save): ")));
  EXPECT_THAT(
      LoadError(Path("missing.pt")),
      AllOf(HasSubstr("model.torchscript"), HasSubstr("missing.pt"), HasSubstr("no such file")));
  EXPECT_THAT(LoadError(Path("nolayer.pt")), AllOf(HasSubstr("nolayer.pt"), HasSubstr("no layer")));
}

TEST_F(TorchScriptModelTest, RefusesImpossibleCuts) {
  EXPECT_THAT(SplitError("branchy.pt", {0, 2}),
              AllOf(HasSubstr("layer 'c'"), HasSubstr("control flow"), HasSubstr("'b'")));
  EXPECT_THAT(SplitError("branchy.pt", {0, 1, 2}), HasSubstr("control flow"));
  EXPECT_THAT(SplitError("shared.pt", {0, 1}),
              AllOf(HasSubstr("layer 'a'"), HasSubstr("called both before and after")));
  EXPECT_THAT(SplitError("skip.pt", {1, 2}), HasSubstr("layer 0"));
  EXPECT_THAT(SplitError("skip.pt", {0, 2, 2}), HasSubstr("increase strictly"));
  EXPECT_THAT(SplitError("skip.pt", {0, 6}), HasSubstr("6 layers"));
}

std::vector<std::pair<std::string, int64_t>> LayersOf(TorchScriptModel& model) {
  std::vector<std::pair<std::string, int64_t>> out;
  for (const ModelLayer& layer : model.layers()) out.emplace_back(layer.name, layer.parameters);
  return out;
}

// The encoder holds 9,008 of the ViT's 9,893 parameters around a stack of four blocks: its call
// and its nn.Sequential's are opened, the blocks are layers. conv_proj owns the class token and
// the encoder's position embedding (both read after its call, before the first block's).
TEST_F(TorchScriptModelTest, AnEncoderAroundAStackOfBlocksIsOpened) {
  auto model = Load("vit.pt");
  ASSERT_NE(model, nullptr);
  constexpr int64_t kBlock = 32 + (16 * 48 + 48) + (16 * 16 + 16) + 32 + (16 * 32 + 32) +
                             (32 * 16 + 16);
  EXPECT_EQ(LayersOf(*model), (std::vector<std::pair<std::string, int64_t>>{
                                  {"conv_proj", 3 * 16 * 16 + 16 + 16 + 5 * 16},
                                  {"encoder.layers.encoder_layer_0", kBlock},
                                  {"encoder.layers.encoder_layer_1", kBlock},
                                  {"encoder.layers.encoder_layer_2", kBlock},
                                  {"encoder.layers.encoder_layer_3", kBlock},
                                  {"encoder.ln", 32},
                                  {"heads", 16 * 5 + 5}}));
  EXPECT_EQ(model->HeldParameterCount(), 9893);
  torch::manual_seed(7);
  const torch::Tensor x = torch::randn({3, 3, 8, 8});
  CheckSplit("vit.pt", {0, 3}, x);
  CheckSplit("vit.pt", {0, 2, 3, 4}, x);
  CheckSplit("vit.pt", {0, 1, 2, 3, 4, 5, 6}, x);
}

// `h + self.extras.pos_embedding` between block1 and block2: the parameter belongs to block1's
// stage, wherever the cut; the buffer nothing reads stays with layer 0; KeepOnlyStages keeps it.
TEST_F(TorchScriptModelTest, ATensorOfAnUncalledModuleGoesToTheStageThatReadsIt) {
  auto model = Load("attrread.pt");
  ASSERT_NE(model, nullptr);
  constexpr int64_t kBlock = 2 * 8 * 8 * 9 + 4 * 8;
  EXPECT_EQ(LayersOf(*model), (std::vector<std::pair<std::string, int64_t>>{
                                  {"stem", 3 * 8 * 9},
                                  {"block1", kBlock + 8 * 8 * 8},
                                  {"block2", kBlock},
                                  {"head", 8 * 5 + 5}}));
  torch::manual_seed(8);
  const torch::Tensor x = torch::randn({3, 3, 8, 8});
  CheckSplit("attrread.pt", {0, 1}, x);
  CheckSplit("attrread.pt", {0, 2}, x);
  CheckSplit("attrread.pt", {0, 1, 2, 3}, x);

  ASSERT_TRUE(model->Split({0, 1}).ok());
  ASSERT_TRUE(model->KeepOnlyStages({1}).ok());
  auto stage = model->Stage(1);
  ASSERT_TRUE(stage.ok()) << stage.status();
  std::map<std::string, torch::Tensor> params;
  for (auto& [name, p] : (*stage)->NamedParameters()) params[name] = p;
  ASSERT_TRUE(params.count("extras.pos_embedding"));
  EXPECT_EQ(params["extras.pos_embedding"].numel(), 8 * 8 * 8);
  auto first = Load("attrread.pt");
  ASSERT_TRUE(first->Split({0, 1}).ok());
  auto stage0 = first->Stage(0);
  ASSERT_TRUE(stage0.ok());
  std::vector<std::string> buffers;
  for (auto& [name, b] : (*stage0)->NamedBuffers()) buffers.push_back(name);
  EXPECT_THAT(buffers, ::testing::ElementsAre("extras.scale"));
}

// A name inside a layer opens the calls that hold it: heavy.pt's layer "2" (not a stack of
// blocks, so kept whole by default) opened toward "2.mid.2", and its Sequential `mid` with it.
TEST_F(TorchScriptModelTest, ANamedModuleOpensTheCallsThatHoldIt) {
  auto model = Load("heavy.pt", {"2.mid.2"});
  ASSERT_NE(model, nullptr);
  std::vector<std::string> names;
  for (const ModelLayer& layer : model->layers()) names.push_back(layer.name);
  EXPECT_EQ(names, (std::vector<std::string>{"0", "1", "2.up", "2.mid.0", "2.mid.1", "2.mid.2",
                                             "2.mid.3", "2.down", "3", "4", "5"}));
  EXPECT_FALSE(model->sequential());  // torch.relu runs between 2.up and 2.mid.0
  torch::manual_seed(9);
  const torch::Tensor x = torch::randn({4, 16});
  CheckSplit("heavy.pt", {0, 5}, x, {"2.mid.2"});
  CheckSplit("heavy.pt", {0, 3, 7, 9}, x, {"2.mid.2"});
}

TEST_F(TorchScriptModelTest, SplitCandidatesListEveryCalledModuleWithItsParameters) {
  auto model = Load("vit.pt");
  ASSERT_NE(model, nullptr);
  std::map<std::string, SplitCandidate> by_name;
  std::vector<std::string> order;
  for (const SplitCandidate& c : model->SplitCandidates()) {
    by_name[c.name] = c;
    order.push_back(c.name);
  }
  ASSERT_GE(order.size(), 8u);
  EXPECT_EQ(std::vector<std::string>(order.begin(), order.begin() + 5),
            (std::vector<std::string>{"conv_proj", "encoder", "encoder.layers",
                                      "encoder.layers.encoder_layer_0",
                                      "encoder.layers.encoder_layer_0.ln_1"}));
  EXPECT_EQ(by_name["encoder"].parameters, 9008);
  EXPECT_EQ(by_name["encoder"].depth, 0);
  EXPECT_FALSE(by_name["encoder"].layer);
  EXPECT_EQ(by_name["encoder.layers"].depth, 1);
  EXPECT_TRUE(by_name["encoder.layers.encoder_layer_2"].layer);
  EXPECT_EQ(by_name["encoder.layers.encoder_layer_2"].depth, 2);
  // Inside a layer, at any depth: the attention's projections, the MLP's Linear layers.
  EXPECT_EQ(by_name["encoder.layers.encoder_layer_2.self_attention.qkv"].parameters, 16 * 48 + 48);
  EXPECT_EQ(by_name["encoder.layers.encoder_layer_2.self_attention.qkv"].depth, 4);
  EXPECT_FALSE(by_name["encoder.layers.encoder_layer_2.self_attention.qkv"].layer);
  EXPECT_TRUE(by_name.count("encoder.layers.encoder_layer_3.mlp.2"));
  EXPECT_TRUE(by_name["heads"].layer);
  EXPECT_EQ(order.back().rfind("heads", 0), 0u);
}

}  // namespace
}  // namespace stagecoach::model::torchscript_model_test
