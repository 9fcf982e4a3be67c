// Stage checkpoints (worker/runtime/checkpoint/checkpoint.h): training resumed from a checkpoint
// continues bit-identically to training that never stopped (AdamW, SGD with momentum, two stages
// sharing one optimizer); one-entry and empty dicts round-trip; corrupt, truncated and mismatched
// checkpoints are refused naming the file, parameter or buffer, without touching the parameters;
// buffers round-trip through the state file and the export; an
// existing file is never overwritten; the export file loads into a PyTorch model.
#include "worker/runtime/checkpoint/checkpoint.h"

#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/util/sha256.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"

namespace stagecoach::runtime::checkpoint_test {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using NamedParams = std::vector<std::pair<std::string, torch::Tensor>>;

constexpr char kPython[] = "/usr/bin/python3";

// A two-stage MLP 4 -> 8 -> 3, stage 0 = layer "0" (Linear + ReLU), stage 1 = layer "1", its
// parameters initialised from `seed`. Trained with plain LibTorch ops.
struct TinyModel {
  explicit TinyModel(uint64_t seed) {
    torch::manual_seed(seed);
    stage0 = {{"0.weight", torch::randn({8, 4}).requires_grad_()},
              {"0.bias", torch::randn({8}).requires_grad_()}};
    stage1 = {{"1.weight", torch::randn({3, 8}).requires_grad_()},
              {"1.bias", torch::randn({3}).requires_grad_()}};
  }
  std::vector<torch::Tensor> All() const {
    std::vector<torch::Tensor> out;
    for (const auto* s : {&stage0, &stage1}) {
      for (const auto& [n, p] : *s) out.push_back(p);
    }
    return out;
  }
  // One training step on step k's batch (a function of k only, like the spec's synthetic data).
  double Step(torch::optim::Optimizer& opt, int64_t k) {
    torch::Generator gen = at::detail::createCPUGenerator(1000 + k);
    const torch::Tensor x = at::randn({5, 4}, gen);
    const torch::Tensor y = at::randn({5, 3}, gen);
    opt.zero_grad();
    torch::Tensor h = torch::relu(torch::addmm(stage0[1].second, x, stage0[0].second.t()));
    torch::Tensor out = torch::addmm(stage1[1].second, h, stage1[0].second.t());
    torch::Tensor loss = torch::mse_loss(out, y);
    loss.backward();
    opt.step();
    return loss.item<double>();
  }
  NamedParams stage0, stage1;
};

std::unique_ptr<torch::optim::Optimizer> MakeAdamW(const TinyModel& m) {
  torch::optim::AdamWOptions o(0.01);
  o.weight_decay(0.05).betas({0.8, 0.95});
  return std::make_unique<torch::optim::AdamW>(m.All(), o);
}

std::unique_ptr<torch::optim::Optimizer> MakeSgd(const TinyModel& m, double momentum) {
  torch::optim::SGDOptions o(0.05);
  o.momentum(momentum).weight_decay(0.01);
  return std::make_unique<torch::optim::SGD>(m.All(), o);
}

void ExpectBitIdentical(const NamedParams& a, const NamedParams& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_TRUE(torch::equal(a[i].second, b[i].second)) << a[i].first << " differs";
  }
}

class CheckpointTest : public ::testing::Test {
 protected:
  // Trains 3 steps, checkpoints both stages after step 3, trains 3 more; then a model with other
  // initial values and a fresh optimizer restores the checkpoint and trains the same 3 steps:
  // losses and final parameters must be bit-identical.
  void CheckResumeIsExact(
      const std::function<std::unique_ptr<torch::optim::Optimizer>(const TinyModel&)>& make) {
    TinyModel a(1);
    auto opt_a = make(a);
    for (int64_t k = 0; k < 3; ++k) a.Step(*opt_a, k);
    auto f0 = WriteStageCheckpoint(dir_, 3, 0, a.stage0, {}, *opt_a, 3);
    auto f1 = WriteStageCheckpoint(dir_, 3, 1, a.stage1, {}, *opt_a, 3);
    ASSERT_TRUE(f0.ok()) << f0.status();
    ASSERT_TRUE(f1.ok()) << f1.status();
    std::vector<double> losses_a;
    for (int64_t k = 3; k < 6; ++k) losses_a.push_back(a.Step(*opt_a, k));

    TinyModel b(2);
    auto opt_b = make(b);
    const std::string step_dir = CheckpointStepDir(dir_, 3);
    ASSERT_EQ(step_dir, dir_ + "/step-000003");
    ASSERT_TRUE(RestoreStageCheckpoint(step_dir, (*f0)[0], 0, b.stage0, *opt_b).ok());
    ASSERT_TRUE(RestoreStageCheckpoint(step_dir, (*f1)[0], 1, b.stage1, *opt_b).ok());
    std::vector<double> losses_b;
    for (int64_t k = 3; k < 6; ++k) losses_b.push_back(b.Step(*opt_b, k));
    EXPECT_EQ(losses_a, losses_b);
    ExpectBitIdentical(a.stage0, b.stage0);
    ExpectBitIdentical(a.stage1, b.stage1);
  }

  stagecoach::testing::TempDir tmp_{"checkpoint_test"};
  const std::string dir_ = tmp_.path();
};

// A stage's buffers (a BatchNorm's running statistics and count) are in its training-state file
// and its export, and come back on restore; a stage whose buffers the file does not hold, or holds
// with another shape, is refused naming the buffer, before anything is changed.
TEST_F(CheckpointTest, BuffersRoundTripAndMismatchesAreRefusedByName) {
  TinyModel m(5);
  auto opt = MakeSgd(m, 0.9);
  m.Step(*opt, 0);
  const NamedParams buffers = {{"0.running_mean", torch::randn({8})},
                               {"0.num_batches_tracked", torch::tensor(7, torch::kInt64)}};
  auto files = WriteStageCheckpoint(dir_, 1, 0, m.stage0, buffers, *opt, 1);
  ASSERT_TRUE(files.ok()) << files.status();
  const std::string step_dir = CheckpointStepDir(dir_, 1);

  NamedParams restored = {{"0.running_mean", torch::zeros({8})},
                          {"0.num_batches_tracked", torch::tensor(0, torch::kInt64)}};
  ASSERT_TRUE(RestoreStageParameters(step_dir, (*files)[0], 0, m.stage0, restored).ok());
  ExpectBitIdentical(restored, buffers);

  const NamedParams renamed = {{"0.running_var", torch::zeros({8})},
                               {"0.num_batches_tracked", torch::tensor(0, torch::kInt64)}};
  absl::Status st = RestoreStageParameters(step_dir, (*files)[0], 0, m.stage0, renamed);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("buffer '0.running_var' of the stage is not in the checkpoint"));
  const NamedParams reshaped = {{"0.running_mean", torch::zeros({4})},
                                {"0.num_batches_tracked", torch::tensor(0, torch::kInt64)}};
  st = RestoreStageParameters(step_dir, (*files)[0], 0, m.stage0, reshaped);
  EXPECT_THAT(st.message(), HasSubstr("buffer '0.running_mean' is"));
  EXPECT_EQ(reshaped[0].second.count_nonzero().item<int64_t>(), 0) << "changed before refusing";

  // The export holds parameters and buffers under their names.
  auto exported = torch::pickle_load([&] {
    std::ifstream in(step_dir + "/" + StageExportFileName(0), std::ios::binary);
    return std::vector<char>(std::istreambuf_iterator<char>(in), {});
  }());
  const auto dict = exported.toGenericDict();
  EXPECT_EQ(dict.size(), 4u);
  EXPECT_TRUE(torch::equal(dict.at("0.running_mean").toTensor(), buffers[0].second));
  EXPECT_EQ(dict.at("0.num_batches_tracked").toTensor().item<int64_t>(), 7);
}

TEST_F(CheckpointTest, AdamWResumeIsBitIdentical) {
  CheckResumeIsExact([](const TinyModel& m) { return MakeAdamW(m); });
}

TEST_F(CheckpointTest, SgdMomentumResumeIsBitIdentical) {
  CheckResumeIsExact([](const TinyModel& m) { return MakeSgd(m, 0.9); });
}

TEST_F(CheckpointTest, SgdWithoutMomentumResumeIsBitIdentical) {
  CheckResumeIsExact([](const TinyModel& m) { return MakeSgd(m, 0.0); });
}

TEST_F(CheckpointTest, WritesBothFilesWithTheirChecksumsAndLayout) {
  TinyModel m(1);
  auto opt = MakeAdamW(m);
  m.Step(*opt, 0);
  auto files = WriteStageCheckpoint(dir_, 12, 1, m.stage1, {}, *opt, 12);
  ASSERT_TRUE(files.ok()) << files.status();
  ASSERT_EQ(files->size(), 2u);
  EXPECT_EQ((*files)[0].file(), "stage-1.pt");
  EXPECT_EQ((*files)[1].file(), "stage-1.state_dict.pt");
  for (const auto& f : *files) {
    const std::string path = dir_ + "/step-000012/" + f.file();
    EXPECT_EQ(f.stage(), 1);
    EXPECT_EQ(static_cast<int64_t>(fs::file_size(path)), f.size_bytes());
    auto sha = Sha256OfFile(path);
    ASSERT_TRUE(sha.ok());
    EXPECT_EQ(*sha, f.sha256());
  }
  // No temporary file is left behind.
  int entries = 0;
  for (const auto& e : fs::directory_iterator(dir_ + "/step-000012")) {
    (void)e;
    ++entries;
  }
  EXPECT_EQ(entries, 2);

  // The training-state file's layout, read back as a pickled dict.
  std::ifstream in(dir_ + "/step-000012/stage-1.pt", std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  c10::IValue root = torch::pickle_load(bytes);
  ASSERT_TRUE(root.isGenericDict());
  auto dict = root.toGenericDict();
  EXPECT_EQ(dict.at("stage").toInt(), 1);
  EXPECT_EQ(dict.at("step").toInt(), 12);
  EXPECT_EQ(dict.at("data_position").toInt(), 12);
  auto sd = dict.at("state_dict").toGenericDict();
  EXPECT_EQ(sd.size(), 2u);
  EXPECT_TRUE(torch::equal(sd.at("1.weight").toTensor(), m.stage1[0].second));
  auto optim = dict.at("optimizer").toGenericDict();
  EXPECT_EQ(optim.size(), 6u);  // exp_avg, exp_avg_sq, step for each of the two parameters
  EXPECT_EQ(optim.at("1.bias.step").toTensor().item<int64_t>(), 1);
  EXPECT_TRUE(optim.contains("1.weight.exp_avg"));
  EXPECT_TRUE(optim.contains("1.weight.exp_avg_sq"));
}

// One-entry and empty dicts (a one-parameter stage; SGD without momentum has no state; a stage
// without parameters) survive the round trip.
TEST_F(CheckpointTest, OneEntryAndEmptyDictsRoundTrip) {
  torch::manual_seed(3);
  NamedParams one = {{"w", torch::randn({2, 2}).requires_grad_()}};
  NamedParams none;
  const torch::Tensor w1 = one[0].second.detach().clone();
  torch::optim::SGD sgd(std::vector<torch::Tensor>{one[0].second}, torch::optim::SGDOptions(0.1));
  auto f_one = WriteStageCheckpoint(dir_, 1, 0, one, {}, sgd, 1);
  auto f_none = WriteStageCheckpoint(dir_, 1, 1, none, {}, sgd, 1);
  ASSERT_TRUE(f_one.ok()) << f_one.status();
  ASSERT_TRUE(f_none.ok()) << f_none.status();

  // Momentum state for a one-entry optimizer dict.
  torch::optim::SGD momentum(std::vector<torch::Tensor>{one[0].second},
                             torch::optim::SGDOptions(0.1).momentum(0.5));
  one[0].second.sum().backward();
  momentum.step();
  auto f_mom = WriteStageCheckpoint(dir_, 2, 0, one, {}, momentum, 2);
  ASSERT_TRUE(f_mom.ok()) << f_mom.status();

  NamedParams other = {{"w", torch::zeros({2, 2}).requires_grad_()}};
  torch::optim::SGD sgd2(std::vector<torch::Tensor>{other[0].second},
                         torch::optim::SGDOptions(0.1));
  ASSERT_TRUE(RestoreStageCheckpoint(CheckpointStepDir(dir_, 1), (*f_one)[0], 0, other, sgd2).ok());
  EXPECT_TRUE(torch::equal(other[0].second, w1));
  EXPECT_TRUE(sgd2.state().empty());
  absl::Status restored =
      RestoreStageCheckpoint(CheckpointStepDir(dir_, 1), (*f_none)[0], 1, none, sgd2);
  EXPECT_TRUE(restored.ok()) << restored;

  torch::optim::SGD momentum2(std::vector<torch::Tensor>{other[0].second},
                              torch::optim::SGDOptions(0.1).momentum(0.5));
  ASSERT_TRUE(
      RestoreStageCheckpoint(CheckpointStepDir(dir_, 2), (*f_mom)[0], 0, other, momentum2).ok());
  ExpectBitIdentical(one, other);
  // Both continue identically.
  for (auto* p : {&one[0].second, &other[0].second}) p->mutable_grad() = torch::ones({2, 2});
  momentum.step();
  momentum2.step();
  ExpectBitIdentical(one, other);
}

TEST_F(CheckpointTest, CorruptFileIsRefusedAndNothingChanges) {
  TinyModel m(1);
  auto opt = MakeAdamW(m);
  m.Step(*opt, 0);
  auto files = WriteStageCheckpoint(dir_, 1, 0, m.stage0, {}, *opt, 1);
  ASSERT_TRUE(files.ok());
  const std::string path = dir_ + "/step-000001/stage-0.pt";
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(100);
    char c;
    f.get(c);
    f.seekp(100);
    f.put(static_cast<char>(c ^ 0x01));
  }
  TinyModel other(2);
  auto opt2 = MakeAdamW(other);
  const torch::Tensor before = other.stage0[0].second.detach().clone();
  absl::Status s =
      RestoreStageCheckpoint(CheckpointStepDir(dir_, 1), (*files)[0], 0, other.stage0, *opt2);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(path));
  EXPECT_THAT(std::string(s.message()), HasSubstr((*files)[0].sha256()));
  EXPECT_TRUE(torch::equal(before, other.stage0[0].second));
  EXPECT_TRUE(opt2->state().empty());
}

TEST_F(CheckpointTest, TruncatedFileIsRefused) {
  TinyModel m(1);
  auto opt = MakeSgd(m, 0.9);
  m.Step(*opt, 0);
  auto files = WriteStageCheckpoint(dir_, 1, 1, m.stage1, {}, *opt, 1);
  ASSERT_TRUE(files.ok());
  const std::string path = dir_ + "/step-000001/stage-1.pt";
  fs::resize_file(path, (*files)[0].size_bytes() / 2);
  TinyModel other(2);
  auto opt2 = MakeSgd(other, 0.9);
  absl::Status s =
      RestoreStageCheckpoint(CheckpointStepDir(dir_, 1), (*files)[0], 1, other.stage1, *opt2);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(path));
  EXPECT_THAT(std::string(s.message()), HasSubstr(absl::StrCat((*files)[0].size_bytes())));

  fs::remove(path);
  s = RestoreStageCheckpoint(CheckpointStepDir(dir_, 1), (*files)[0], 1, other.stage1, *opt2);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(path));
}

TEST_F(CheckpointTest, MismatchedParametersAreRefusedNamingTheParameter) {
  TinyModel m(1);
  auto opt = MakeAdamW(m);
  m.Step(*opt, 0);
  auto files = WriteStageCheckpoint(dir_, 1, 0, m.stage0, {}, *opt, 1);
  ASSERT_TRUE(files.ok());
  const std::string step_dir = CheckpointStepDir(dir_, 1);

  // Another name.
  TinyModel other(2);
  auto opt2 = MakeAdamW(other);
  NamedParams renamed = other.stage0;
  renamed[1].first = "0.offset";
  absl::Status s = RestoreStageCheckpoint(step_dir, (*files)[0], 0, renamed, *opt2);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("'0.offset'"));

  // Another shape.
  TinyModel wide(2);
  wide.stage0[0].second = torch::randn({9, 4}).requires_grad_();
  auto opt3 = MakeAdamW(wide);
  s = RestoreStageCheckpoint(step_dir, (*files)[0], 0, wide.stage0, *opt3);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("'0.weight'"));

  // Another stage's file.
  s = RestoreStageCheckpoint(step_dir, (*files)[0], 1, other.stage1, *opt2);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;

  // Another optimizer kind.
  auto sgd = MakeSgd(other, 0.9);
  s = RestoreStageCheckpoint(step_dir, (*files)[0], 0, other.stage0, *sgd);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("exp_avg"));
}

TEST_F(CheckpointTest, ExistingFileIsNotOverwritten) {
  TinyModel m(1);
  auto opt = MakeAdamW(m);
  auto first = WriteStageCheckpoint(dir_, 4, 0, m.stage0, {}, *opt, 4);
  ASSERT_TRUE(first.ok());
  m.Step(*opt, 0);
  auto again = WriteStageCheckpoint(dir_, 4, 0, m.stage0, {}, *opt, 4);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists) << again.status();
  EXPECT_THAT(std::string(again.status().message()), HasSubstr(dir_ + "/step-000004/stage-0.pt"));
  // The first checkpoint is intact.
  auto sha = Sha256OfFile(dir_ + "/step-000004/stage-0.pt");
  ASSERT_TRUE(sha.ok());
  EXPECT_EQ(*sha, (*first)[0].sha256());
  // Only the export file exists for a stage whose state file was written by hand.
  const std::string step_dir = CheckpointStepDir(dir_, 5);
  fs::create_directories(step_dir);
  std::ofstream(step_dir + "/stage-0.state_dict.pt") << "someone else's";
  auto export_taken = WriteStageCheckpoint(dir_, 5, 0, m.stage0, {}, *opt, 5);
  EXPECT_EQ(export_taken.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(export_taken.status().message()), HasSubstr("stage-0.state_dict.pt"));
}

// Forward-only tasks restore the weights alone, whatever optimizer wrote the file.
TEST_F(CheckpointTest, ParametersOnlyRestore) {
  TinyModel m(1);
  auto opt = MakeAdamW(m);
  m.Step(*opt, 0);
  auto files = WriteStageCheckpoint(dir_, 1, 1, m.stage1, {}, *opt, 1);
  ASSERT_TRUE(files.ok());
  TinyModel other(2);
  absl::Status s = RestoreStageParameters(CheckpointStepDir(dir_, 1), (*files)[0], 1, other.stage1);
  ASSERT_TRUE(s.ok()) << s;
  ExpectBitIdentical(m.stage1, other.stage1);
  // The same checks of the file as a full restore.
  NamedParams renamed = other.stage1;
  renamed[0].first = "1.kernel";
  s = RestoreStageParameters(CheckpointStepDir(dir_, 1), (*files)[0], 1, renamed);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  v1::StageCheckpointFile wrong = (*files)[0];
  wrong.set_sha256(std::string(64, '0'));
  s = RestoreStageParameters(CheckpointStepDir(dir_, 1), wrong, 1, other.stage1);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
}

TEST_F(CheckpointTest, FindStageStateFile) {
  v1::ResumeTask resume;
  resume.set_directory("/ckpt/step-000003");
  for (int s : {1, 2}) {
    for (const std::string& name : {StageStateFileName(s), StageExportFileName(s)}) {
      auto* f = resume.add_files();
      f->set_stage(s);
      f->set_file(name);
    }
  }
  auto f = FindStageStateFile(resume, 2);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->file(), "stage-2.pt");
  auto missing = FindStageStateFile(resume, 0);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("stage-0.pt"));
}

// The export file is what a PyTorch user loads: torch.load, then load_state_dict(strict=False)
// into the whole model.
TEST_F(CheckpointTest, ExportFileLoadsIntoAPyTorchModel) {
  if (std::system(absl::StrCat(kPython, " -c 'import torch' >/dev/null 2>&1").c_str()) != 0) {
    GTEST_SKIP() << kPython << " has no torch";
  }
  TinyModel m(1);
  auto opt = MakeAdamW(m);
  m.Step(*opt, 0);
  ASSERT_TRUE(WriteStageCheckpoint(dir_, 1, 0, m.stage0, {}, *opt, 1).ok());
  ASSERT_TRUE(WriteStageCheckpoint(dir_, 1, 1, m.stage1, {}, *opt, 1).ok());
  const std::string script = dir_ + "/load.py";
  std::ofstream(script) << R"PY(
import sys, torch
d = sys.argv[1]
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 3))
for s in (0, 1):
    sd = torch.load(f"{d}/stage-{s}.state_dict.pt")
    r = model.load_state_dict(sd, strict=False)
    assert not r.unexpected_keys, r
full = torch.load(f"{d}/stage-1.pt")
assert full["stage"] == 1 and full["step"] == 1 and full["data_position"] == 1, full
assert set(full["optimizer"]) == {"1.weight.exp_avg", "1.weight.exp_avg_sq", "1.weight.step",
                                  "1.bias.exp_avg", "1.bias.exp_avg_sq", "1.bias.step"}
with open(f"{d}/sums.txt", "w") as f:
    for k, v in model.state_dict().items():
        f.write(f"{k} {v.double().sum().item():.17g}\n")
)PY";
  ASSERT_EQ(
      std::system(absl::StrCat(kPython, " ", script, " ", CheckpointStepDir(dir_, 1)).c_str()), 0);
  std::map<std::string, double> sums;
  std::ifstream in(CheckpointStepDir(dir_, 1) + "/sums.txt");
  std::string name;
  double sum;
  while (in >> name >> sum) sums[name] = sum;
  ASSERT_EQ(sums.size(), 4u);
  for (const auto* stage : {&m.stage0, &m.stage1}) {
    for (const auto& [n, p] : *stage) {
      EXPECT_DOUBLE_EQ(sums.at(n), p.detach().to(torch::kFloat64).sum().item<double>()) << n;
    }
  }
}

}  // namespace
}  // namespace stagecoach::runtime::checkpoint_test
