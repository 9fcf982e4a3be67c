// tools/export_model.py run as a process with Debian's python3-torch: it turns a user's
// nn.Module (a module file written here) into a TorchScript file that LibTorch loads and that
// gives the module's output, prints the ordered layer names split.points uses (with parameter
// counts as the workers count them, top-level parameters included), and writes a
// starter spec that ParseJobSpec accepts (also with its commented split.points example turned
// on). A module that cannot be scripted is traced instead, saying so; a missing factory is a
// clear error with exit code 1. Skipped when /usr/bin/python3 cannot import torch.
#include <torch/script.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "common/spec/spec_parser.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/process.h"
#include "tests/support/python.h"
#include "tests/support/test_paths.h"

namespace stagecoach::testing::export_model_tool_test {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// A skip connection across layers, a ModuleList loop, and a module that scripting refuses.
constexpr char kModels[] = R"PY(
import torch
from torch import nn

class SkipNet(nn.Module):
    def __init__(self, d=16, out=3):
        super().__init__()
        self.inp = nn.Linear(d, d)
        self.blocks = nn.ModuleList([nn.Linear(d, d) for _ in range(2)])
        self.mix = nn.Linear(d, d)
        self.head = nn.Linear(d, out)

    def forward(self, x):
        h = torch.relu(self.inp(x))
        skip = h
        for block in self.blocks:
            h = torch.tanh(block(h))
        return self.head(self.mix(h) + skip)

def mlp(width=8):
    return nn.Sequential(nn.Linear(4, width), nn.ReLU(), nn.Linear(width, 2))

class VarArgs(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x, *rest):
        return self.lin(x)
)PY";

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class ExportModelTool : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!PythonHasTorch()) GTEST_SKIP() << kPython << " cannot import torch";
    std::ofstream(dir_.path() + "/user_models.py") << kModels;
  }

  CommandResult Export(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {kPython, STAGECOACH_TOOLS_DIR "/export_model.py"};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv, absl::Seconds(120));
  }

  TempDir dir_;
};

TEST_F(ExportModelTool, ExportsASkipModelThatLoadsAndASpecThatParses) {
  const std::string model = dir_.path() + "/skip.pt";
  const std::string spec_path = dir_.path() + "/job.yaml";
  CommandResult r =
      Export({dir_.path() + "/user_models.py:SkipNet", "--out", model, "--spec-out", spec_path,
              "--input-shape", "8,16", "--kwargs", R"({"d": 16, "out": 3})", "--stages", "3"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("scripted"));
  // Layer names in forward order (the ModuleList loop unrolled), with parameter counts.
  const std::vector<std::pair<std::string, int>> layers = {
      {"inp", 272}, {"blocks.0", 272}, {"blocks.1", 272}, {"mix", 272}, {"head", 51}};
  size_t pos = 0;
  for (const auto& [name, params] : layers) {
    const std::string row = absl::StrCat("  ", name, " ");
    const size_t at = r.out.find(row, pos);
    ASSERT_NE(at, std::string::npos) << "layer " << name << " missing or out of order in\n"
                                     << r.out;
    const std::string line = r.out.substr(at, r.out.find('\n', at) - at);
    EXPECT_THAT(line, HasSubstr(std::to_string(params))) << line;
    pos = at + row.size();
  }
  EXPECT_THAT(r.out, HasSubstr("5 layers, 1139 parameters"));

  // LibTorch loads the file and runs it.
  torch::jit::Module loaded = torch::jit::load(model);
  const torch::Tensor out = loaded.forward({torch::randn({5, 16})}).toTensor();
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{5, 3}));
  int64_t params = 0;
  for (const auto& p : loaded.parameters()) params += p.numel();
  EXPECT_EQ(params, 1139);

  // The starter spec parses as written, and with split.points instead of split.stages.
  const std::string yaml = ReadAll(spec_path);
  auto spec = spec::ParseJobSpec(yaml, spec_path);
  ASSERT_TRUE(spec.ok()) << spec.status() << "\n" << yaml;
  ASSERT_TRUE(spec->model.torchscript.has_value());
  EXPECT_EQ(*spec->model.torchscript, "skip.pt");
  EXPECT_EQ(spec->split.stages, 3);
  EXPECT_EQ(spec->placement.workers, 3);
  EXPECT_EQ(spec->schedule.kind, "1F1B");
  EXPECT_EQ(spec->training.batch_size, 8);
  EXPECT_EQ(spec->data.kind, "tensors");
  EXPECT_THAT(yaml, HasSubstr("--model"));

  std::string with_points;
  bool had_example = false;
  for (absl::string_view line : absl::StrSplit(yaml, '\n')) {
    if (absl::StrContains(line, "stages: 3") && absl::StartsWith(line, "  stages")) continue;
    if (absl::StrContains(line, "# points:")) {
      had_example = true;
      // The example names a real layer.
      EXPECT_THAT(std::string(line), HasSubstr("\"blocks.1\": beginning"));
      absl::StrAppend(&with_points, absl::StrReplaceAll(line, {{"# points", "points"}}), "\n");
      continue;
    }
    absl::StrAppend(&with_points, line, "\n");
  }
  ASSERT_TRUE(had_example) << yaml;
  auto by_points = spec::ParseJobSpec(with_points, spec_path);
  ASSERT_TRUE(by_points.ok()) << by_points.status() << "\n" << with_points;
  EXPECT_EQ(by_points->split.points.at("blocks.1"), "beginning");
}

// The repository's skip-connection fixture: its top-level parameter `scale` is read between e's
// and f's calls, so it counts towards e, as the workers count it
// (worker/model/torchscript_model.h).
TEST_F(ExportModelTool, TopLevelParametersCountTowardsTheLayerThatReadsThem) {
  CommandResult r = Export({TestDataDir() + "/../models/make_models.py:SkipNet", "--out",
                            dir_.path() + "/skipnet.pt", "--input-shape", "4,16"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("6 layers, 4932 parameters"));
  const std::vector<std::pair<std::string, int>> layers = {
      {"a", 544}, {"b", 1056}, {"c", 1056}, {"d", 1056}, {"e", 1056 + 32}, {"f", 132}};
  size_t pos = 0;
  for (const auto& [name, params] : layers) {
    const std::string row = absl::StrCat("  ", name, " ");
    const size_t at = r.out.find(row, pos);
    ASSERT_NE(at, std::string::npos) << name << " missing or out of order in\n" << r.out;
    EXPECT_THAT(r.out.substr(at, r.out.find('\n', at) - at), HasSubstr(std::to_string(params)));
    pos = at + row.size();
  }
  EXPECT_THAT(r.out, Not(HasSubstr("does not read")));
}

TEST_F(ExportModelTool, SequentialLayersAreItsChildren) {
  const std::string model = dir_.path() + "/mlp.pt";
  CommandResult r = Export({dir_.path() + "/user_models.py:mlp", "--out", model, "--input-shape",
                            "6,4", "--kwargs", R"({"width": 5})"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("3 layers, 37 parameters"));
  EXPECT_THAT(r.out, HasSubstr("    0  0  "));
  EXPECT_THAT(r.out, HasSubstr("    1  1  "));
  EXPECT_THAT(r.out, HasSubstr("    2  2  "));
  torch::jit::Module loaded = torch::jit::load(model);
  EXPECT_EQ(loaded.forward({torch::randn({2, 4})}).toTensor().sizes(),
            (std::vector<int64_t>{2, 2}));
}

TEST_F(ExportModelTool, FallsBackToTracingAndSaysSo) {
  const std::string model = dir_.path() + "/varargs.pt";
  CommandResult r =
      Export({dir_.path() + "/user_models.py:VarArgs", "--out", model, "--input-shape", "3,4"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("torch.jit.script failed"));
  EXPECT_THAT(r.err, HasSubstr("torch.jit.trace"));
  EXPECT_THAT(r.out, HasSubstr("traced"));
  torch::jit::Module loaded = torch::jit::load(model);
  EXPECT_EQ(loaded.forward({torch::randn({3, 4})}).toTensor().sizes(),
            (std::vector<int64_t>{3, 4}));

  // Without an example shape it cannot trace, and says what to pass.
  CommandResult no_shape =
      Export({dir_.path() + "/user_models.py:VarArgs", "--out", dir_.path() + "/x.pt"});
  EXPECT_EQ(no_shape.exit_code, 1);
  EXPECT_THAT(no_shape.err, HasSubstr("--input-shape"));
}

TEST_F(ExportModelTool, BadTargetsAreClearErrors) {
  CommandResult missing =
      Export({dir_.path() + "/user_models.py:Nope", "--out", dir_.path() + "/n.pt"});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_THAT(missing.err, HasSubstr("has no 'Nope'"));
  EXPECT_THAT(missing.err, HasSubstr("SkipNet"));

  CommandResult no_colon = Export({"user_models", "--out", dir_.path() + "/n.pt"});
  EXPECT_EQ(no_colon.exit_code, 1);
  EXPECT_THAT(no_colon.err, HasSubstr("MODULE:FACTORY"));

  CommandResult usage = Export({dir_.path() + "/user_models.py:mlp"});  // no --out
  EXPECT_EQ(usage.exit_code, 2);
  EXPECT_THAT(usage.err, HasSubstr("--out"));

  CommandResult bad_kwargs = Export({dir_.path() + "/user_models.py:mlp", "--out",
                                     dir_.path() + "/n.pt", "--kwargs", "{width: 5"});
  EXPECT_EQ(bad_kwargs.exit_code, 2);
  EXPECT_THAT(bad_kwargs.err, HasSubstr("--kwargs"));
}

}  // namespace
}  // namespace stagecoach::testing::export_model_tool_test
