// model::InspectModel (worker/runtime/inspect/inspect.h): the layers and parameter counts of
// built-in models and of TorchScript files (tests/models/make_models.py, written by
// /usr/bin/python3 with PyTorch at test time; those tests are skipped without it), and profiled
// forward/backward times: every layer measured, the heaviest layer measured slowest, through skip
// connections too; models or data that cannot be inspected are refused naming the field.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/spec/spec_parser.h"
#include "common/util/sha256.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/python.h"
#include "tests/support/test_paths.h"
#include "worker/runtime/inspect/inspect.h"

namespace stagecoach::model::inspect_model_test {
namespace {

using ::stagecoach::testing::kPython;
using ::stagecoach::testing::PythonHasTorch;

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<std::string> Names(const v1::InspectModelResponse& r) {
  std::vector<std::string> out;
  for (const auto& layer : r.layers()) out.push_back(layer.name());
  return out;
}

// Index of the layer with the largest forward + backward time.
int Slowest(const v1::InspectModelResponse& r) {
  int best = 0;
  for (int i = 1; i < r.layers_size(); ++i) {
    const auto& a = r.layers(i);
    const auto& b = r.layers(best);
    if (a.forward_seconds() + a.backward_seconds() > b.forward_seconds() + b.backward_seconds()) {
      best = i;
    }
  }
  return best;
}

spec::JobSpec MustParse(const std::string& yaml) {
  auto spec = spec::ParseJobSpec(yaml, "test");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : spec::JobSpec();
}

spec::JobSpec MlpSpec(const std::string& sizes) {
  return MustParse(absl::StrCat("name: t\nmodel: {builtin: {family: mlp, sizes: ", sizes,
                                "}}\nsplit: {stages: 2}\nschedule: {kind: GPipe, microbatches: "
                                "2}\ntraining: {batch_size: 64}\n"));
}

TEST(InspectModel, BuiltinMlpLayersWithoutProfile) {
  auto r = InspectModel(MlpSpec("[4, 8, 6, 2]"), false, 0, "", "cpu");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(Names(*r), ElementsAre("0", "1", "2"));
  EXPECT_EQ(r->layers(0).parameters(), 4 * 8 + 8);
  EXPECT_EQ(r->layers(1).parameters(), 8 * 6 + 6);
  EXPECT_EQ(r->layers(2).parameters(), 6 * 2 + 2);
  EXPECT_EQ(r->layers(1).forward_seconds(), 0.0);
  EXPECT_TRUE(r->sequential());
  EXPECT_EQ(r->model_sha256(), "");
}

TEST(InspectModel, BuiltinGptLayers) {
  spec::JobSpec spec = MustParse(
      "name: t\nmodel: {builtin: {family: gpt, vocab: 32, d_model: 8, layers: 2, heads: 2, "
      "seq: 4}}\nsplit: {stages: 2}\nschedule: {kind: GPipe, microbatches: 2}\n"
      "training: {batch_size: 4, loss: cross_entropy}\n");
  auto r = InspectModel(spec, false, 0, "", "cpu");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(Names(*r), ElementsAre("embed", "blocks.0", "blocks.1", "norm", "head"));
  const int64_t d = 8;
  EXPECT_EQ(r->layers(0).parameters(), 32 * d + 4 * d);
  EXPECT_EQ(r->layers(1).parameters(), 12 * d * d + 13 * d);
  EXPECT_EQ(r->layers(3).parameters(), 2 * d);
  EXPECT_EQ(r->layers(4).parameters(), d * 32);
}

TEST(InspectModel, ProfilesABuiltinGptOnATokensFile) {
  char tmpl[] = "/tmp/inspect_model_tokens_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string path = absl::StrCat(tmpl, "/train.bin");
  {
    std::ofstream out(path, std::ios::binary);
    for (uint16_t t = 0; t < 200; ++t) {
      const uint16_t token = t % 32;
      out.write(reinterpret_cast<const char*>(&token), sizeof(token));
    }
  }
  spec::JobSpec spec = MustParse(absl::StrCat(
      "name: t\nmodel: {builtin: {family: gpt, vocab: 32, d_model: 16, layers: 2, heads: 2, "
      "seq: 8}}\nsplit: {stages: 2, policy: profiled}\nschedule: {kind: GPipe, microbatches: "
      "2}\ntraining: {batch_size: 4, loss: cross_entropy}\ndata: {kind: tokens, path: ",
      path, "}\n"));
  auto r = InspectModel(spec, true, 2, "", "cpu");
  std::remove(path.c_str());
  rmdir(tmpl);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->layers_size(), 5);
  for (const auto& layer : r->layers()) {
    EXPECT_GT(layer.forward_seconds(), 0) << layer.name();
    // The embedding's input is token ids (no gradient), but its tables learn.
    EXPECT_GT(layer.backward_seconds(), 0) << layer.name();
  }
}

TEST(InspectModel, ProfilesEveryBuiltinLayerAndFindsTheHeaviest) {
  // Layer 2 (512 x 512) does far more work than the others.
  auto r = InspectModel(MlpSpec("[8, 16, 512, 512, 8]"), true, 5, "", "cpu");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->layers_size(), 4);
  for (const auto& layer : r->layers()) {
    EXPECT_GT(layer.forward_seconds(), 0) << layer.name();
    // Every layer has parameters, so every backward does work (layer 0's input is data).
    EXPECT_GT(layer.backward_seconds(), 0) << layer.name();
  }
  EXPECT_EQ(Slowest(*r), 2);
}

TEST(InspectModel, ProfilingNeedsDataTheModelTakes) {
  spec::JobSpec spec = MlpSpec("[4, 8, 2]");
  spec.data.kind = "tokens";
  spec.data.path = "/nonexistent/train.bin";
  auto r = InspectModel(spec, true, 1, "", "cpu");
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("data."));
  // Without profiling the data is not read.
  EXPECT_TRUE(InspectModel(spec, false, 1, "", "cpu").ok());
}

// A tensors data file for the fixtures with 16 input features.
constexpr char kDataWriter[] = R"PY(
import sys, torch
torch.manual_seed(0)
torch.save({"inputs": torch.randn(64, 16), "targets": torch.randn(64, 4)}, sys.argv[1] + "/x16.pt")
open(sys.argv[1] + "/text.pt", "w").write("not a TorchScript file\n")
)PY";

class InspectTorchScriptTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!PythonHasTorch()) return;
    char tmpl[] = "/tmp/inspect_model_test_XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return;
    const std::string dir = tmpl;
    const std::string models = testing::MakeModelsScript();
    const std::string writer = dir + "/write_data.py";
    std::ofstream(writer) << kDataWriter;
    if (std::system(absl::StrCat(kPython, " '", models, "' '", dir, "'").c_str()) == 0 &&
        std::system(absl::StrCat(kPython, " '", writer, "' '", dir, "'").c_str()) == 0) {
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

  // A spec for model `name` trained on the 16-feature tensors file.
  static spec::JobSpec Spec(const std::string& name) {
    return MustParse(absl::StrCat("name: t\nmodel: {torchscript: ", name,
                                  "}\nsplit: {stages: 2, policy: profiled}\n"
                                  "schedule: {kind: GPipe, microbatches: 2}\n"
                                  "training: {batch_size: 16}\n"
                                  "data: {kind: tensors, path: ",
                                  Path("x16.pt"), "}\n"));
  }

  static std::string dir_;
};

std::string InspectTorchScriptTest::dir_;

TEST_F(InspectTorchScriptTest, SequentialModelLayersParametersAndDigest) {
  // The reference path ("seq.pt") is what the spec says; the resolved local path is inspected.
  auto r = InspectModel(Spec("seq.pt"), false, 0, Path("sequential.pt"), "cpu");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(Names(*r), ElementsAre("0", "1", "2", "3", "4", "5", "6", "7"));
  EXPECT_TRUE(r->sequential());
  // Linear(16, 32), ReLU, Block(32, 32), ..., Linear(24, 4).
  EXPECT_EQ(r->layers(0).parameters(), 16 * 32 + 32);
  EXPECT_EQ(r->layers(1).parameters(), 0);
  EXPECT_EQ(r->layers(2).parameters(), 32 * 32 + 32);
  EXPECT_EQ(r->layers(7).parameters(), 24 * 4 + 4);
  auto digest = Sha256OfFile(Path("sequential.pt"));
  ASSERT_TRUE(digest.ok());
  EXPECT_EQ(r->model_sha256(), *digest);
  EXPECT_EQ(r->layers(0).forward_seconds(), 0.0);
}

TEST_F(InspectTorchScriptTest, ProfileFindsTheHeavyLayer) {
  auto r = InspectModel(Spec("heavy.pt"), true, 5, Path("heavy.pt"), "cpu");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->layers_size(), 6);
  for (const auto& layer : r->layers()) EXPECT_GT(layer.forward_seconds(), 0) << layer.name();
  EXPECT_GT(r->layers(2).backward_seconds(), 0);
  EXPECT_EQ(r->layers(Slowest(*r)).name(), "2");
}

TEST_F(InspectTorchScriptTest, ProfilesThroughSkipConnections) {
  auto r = InspectModel(Spec("skip.pt"), true, 2, Path("skip.pt"), "cpu");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(Names(*r), ElementsAre("a", "b", "c", "d", "e", "f"));
  EXPECT_FALSE(r->sequential());
  for (const auto& layer : r->layers()) {
    EXPECT_GT(layer.forward_seconds(), 0) << layer.name();
    EXPECT_GT(layer.backward_seconds(), 0) << layer.name();
  }
}

TEST_F(InspectTorchScriptTest, RefusesWhatCannotBeInspectedNamingTheField) {
  auto text = InspectModel(Spec("text.pt"), false, 0, Path("text.pt"), "cpu");
  ASSERT_FALSE(text.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(text.status())) << text.status();
  EXPECT_THAT(std::string(text.status().message()), HasSubstr("model.torchscript"));

  auto missing = InspectModel(Spec("gone.pt"), false, 0, Path("gone.pt"), "cpu");
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("model.torchscript"));

  // A branch between b and c: the model cannot be cut at every layer, so not profiled.
  spec::JobSpec branchy = Spec("branchy.pt");
  auto r = InspectModel(branchy, true, 1, Path("branchy.pt"), "cpu");
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("split.policy: 'profiled' times every layer apart, but the model cannot "
                        "be cut at every layer"));
  // Its layers are still reported without profiling.
  auto layers = InspectModel(branchy, false, 0, Path("branchy.pt"), "cpu");
  ASSERT_TRUE(layers.ok()) << layers.status();
  EXPECT_EQ(layers->layers_size(), 4);

  // Inputs of the wrong width for the model: the failing layer is named.
  spec::JobSpec blocks = Spec("blocks.pt");  // takes 8 features, gets 16
  auto mismatch = InspectModel(blocks, true, 1, Path("blocks.pt"), "cpu");
  ASSERT_FALSE(mismatch.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(mismatch.status())) << mismatch.status();
  EXPECT_THAT(std::string(mismatch.status().message()),
              HasSubstr("model.torchscript: profiling on one microbatch of the spec's data, the "
                        "forward of layer embed failed"));
}

}  // namespace
}  // namespace stagecoach::model::inspect_model_test
