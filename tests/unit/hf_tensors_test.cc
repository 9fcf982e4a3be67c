// Parameters from and to safetensors (worker/model/hf_tensors.h): the files an independent
// writer made (tests/support/safetensors_ref.py) give LibTorch tensors of the stored values in
// the job's dtype (bf16 and f16 widened exactly, f32 rounded to bf16 as Tensor::to does); a
// wrong shape, a missing tensor or an integer tensor is refused naming the file and the tensor;
// and tensors written from LibTorch (a transposed one among them) read back bit for bit.
#include "worker/model/hf_tensors.h"

#include <cstdlib>
#include <filesystem>
#include <string>

#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/python.h"
#include "tests/support/temp_dir.h"

namespace stagecoach::model::hf_tensors_test {
namespace {

using ::testing::HasSubstr;

// The fixture's element i (safetensors_ref.py), as a float tensor of `shape`.
torch::Tensor Fixture(const std::vector<int64_t>& shape) {
  const torch::Tensor i = torch::arange(torch::tensor(shape).prod().item<int64_t>(), torch::kInt64);
  return ((i * 37) % 101 - 50).to(torch::kFloat32).reshape(shape);
}

TEST(HfTensors, ReadsAnIndependentWritersTensorsIntoTheJobsDtype) {
  if (!std::filesystem::exists(testing::kPython)) GTEST_SKIP() << testing::kPython;
  testing::TempDir dir;
  const std::string command =
      absl::StrCat(testing::kPython, " ", testing::TestDataDir(),
                   "/../support/safetensors_ref.py write ", dir.path(), " --shards 2");
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  auto model = safetensors::ModelDir::Open(dir.path());
  ASSERT_TRUE(model.ok()) << model.status();
  auto q = ReadParameter(*model, "model.layers.0.self_attn.q_proj.weight", {4, 4}, torch::kFloat32);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_TRUE(torch::equal(*q, Fixture({4, 4})));  // bf16 widened
  auto down =
      ReadParameter(*model, "model.layers.0.mlp.down_proj.weight", {3, 4}, torch::kFloat32);
  ASSERT_TRUE(down.ok()) << down.status();
  EXPECT_TRUE(torch::equal(*down, Fixture({3, 4})));  // f16 widened
  auto embed = ReadParameter(*model, "model.embed_tokens.weight", {5, 4}, torch::kBFloat16);
  ASSERT_TRUE(embed.ok()) << embed.status();
  EXPECT_EQ(embed->scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(*embed, Fixture({5, 4}).to(torch::kBFloat16)));
  auto norm = ReadParameter(*model, "model.norm.weight", {4}, torch::kFloat32);
  ASSERT_TRUE(norm.ok()) << norm.status();
  EXPECT_TRUE(torch::equal(*norm, Fixture({4})));
  auto empty = ReadParameter(*model, "empty", {0, 3}, torch::kFloat32);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->numel(), 0);

  auto wrong = ReadParameter(*model, "model.embed_tokens.weight", {4, 5}, torch::kFloat32);
  EXPECT_THAT(std::string(wrong.status().message()),
              HasSubstr("tensor 'model.embed_tokens.weight' has shape [5, 4], the model "
                        "expects [4, 5]"));
  EXPECT_THAT(std::string(wrong.status().message()), HasSubstr(".safetensors"));
  auto missing = ReadParameter(*model, "lm_head.weight", {5, 4}, torch::kFloat32);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("no tensor 'lm_head.weight'"));
  auto integer = ReadParameter(*model, "position_ids", {2, 3}, torch::kFloat32);
  EXPECT_THAT(std::string(integer.status().message()),
              HasSubstr("tensor 'position_ids' is I64, not a floating-point dtype"));
}

TEST(HfTensors, WrittenParametersReadBackBitForBit) {
  torch::manual_seed(3);
  const torch::Tensor w = torch::randn({6, 5});
  const torch::Tensor transposed = torch::randn({5, 7}).t();  // not contiguous
  const torch::Tensor half = torch::randn({3}).to(torch::kBFloat16);
  std::vector<torch::Tensor> holders(3);
  std::vector<safetensors::TensorToWrite> tensors;
  for (auto [name, t, i] : {std::tuple{"w", w, 0}, std::tuple{"t", transposed, 1},
                            std::tuple{"h", half, 2}}) {
    auto out = ParameterToWrite(name, t, &holders[i]);
    ASSERT_TRUE(out.ok()) << out.status();
    tensors.push_back(*out);
  }
  testing::TempDir dir;
  ASSERT_TRUE(safetensors::WriteModelDir(dir.path(), tensors, 64).ok());
  auto model = safetensors::ModelDir::Open(dir.path());
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_GT(model->files().size(), 1u);
  EXPECT_TRUE(torch::equal(*ReadParameter(*model, "w", {6, 5}, torch::kFloat32), w));
  EXPECT_TRUE(torch::equal(*ReadParameter(*model, "t", {7, 5}, torch::kFloat32), transposed));
  EXPECT_TRUE(torch::equal(*ReadParameter(*model, "h", {3}, torch::kBFloat16), half));
  torch::Tensor holder;
  auto ints = ParameterToWrite("i", torch::ones({2}, torch::kInt32), &holder);
  EXPECT_THAT(std::string(ints.status().message()), HasSubstr("parameter 'i' is Int"));
}

}  // namespace
}  // namespace stagecoach::model::hf_tensors_test
