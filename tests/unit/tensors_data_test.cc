// data.kind tensors (worker/runtime/data/training_data.h): a file written by Python's
// torch.save({"inputs": X, "targets": Y}) read once, step k's rows (k * batch_size + i) mod N
// wrapping around, and every bad file refused naming data.path and the problem. The files are
// written by /usr/bin/python3 with PyTorch, as a user would write them.
#include <torch/torch.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/python.h"
#include "worker/runtime/data/training_data.h"

namespace stagecoach::tensors_data_test {
namespace {

using ::stagecoach::testing::kPython;
using ::stagecoach::testing::PythonHasTorch;

using ::testing::AnyOf;
using ::testing::HasSubstr;

// Writes every file the tests read into the directory argv[1]. Rows are numbered so a batch
// shows which rows it holds: inputs[r] = [r * 100 + c for c in 0..2] (float64, read as float32),
// class targets r % 4, mse targets [r, -r, r / 2, 1].
constexpr char kWriter[] = R"PY(
import sys, torch
d = sys.argv[1]
N = 7
X = (torch.arange(N, dtype=torch.float64) * 100).unsqueeze(1) + torch.arange(3, dtype=torch.float64)
Y = torch.arange(N) % 4
R = torch.arange(N, dtype=torch.float32)
Ymse = torch.stack([R, -R, R / 2, torch.ones(N)], 1)
def save(name, obj):
    torch.save(obj, d + "/" + name)
save("good.pt", {"inputs": X, "targets": Y})
save("good_mse.pt", {"inputs": X, "targets": Ymse, "extra": 3})
save("int_inputs.pt", {"inputs": X.to(torch.int32), "targets": Y.to(torch.int32)})
save("list.pt", [X, Y])
# Two keys each: LibTorch 1.13's unpickler cannot read a one-entry dict (pickle's SETITEM).
save("no_inputs.pt", {"targets": Y, "labels": Y})
save("no_targets.pt", {"inputs": X, "labels": Y})
save("one_key.pt", {"inputs": X})
save("inputs_list.pt", {"inputs": [1.0, 2.0], "targets": Y})
save("targets_int.pt", {"inputs": X, "targets": 5})
save("rows.pt", {"inputs": X, "targets": Y[:6]})
save("empty.pt", {"inputs": torch.zeros(0, 3), "targets": torch.zeros(0, dtype=torch.int64)})
save("wide.pt", {"inputs": torch.zeros(N, 5), "targets": Y})
save("flat.pt", {"inputs": torch.zeros(N), "targets": Y})
save("float_classes.pt", {"inputs": X, "targets": Y.float()})
save("classes_2d.pt", {"inputs": X, "targets": Y.unsqueeze(1)})
save("class_big.pt", {"inputs": X, "targets": torch.tensor([0, 1, 2, 3, 4, 0, 1])})
save("class_negative.pt", {"inputs": X, "targets": torch.tensor([0, 1, -1, 3, 0, 0, 1])})
save("mse_wide.pt", {"inputs": X, "targets": torch.zeros(N, 5)})
save("mse_int.pt", {"inputs": X, "targets": torch.zeros(N, 4, dtype=torch.int64)})
open(d + "/text.pt", "w").write("not a torch file\n")
)PY";

class TensorsDataTest : public ::testing::Test {
 protected:
  // Python writes the files once for every test.
  static void SetUpTestSuite() {
    if (!PythonHasTorch()) return;
    char tmpl[] = "/tmp/tensors_data_test_XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return;
    const std::string dir = tmpl;
    const std::string script = absl::StrCat(dir, "/write.py");
    std::ofstream(script) << kWriter;
    if (std::system(absl::StrCat(kPython, " '", script, "' '", dir, "'").c_str()) == 0) {
      dir_ = dir;
    }
  }
  static void TearDownTestSuite() {
    if (!dir_.empty()) std::system(absl::StrCat("rm -rf '", dir_, "'").c_str());
    dir_.clear();
  }
  void SetUp() override {
    if (!PythonHasTorch()) GTEST_SKIP() << kPython << " cannot import torch";
    ASSERT_FALSE(dir_.empty()) << kPython << " did not write the test files";
  }

  std::string Path(const std::string& name) { return absl::StrCat(dir_, "/", name); }

  spec::JobSpec Spec(const std::string& name, const std::string& loss = "cross_entropy") {
    spec::JobSpec spec;
    spec.model.builtin = spec::BuiltinModel();
    spec.model.builtin->family = "mlp";
    spec.model.builtin->sizes = {3, 8, 4};
    spec.training.batch_size = 3;
    spec.training.loss = loss;
    spec.data.kind = "tensors";
    spec.data.path = Path(name);
    return spec;
  }

  std::string Error(const spec::JobSpec& spec) {
    auto source = runtime::BatchSource::Open(spec, true, true);
    EXPECT_FALSE(source.ok()) << spec.data.path;
    if (source.ok()) return "";
    EXPECT_TRUE(absl::IsInvalidArgument(source.status())) << source.status();
    return std::string(source.status().message());
  }

  static std::string dir_;
};

std::string TensorsDataTest::dir_;

// The rows (k * batch + i) mod n.
std::vector<int64_t> Rows(int64_t k, int64_t batch, int64_t n) {
  std::vector<int64_t> rows;
  for (int64_t i = 0; i < batch; ++i) rows.push_back((k * batch + i) % n);
  return rows;
}

TEST_F(TensorsDataTest, StepsTakeConsecutiveRowsWrappingAround) {
  const spec::JobSpec spec = Spec("good.pt");
  auto source = runtime::BatchSource::Open(spec, true, true);
  ASSERT_TRUE(source.ok()) << source.status();
  // N = 7, batch 3: rows 0-2, 3-5, 6 0 1, 2-4, 5 6 0, 1-3, ... back to 0-2 at step 7.
  for (int64_t k = 0; k < 9; ++k) {
    SCOPED_TRACE(k);
    auto batch = (*source)->Make(k);
    ASSERT_TRUE(batch.ok()) << batch.status();
    const torch::Tensor rows = torch::tensor(Rows(k, 3, 7), torch::kInt64);
    ASSERT_EQ(batch->inputs.sizes(), (std::vector<int64_t>{3, 3}));
    EXPECT_EQ(batch->inputs.scalar_type(), torch::kFloat32);
    const torch::Tensor want_x =
        (rows.to(torch::kFloat32) * 100).unsqueeze(1) + torch::arange(3, torch::kFloat32);
    EXPECT_TRUE(torch::equal(batch->inputs, want_x)) << batch->inputs;
    EXPECT_EQ(batch->targets.scalar_type(), torch::kInt64);
    EXPECT_TRUE(torch::equal(batch->targets, rows % 4)) << batch->targets;
  }
  EXPECT_TRUE(torch::equal((*source)->Make(7)->inputs, (*source)->Make(0)->inputs));

  // Only what is asked for, the same rows from a fresh source.
  auto inputs_only = runtime::BatchSource::Open(spec, true, false);
  ASSERT_TRUE(inputs_only.ok());
  auto x = (*inputs_only)->Make(4);
  EXPECT_FALSE(x->targets.defined());
  EXPECT_TRUE(torch::equal(x->inputs, (*source)->Make(4)->inputs));
  auto y = runtime::MakeBatch(spec, 4, false, true);
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_FALSE(y->inputs.defined());
  EXPECT_TRUE(torch::equal(y->targets, torch::tensor({5 % 4, 6 % 4, 0}, torch::kInt64)));
}

TEST_F(TensorsDataTest, BatchesLargerThanTheFileRepeatRows) {
  spec::JobSpec spec = Spec("good.pt");
  spec.training.batch_size = 10;
  auto batch = runtime::MakeBatch(spec, 1, false, true);
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_TRUE(torch::equal(batch->targets, torch::tensor(Rows(1, 10, 7), torch::kInt64) % 4));
}

TEST_F(TensorsDataTest, MseTargetsAndIntegerInputsAreConverted) {
  auto mse = runtime::MakeBatch(Spec("good_mse.pt", "mse"), 2, true, true);
  ASSERT_TRUE(mse.ok()) << mse.status();
  const torch::Tensor r = torch::tensor(Rows(2, 3, 7), torch::kInt64).to(torch::kFloat32);
  EXPECT_EQ(mse->targets.scalar_type(), torch::kFloat32);
  EXPECT_TRUE(torch::equal(mse->targets, torch::stack({r, -r, r / 2, torch::ones({3})}, 1)));

  auto ints = runtime::MakeBatch(Spec("int_inputs.pt"), 1, true, true);
  ASSERT_TRUE(ints.ok()) << ints.status();
  EXPECT_EQ(ints->inputs.scalar_type(), torch::kFloat32);
  EXPECT_EQ(ints->targets.scalar_type(), torch::kInt64);
  EXPECT_TRUE(torch::equal(ints->targets, torch::tensor({3, 0, 1}, torch::kInt64)));
  EXPECT_EQ(ints->inputs[0][2].item<float>(), 302.0f);
}

TEST_F(TensorsDataTest, ErrorsNameDataPathAndTheProblem) {
  const std::string missing = Path("missing.pt");
  EXPECT_THAT(Error(Spec("missing.pt")),
              HasSubstr(absl::StrCat("data.path: cannot open '", missing, "'")));
  struct Case {
    std::string file, loss, want;
  };
  for (const Case& c : std::vector<Case>{
           {"text.pt", "cross_entropy", "is not a file written by torch.save"},
           {"list.pt", "cross_entropy", "not a dict"},
           {"no_inputs.pt", "cross_entropy", "has no \"inputs\" key"},
           {"no_targets.pt", "cross_entropy", "has no \"targets\" key"},
           {"inputs_list.pt", "cross_entropy", "\"inputs\" holds a list, not a tensor"},
           {"targets_int.pt", "cross_entropy", "\"targets\" holds a int, not a tensor"},
           {"rows.pt", "cross_entropy",
            "\"inputs\" has 7 rows but \"targets\" has shape [6]; both need the same number of "
            "rows"},
           {"empty.pt", "cross_entropy", "holds no rows"},
           {"wide.pt", "cross_entropy",
            "\"inputs\" has shape [7, 5]; it must be [N, 3] (N rows of model.builtin.sizes[0]"},
           {"flat.pt", "cross_entropy", "\"inputs\" has shape [7]; it must be [N, 3]"},
           {"float_classes.pt", "cross_entropy",
            "\"targets\" is torch.float32 [7]; training.loss cross_entropy needs int64 class "
            "indices [7]"},
           {"classes_2d.pt", "cross_entropy",
            "\"targets\" is torch.int64 [7, 1]; training.loss cross_entropy needs int64 class "
            "indices"},
           {"class_big.pt", "cross_entropy", "\"targets\" holds class 4, outside [0, 4)"},
           {"class_negative.pt", "cross_entropy", "\"targets\" holds class -1, outside [0, 4)"},
           {"mse_wide.pt", "mse",
            "\"targets\" is torch.float32 [7, 5]; training.loss mse needs floating-point [7, 4]"},
           {"mse_int.pt", "mse", "\"targets\" is torch.int64 [7, 4]; training.loss mse needs"},
           {"good.pt", "mse", "\"targets\" is torch.int64 [7]; training.loss mse needs"},
       }) {
    SCOPED_TRACE(c.file);
    const std::string message = Error(Spec(c.file, c.loss));
    EXPECT_THAT(message, HasSubstr(absl::StrCat("data.path: '", Path(c.file), "' ")));
    EXPECT_THAT(message, HasSubstr(c.want));
  }

  // LibTorch 1.13's unpickler cannot read a one-entry dict (pickle's SETITEM); 2.6's reads it and
  // finds no "targets".
  EXPECT_THAT(Error(Spec("one_key.pt")), AnyOf(HasSubstr("is not a file written by torch.save"),
                                               HasSubstr("has no \"targets\" key")));

  spec::JobSpec no_path = Spec("good.pt");
  no_path.data.path.clear();
  EXPECT_THAT(Error(no_path), HasSubstr("data.path: required for data.kind tensors"));
  spec::JobSpec gpt = Spec("good.pt");
  gpt.model.builtin->family = "gpt";
  EXPECT_THAT(Error(gpt),
              HasSubstr("data.kind: tensors data needs a built-in mlp or a TorchScript model"));
  // A rank that needs neither inputs nor targets does not read the file.
  EXPECT_TRUE(runtime::BatchSource::Open(Spec("missing.pt"), false, false).ok());
}

}  // namespace
}  // namespace stagecoach::tensors_data_test
