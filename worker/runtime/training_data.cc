#include "worker/runtime/training_data.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cmath>

#include "absl/strings/str_cat.h"

namespace stagecoach::runtime {
namespace {

torch::Tensor Randn(std::vector<int64_t> shape, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  return torch::randn(shape, gen, torch::kFloat32);
}

}  // namespace

absl::StatusOr<Batch> MakeBatch(const spec::JobSpec& spec, int64_t step, bool want_inputs,
                                bool want_targets) {
  if (spec.data.kind != "synthetic") {
    return absl::InvalidArgumentError(
        absl::StrCat("data.kind: '", spec.data.kind, "' is not supported by this worker yet"));
  }
  if (!spec.model.builtin.has_value() || spec.model.builtin->family != "mlp") {
    return absl::InvalidArgumentError("data.kind: synthetic data needs a built-in mlp model");
  }
  const auto& sizes = spec.model.builtin->sizes;
  const int64_t in = sizes.front();
  const int64_t out = sizes.back();
  const int64_t rows = spec.training.batch_size;
  const uint64_t seed = spec.data.seed;
  torch::NoGradGuard no_grad;
  Batch batch;
  torch::Tensor x = Randn({rows, in}, seed + 1 + static_cast<uint64_t>(step));
  if (want_inputs) batch.inputs = x;
  if (want_targets) {
    torch::Tensor teacher = Randn({in, out}, seed) / std::sqrt(static_cast<double>(in));
    torch::Tensor logits = torch::matmul(x, teacher);
    if (spec.training.loss == "cross_entropy") {
      batch.targets = logits.argmax(1);
    } else {
      batch.targets = torch::tanh(logits);
    }
  }
  return batch;
}

std::vector<torch::Tensor> SplitMicrobatches(const torch::Tensor& batch, int n) {
  return torch::tensor_split(batch, n, 0);
}

}  // namespace stagecoach::runtime
