#include "worker/runtime/training_data.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>

#include "absl/strings/str_cat.h"

namespace stagecoach::runtime {
namespace {

torch::Tensor Randn(std::vector<int64_t> shape, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  return torch::randn(shape, gen, torch::kFloat32);
}

class SyntheticSource : public BatchSource {
 public:
  SyntheticSource(const spec::JobSpec& spec, bool want_inputs, bool want_targets)
      : spec_(spec), want_inputs_(want_inputs), want_targets_(want_targets) {}

  absl::StatusOr<Batch> Make(int64_t step) override {
    const auto& sizes = spec_.model.builtin->sizes;
    const int64_t in = sizes.front();
    const int64_t out = sizes.back();
    const int64_t rows = spec_.training.batch_size;
    const uint64_t seed = spec_.data.seed;
    torch::NoGradGuard no_grad;
    Batch batch;
    if (!want_inputs_ && !want_targets_) return batch;
    torch::Tensor x = Randn({rows, in}, seed + 1 + static_cast<uint64_t>(step));
    if (want_inputs_) batch.inputs = x;
    if (want_targets_) {
      torch::Tensor teacher = Randn({in, out}, seed) / std::sqrt(static_cast<double>(in));
      torch::Tensor logits = torch::matmul(x, teacher);
      if (spec_.training.loss == "cross_entropy") {
        batch.targets = logits.argmax(1);
      } else {
        batch.targets = torch::tanh(logits);
      }
    }
    return batch;
  }

 private:
  spec::JobSpec spec_;
  bool want_inputs_;
  bool want_targets_;
};

// A flat little-endian uint16 token file, read into memory once.
class TokensSource : public BatchSource {
 public:
  static absl::StatusOr<std::unique_ptr<BatchSource>> Open(const spec::JobSpec& spec,
                                                           bool want_inputs, bool want_targets) {
    const std::string& path = spec.data.path;
    const int64_t seq = spec.model.builtin->seq;
    const int64_t vocab = spec.model.builtin->vocab;
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      return absl::InvalidArgumentError(
          absl::StrCat("data.path: cannot open '", path, "': ", std::strerror(errno)));
    }
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in.bad()) {
      return absl::InvalidArgumentError(absl::StrCat("data.path: cannot read '", path, "'"));
    }
    if (bytes.size() % 2 != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("data.path: '", path, "' has an odd byte count (", bytes.size(),
                       "); a tokens file is flat little-endian uint16"));
    }
    const int64_t n = static_cast<int64_t>(bytes.size() / 2);
    if (n < seq + 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("data.path: '", path, "' holds ", n,
                       " tokens, fewer than model.builtin.seq + 1 = ", seq + 1));
    }
    std::vector<int64_t> tokens(n);
    for (int64_t i = 0; i < n; ++i) {
      const auto lo = static_cast<unsigned char>(bytes[2 * i]);
      const auto hi = static_cast<unsigned char>(bytes[2 * i + 1]);
      tokens[i] = static_cast<int64_t>(lo | (hi << 8));
      if (tokens[i] >= vocab) {
        return absl::InvalidArgumentError(
            absl::StrCat("data.path: '", path, "' token ", i, " is ", tokens[i],
                         ", not below model.builtin.vocab = ", vocab));
      }
    }
    return std::unique_ptr<BatchSource>(
        new TokensSource(spec, std::move(tokens), want_inputs, want_targets));
  }

  absl::StatusOr<Batch> Make(int64_t step) override {
    Batch batch;
    if (!want_inputs_ && !want_targets_) return batch;
    const int64_t n = static_cast<int64_t>(tokens_.size());
    const int64_t rows = spec_.training.batch_size;
    const int64_t seq = spec_.model.builtin->seq;
    at::Generator gen =
        at::detail::createCPUGenerator(spec_.data.seed + 1 + static_cast<uint64_t>(step));
    torch::Tensor starts = torch::randint(0, n - seq, {rows}, gen, torch::kInt64);
    torch::Tensor windows = torch::empty({rows, seq + 1}, torch::kInt64);
    const int64_t* start = starts.data_ptr<int64_t>();
    int64_t* out = windows.data_ptr<int64_t>();
    for (int64_t r = 0; r < rows; ++r) {
      std::copy_n(tokens_.data() + start[r], seq + 1, out + r * (seq + 1));
    }
    if (want_inputs_) batch.inputs = windows.slice(1, 0, seq).contiguous();
    if (want_targets_) batch.targets = windows.slice(1, 1, seq + 1).contiguous();
    return batch;
  }

 private:
  TokensSource(const spec::JobSpec& spec, std::vector<int64_t> tokens, bool want_inputs,
               bool want_targets)
      : spec_(spec),
        tokens_(std::move(tokens)),
        want_inputs_(want_inputs),
        want_targets_(want_targets) {}

  spec::JobSpec spec_;
  std::vector<int64_t> tokens_;
  bool want_inputs_;
  bool want_targets_;
};

class EmptySource : public BatchSource {
 public:
  absl::StatusOr<Batch> Make(int64_t) override { return Batch{}; }
};

}  // namespace

absl::StatusOr<std::unique_ptr<BatchSource>> BatchSource::Open(const spec::JobSpec& spec,
                                                               bool want_inputs,
                                                               bool want_targets) {
  const std::string family =
      spec.model.builtin.has_value() ? spec.model.builtin->family : std::string("torchscript");
  if (spec.data.kind == "synthetic") {
    if (family != "mlp") {
      return absl::InvalidArgumentError(absl::StrCat(
          "data.kind: synthetic data needs a built-in mlp model (model is ", family, ")"));
    }
    return std::unique_ptr<BatchSource>(new SyntheticSource(spec, want_inputs, want_targets));
  }
  if (spec.data.kind == "tokens") {
    if (family != "gpt") {
      return absl::InvalidArgumentError(absl::StrCat(
          "data.kind: tokens data needs a built-in gpt model (model is ", family, ")"));
    }
    if (spec.data.path.empty()) {
      return absl::InvalidArgumentError("data.path: required for data.kind tokens");
    }
    if (!want_inputs && !want_targets) return std::unique_ptr<BatchSource>(new EmptySource());
    return TokensSource::Open(spec, want_inputs, want_targets);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("data.kind: '", spec.data.kind, "' is not supported by this worker yet"));
}

absl::StatusOr<Batch> MakeBatch(const spec::JobSpec& spec, int64_t step, bool want_inputs,
                                bool want_targets) {
  auto source = BatchSource::Open(spec, want_inputs, want_targets);
  if (!source.ok()) return source.status();
  return (*source)->Make(step);
}

std::vector<torch::Tensor> SplitMicrobatches(const torch::Tensor& batch, int n) {
  return torch::tensor_split(batch, n, 0);
}

}  // namespace stagecoach::runtime
