// A checkpoint read by parameter name (worker/runtime/checkpoint/checkpoint_by_name.h): a
// two-stage checkpoint restored onto one stage holding every parameter continues bit-identically
// to the run that never stopped (AdamW); ZeRO-1 shard files of two replicas are reassembled into
// each parameter's exact optimizer state by the layout they keep; a tied copy the checkpoint
// holds once comes from its source's name; a parameter in none of the files read, a shard file
// without a layout, and an incomplete shard set are refused naming them.
#include "worker/runtime/checkpoint/checkpoint_by_name.h"

#include <torch/optim/adamw.h>
#include <torch/torch.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "common/checkpoint/layout.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"
#include "worker/runtime/checkpoint/checkpoint.h"
#include "worker/runtime/checkpoint/optimizer_state.h"

namespace stagecoach::runtime::checkpoint_by_name_test {
namespace {

using ::testing::HasSubstr;
using NamedParams = std::vector<std::pair<std::string, torch::Tensor>>;

// An MLP 4 -> 8 -> 3 as named parameters; stage 0 holds layer "0", stage 1 layer "1".
NamedParams Mlp(uint64_t seed) {
  torch::manual_seed(seed);
  return {{"0.weight", torch::randn({8, 4}).requires_grad_()},
          {"0.bias", torch::randn({8}).requires_grad_()},
          {"1.weight", torch::randn({3, 8}).requires_grad_()},
          {"1.bias", torch::randn({3}).requires_grad_()}};
}

std::vector<torch::Tensor> Tensors(const NamedParams& params) {
  std::vector<torch::Tensor> out;
  for (const auto& [name, p] : params) out.push_back(p);
  return out;
}

std::unique_ptr<torch::optim::AdamW> AdamW(const std::vector<torch::Tensor>& params) {
  torch::optim::AdamWOptions o(0.01);
  o.weight_decay(0.05).betas({0.8, 0.95});
  return std::make_unique<torch::optim::AdamW>(params, o);
}

// One step on batch k (a function of k only).
double Step(const NamedParams& p, torch::optim::Optimizer& opt, int64_t k) {
  torch::Generator gen = at::detail::createCPUGenerator(500 + k);
  const torch::Tensor x = at::randn({5, 4}, gen);
  const torch::Tensor y = at::randn({5, 3}, gen);
  opt.zero_grad();
  torch::Tensor h = torch::relu(torch::addmm(p[1].second, x, p[0].second.t()));
  torch::Tensor loss = torch::mse_loss(torch::addmm(p[3].second, h, p[2].second.t()), y);
  loss.backward();
  opt.step();
  return loss.item<double>();
}

NamedParams Slice(const NamedParams& p, size_t from, size_t to) {
  return NamedParams(p.begin() + static_cast<long>(from), p.begin() + static_cast<long>(to));
}

class CheckpointByNameTest : public ::testing::Test {
 protected:
  std::string StepDir() const { return checkpoint::CheckpointStepDirectory(dir_.path(), 2); }
  ::stagecoach::testing::TempDir dir_{"by-name"};
};

TEST_F(CheckpointByNameTest, TwoStagesResumeOntoOneStageBitIdentically) {
  NamedParams straight = Mlp(3);
  auto opt = AdamW(Tensors(straight));
  for (int k = 0; k < 2; ++k) Step(straight, *opt, k);
  v1::ResumeTask resume;
  resume.set_directory(StepDir());
  resume.set_step(2);
  resume.set_by_name(true);
  for (int s = 0; s < 2; ++s) {
    auto files =
        WriteStageCheckpoint(dir_.path(), 2, s, Slice(straight, 2 * s, 2 * s + 2), {}, *opt, 2);
    ASSERT_TRUE(files.ok()) << files.status();
    for (const auto& f : *files) *resume.add_files() = f;
  }
  // One stage holding both layers, started from other values.
  NamedParams resumed = Mlp(99);
  auto resumed_opt = AdamW(Tensors(resumed));
  auto saved = CheckpointByName::Read(resume);
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(saved->stages(), (std::set<int>{0, 1}));
  auto state = saved->StateFor(0, resumed, {}, {});
  ASSERT_TRUE(state.ok()) << state.status();
  ASSERT_TRUE(RestoreSavedState(*std::move(state), "test", resumed, resumed_opt.get(), {}).ok());
  for (int k = 2; k < 5; ++k) {
    EXPECT_EQ(Step(resumed, *resumed_opt, k), Step(straight, *opt, k)) << "step " << k;
  }
  for (size_t i = 0; i < straight.size(); ++i) {
    EXPECT_TRUE(torch::equal(resumed[i].second, straight[i].second)) << resumed[i].first;
  }
}

// The same from files in memory (an in-memory snapshot's, exchanged at an attempt's start): the
// directory is gone, and a file missing from memory is named with the files' name.
TEST_F(CheckpointByNameTest, FilesInMemoryResumeOntoOneStageBitIdentically) {
  NamedParams straight = Mlp(3);
  auto opt = AdamW(Tensors(straight));
  for (int k = 0; k < 2; ++k) Step(straight, *opt, k);
  v1::ResumeTask resume;
  resume.set_directory("in-memory snapshot after step 2");
  resume.set_step(2);
  resume.set_by_name(true);
  std::map<std::string, StateFiles::Bytes> memory;
  for (int s = 0; s < 2; ++s) {
    auto files =
        WriteStageCheckpoint(dir_.path(), 2, s, Slice(straight, 2 * s, 2 * s + 2), {}, *opt, 2);
    ASSERT_TRUE(files.ok()) << files.status();
    for (const auto& f : *files) {
      *resume.add_files() = f;
      auto bytes = StateFiles(StepDir()).Read(f.file());
      ASSERT_TRUE(bytes.ok()) << bytes.status();
      memory[f.file()] = *bytes;
    }
  }
  std::filesystem::remove_all(StepDir());
  const StateFiles files("the snapshot after step 2", memory);
  NamedParams resumed = Mlp(99);
  auto resumed_opt = AdamW(Tensors(resumed));
  auto saved = CheckpointByName::Read(resume, files);
  ASSERT_TRUE(saved.ok()) << saved.status();
  auto state = saved->StateFor(0, resumed, {}, {});
  ASSERT_TRUE(state.ok()) << state.status();
  ASSERT_TRUE(RestoreSavedState(*std::move(state), "test", resumed, resumed_opt.get(), {}).ok());
  for (int k = 2; k < 5; ++k) {
    EXPECT_EQ(Step(resumed, *resumed_opt, k), Step(straight, *opt, k)) << "step " << k;
  }
  memory.erase(checkpoint::StageStateFileName(1));
  auto missing = CheckpointByName::Read(resume, StateFiles("the snapshot after step 2", memory));
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("the snapshot after step 2: stage-1.pt"));
}

// Writes stage `s` of `params` as ZeRO-1 does with two replicas: stage-<s>.pt without optimizer
// state, and each replica's shard of the flat parameters and of their AdamW state in `opt`.
void WriteShardedStage(const std::string& dir, int s, const NamedParams& params,
                       const torch::optim::Optimizer& opt, bool with_layout,
                       v1::ResumeTask& resume) {
  auto unrelated = AdamW({torch::zeros({1}).requires_grad_()});
  auto files = WriteStageCheckpoint(dir, 2, s, params, {}, *unrelated, 2);
  ASSERT_TRUE(files.ok()) << files.status();
  *resume.add_files() = (*files)[0];
  std::map<std::string, std::vector<torch::Tensor>> flat;
  ShardLayout layout;
  for (const auto& [name, p] : params) {
    auto fields = ParamStateFields(opt, p);
    ASSERT_TRUE(fields.ok());
    for (const auto& [field, value] : *fields) flat[field].push_back(value.reshape(-1));
    layout.emplace_back(name, p.sizes().vec());
  }
  const int64_t numel = torch::cat(flat["exp_avg"]).numel();
  const int64_t c = (numel + 1) / 2;
  for (int k = 0; k < 2; ++k) {
    torch::Tensor shard = torch::zeros({c}).requires_grad_();
    auto shard_opt = AdamW({shard});
    StateFields mine;
    for (const auto& [field, parts] : flat) {
      if (field == "step") {
        mine[field] = parts[0];
        continue;
      }
      torch::Tensor padded = torch::zeros({2 * c});
      padded.narrow(0, 0, numel).copy_(torch::cat(parts));
      mine[field] = padded.narrow(0, k * c, c);
    }
    ASSERT_TRUE(SetParamStateFields(*shard_opt, shard, mine, "test").ok());
    auto f =
        WriteStateFile(dir, 2, s, checkpoint::OptimizerShardFileName(s, k, 2), {{"shard", shard}},
                       *shard_opt, 2, with_layout ? layout : ShardLayout{});
    ASSERT_TRUE(f.ok()) << f.status();
    *resume.add_files() = *f;
  }
}

TEST_F(CheckpointByNameTest, ShardFilesAreReassembledIntoEachParametersState) {
  NamedParams straight = Mlp(4);
  auto opt = AdamW(Tensors(straight));
  for (int k = 0; k < 3; ++k) Step(straight, *opt, k);
  v1::ResumeTask resume;
  resume.set_directory(StepDir());
  resume.set_step(2);
  for (int s = 0; s < 2; ++s) {
    WriteShardedStage(dir_.path(), s, Slice(straight, 2 * s, 2 * s + 2), *opt, true, resume);
  }
  auto saved = CheckpointByName::Read(resume);
  ASSERT_TRUE(saved.ok()) << saved.status();
  // Layer "1" alone, as a stage of another layout would hold it; the state is each parameter's.
  NamedParams tail = Slice(Mlp(7), 2, 4);
  auto state = saved->StateFor(1, tail, {}, {});
  ASSERT_TRUE(state.ok()) << state.status();
  for (size_t i = 2; i < 4; ++i) {
    const std::string& name = straight[i].first;
    EXPECT_TRUE(torch::equal(state->params.at(name), straight[i].second)) << name;
    auto fields = ParamStateFields(*opt, straight[i].second);
    ASSERT_TRUE(fields.ok());
    for (const auto& [field, value] : *fields) {
      const torch::Tensor& got = state->optimizer.at(name + "." + field);
      EXPECT_TRUE(torch::equal(got.reshape(value.sizes()), value)) << name << "." << field;
    }
  }
}

TEST_F(CheckpointByNameTest, ATiedCopyComesFromItsSourcesName) {
  NamedParams p = Mlp(5);
  auto opt = AdamW(Tensors(p));
  Step(p, *opt, 0);
  v1::ResumeTask resume;
  resume.set_directory(StepDir());
  auto files = WriteStageCheckpoint(dir_.path(), 2, 0, p, {}, *opt, 2);
  ASSERT_TRUE(files.ok());
  *resume.add_files() = (*files)[0];
  auto saved = CheckpointByName::Read(resume);
  ASSERT_TRUE(saved.ok()) << saved.status();
  NamedParams copy = {{"head.weight", torch::zeros({3, 8}).requires_grad_()}};
  auto state = saved->StateFor(3, copy, {}, {{"head.weight", "1.weight"}});
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_TRUE(torch::equal(state->params.at("head.weight"), p[2].second));
  EXPECT_EQ(state->optimizer.count("head.weight.exp_avg"), 1u);
  // Without the alias it is in none of the files.
  auto missing = saved->StateFor(3, copy, {}, {});
  ASSERT_TRUE(absl::IsInvalidArgument(missing.status()));
  EXPECT_THAT(std::string(missing.status().message()),
              HasSubstr("stage 3: parameter 'head.weight' is in none of checkpoint"));
  // A buffer the files do not have is named too.
  auto no_buffer = saved->StateFor(3, {}, {{"bn.running_mean", torch::zeros({3})}}, {});
  ASSERT_TRUE(absl::IsInvalidArgument(no_buffer.status()));
  EXPECT_THAT(std::string(no_buffer.status().message()), HasSubstr("buffer 'bn.running_mean'"));
}

TEST_F(CheckpointByNameTest, ShardFilesWithoutALayoutOrIncompleteAreRefused) {
  NamedParams p = Mlp(6);
  auto opt = AdamW(Tensors(p));
  Step(p, *opt, 0);
  v1::ResumeTask resume;
  resume.set_directory(StepDir());
  WriteShardedStage(dir_.path(), 0, p, *opt, false, resume);
  auto old = CheckpointByName::Read(resume);
  ASSERT_TRUE(absl::IsDataLoss(old.status())) << old.status();
  EXPECT_THAT(std::string(old.status().message()), HasSubstr("keeps no shard layout"));
  EXPECT_THAT(std::string(old.status().message()), HasSubstr("stage-0.optimizer-0-of-2.pt"));
  // Replica 1's shard left out.
  resume.mutable_files()->RemoveLast();
  auto incomplete = CheckpointByName::Read(resume);
  ASSERT_TRUE(absl::IsDataLoss(incomplete.status())) << incomplete.status();
  EXPECT_THAT(std::string(incomplete.status().message()), HasSubstr("stage-0.optimizer-1-of-2.pt"));
}

}  // namespace
}  // namespace stagecoach::runtime::checkpoint_by_name_test
