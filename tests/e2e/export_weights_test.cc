// Stage weights exported back to PyTorch: the skip.pt fixture (tests/models/make_models.py) is
// trained 3 steps on 3 worker processes with a checkpoint; a Python script (Debian's
// python3-torch) loads every stage-<s>.state_dict.pt of the checkpoint into the original
// nn.Module (make_models.SkipNet), runs it on an input saved as .npy and writes the output; it
// equals the pipeline's `stagectl infer` output for the same input on the same checkpoint
// (training.resume_from), within 1e-5. The trained output differs from the untrained module's, so
// the comparison would catch weights that were not restored or not exported. Skipped when
// /usr/bin/python3 cannot import torch.
#include <torch/torch.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/local_cluster.h"
#include "tests/support/npy_files.h"
#include "tests/support/python.h"
#include "tests/support/test_paths.h"

namespace stagecoach::testing::export_weights_test {
namespace {

using ::testing::HasSubstr;

constexpr double kTol = 1e-5;

// argv: models_dir, step_dir, stages, input.npy, trained_out.npy, initial_out.npy.
constexpr char kExport[] = R"PY(
import sys, os
import numpy as np
import torch
models_dir, step_dir, stages, x_path, out_path, initial_path = sys.argv[1:7]
sys.path.insert(0, models_dir)
from make_models import SkipNet, make
model = SkipNet()
expected = set(model.state_dict().keys())
loaded = set()
for s in range(int(stages)):
    sd = torch.load(os.path.join(step_dir, "stage-%d.state_dict.pt" % s))
    overlap = loaded & set(sd.keys())
    assert not overlap, "in two stages: %s" % sorted(overlap)
    unknown = set(sd.keys()) - expected
    assert not unknown, "stage %d has names SkipNet lacks: %s" % (s, sorted(unknown))
    result = model.load_state_dict(sd, strict=False)
    assert not result.unexpected_keys, result.unexpected_keys
    loaded |= set(sd.keys())
assert loaded == expected, "missing from every stage: %s" % sorted(expected - loaded)
x = torch.from_numpy(np.load(x_path))
model.eval()
with torch.no_grad():
    np.save(out_path, model(x).numpy())
    initial = make("skip.pt").eval()
    np.save(initial_path, initial(x).numpy())
)PY";

// argv: path, rows, seed: inputs [rows, 16] float64, mse targets [rows, 4]; and x.npy [5, 16].
constexpr char kData[] = R"PY(
import sys
import numpy as np
import torch
path, n, seed, x_path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
g = torch.Generator().manual_seed(seed)
torch.save({"inputs": torch.randn(n, 16, generator=g, dtype=torch.float64),
            "targets": torch.randn(n, 4, generator=g)}, path)
np.save(x_path, torch.randn(5, 16, generator=g).numpy())
)PY";

bool PythonHasTorchAndNumpy() { return PythonCanImport("torch, numpy"); }

std::string SpecYaml(const std::string& name, const std::string& model, const std::string& data,
                     const std::string& ckpt, const std::string& resume_from) {
  return absl::StrCat("name: ", name, "\n", "model:\n  torchscript: ", model, "\n",
                      "split: {points: {\"c\": beginning, \"e\": beginning}}\n",
                      "schedule: {kind: 1F1B, microbatches: 4}\n", "placement: {workers: 3}\n",
                      "training:\n  batch_size: 8\n  steps: 3\n  loss: mse\n",
                      "  optimizer: {kind: adamw, lr: 0.02, weight_decay: 0.01}\n",
                      ckpt.empty() ? "" : absl::StrCat("  checkpoint: {dir: ", ckpt, "}\n"),
                      resume_from.empty() ? "" : absl::StrCat("  resume_from: ", resume_from, "\n"),
                      "data: {kind: tensors, path: ", data, "}\n");
}

TEST(ExportWeights, StageStateDictsLoadIntoTheOriginalModuleAndGiveThePipelinesOutput) {
  if (!PythonHasTorchAndNumpy()) GTEST_SKIP() << kPython << " cannot import torch and numpy";
  const std::string models_dir = TestDataDir() + "/../models";
  ClusterOptions options;
  options.workers = 3;
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  ASSERT_EQ(
      std::system(absl::StrCat(kPython, " '", models_dir, "/make_models.py' '", c.dir(), "/models'")
                      .c_str()),
      0);
  const std::string model = c.dir() + "/models/skip.pt";
  const std::string data = c.dir() + "/data.pt", x = c.dir() + "/x.npy";
  ASSERT_EQ(std::system(absl::StrCat(kPython, " '", c.WriteFile("data.py", kData), "' '", data,
                                     "' 24 5 '", x, "'")
                            .c_str()),
            0);

  // Train 3 steps with a checkpoint.
  const std::string ckpt = c.dir() + "/ckpt";
  const std::string train =
      c.WriteFile("train.yaml", SpecYaml("skip-train", model, data, ckpt, ""));
  CommandResult r = c.Stagectl({"submit", train, "--wait"}, absl::Seconds(180));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err << c.Logs();
  const std::string step_dir = absl::StrFormat("%s/step-%06d", ckpt, 3);

  // Python: the original module with the exported weights.
  const std::string py_out = c.dir() + "/python.npy", initial_out = c.dir() + "/initial.npy";
  CommandResult py = RunCommand({kPython, c.WriteFile("export.py", kExport), models_dir, step_dir,
                                 "3", x, py_out, initial_out},
                                absl::Seconds(120));
  ASSERT_EQ(py.exit_code, 0) << py.out << py.err;

  // The pipeline: forward-only on the checkpoint's weights.
  const std::string infer_spec =
      c.WriteFile("infer.yaml", SpecYaml("skip-infer", model, data, "", step_dir));
  const std::string pipe_out = c.dir() + "/pipeline.npy";
  r = c.Stagectl({"infer", infer_spec, "--input", x, "--out", pipe_out}, absl::Seconds(180));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err << c.Logs();

  const torch::Tensor want = ReadNpy(py_out), got = ReadNpy(pipe_out),
                      initial = ReadNpy(initial_out);
  ASSERT_TRUE(want.defined() && got.defined() && initial.defined());
  ASSERT_EQ(got.sizes(), want.sizes());
  EXPECT_EQ(got.sizes(), (std::vector<int64_t>{5, 4}));
  EXPECT_TRUE(torch::allclose(got, want, kTol, kTol))
      << "pipeline and PyTorch differ by " << (got - want).abs().max().item<double>()
      << "; pipeline and the untrained module by " << (got - initial).abs().max().item<double>();
  EXPECT_GT((want - initial).abs().max().item<double>(), 100 * kTol)
      << "training did not change the output: the check would not see unrestored weights";
}

}  // namespace
}  // namespace stagecoach::testing::export_weights_test
