#include "tests/support/reference_gpt.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <memory>

#include "absl/strings/str_cat.h"
#include "tests/support/reference_common.h"

namespace stagecoach::testing {
namespace {

class Gpt {
 public:
  explicit Gpt(const GptReferenceConfig& c) : c_(c) {
    for (const auto& [name, value] : c.initial) {
      p_[name] = value.detach().clone().to(torch::kFloat32).requires_grad_(true);
    }
  }

  torch::Tensor& P(const std::string& name) {
    auto it = p_.find(name);
    if (it == p_.end()) {
      ADD_FAILURE() << "the initial parameters have no " << name;
      static torch::Tensor none;
      return none;
    }
    return it->second;
  }

  std::vector<torch::Tensor> Parameters() {
    std::vector<torch::Tensor> out;
    for (auto& [name, p] : p_) out.push_back(p);
    return out;
  }
  const std::map<std::string, torch::Tensor>& named() const { return p_; }

  torch::Tensor Forward(const torch::Tensor& tokens) {
    const int64_t b = tokens.size(0), t = tokens.size(1), d = c_.d_model, h = c_.heads;
    torch::Tensor x =
        torch::embedding(P("embed.tok.weight"), tokens) + P("embed.pos.weight").slice(0, 0, t);
    for (int64_t l = 0; l < c_.layers; ++l) {
      const std::string n = absl::StrCat("blocks.", l, ".");
      torch::Tensor a = torch::layer_norm(x, {d}, P(n + "ln1.weight"), P(n + "ln1.bias"), 1e-5);
      torch::Tensor qkv = torch::linear(a, P(n + "attn.qkv.weight"), P(n + "attn.qkv.bias"));
      auto parts = qkv.chunk(3, -1);
      auto heads = [&](const torch::Tensor& y) {
        return y.reshape({b, t, h, d / h}).transpose(1, 2);
      };
      torch::Tensor scores = torch::matmul(heads(parts[0]), heads(parts[1]).transpose(-2, -1)) /
                             std::sqrt(static_cast<double>(d / h));
      const torch::Tensor causal = torch::ones({t, t}, torch::kBool).triu(1);
      scores = scores.masked_fill(causal, -std::numeric_limits<float>::infinity());
      torch::Tensor y = torch::matmul(torch::softmax(scores, -1), heads(parts[2]))
                            .transpose(1, 2)
                            .reshape({b, t, d});
      x = x + torch::linear(y, P(n + "attn.proj.weight"), P(n + "attn.proj.bias"));
      torch::Tensor m = torch::layer_norm(x, {d}, P(n + "ln2.weight"), P(n + "ln2.bias"), 1e-5);
      m = torch::gelu(torch::linear(m, P(n + "mlp.fc.weight"), P(n + "mlp.fc.bias")));
      x = x + torch::linear(m, P(n + "mlp.proj.weight"), P(n + "mlp.proj.bias"));
    }
    x = torch::layer_norm(x, {d}, P("norm.weight"), P("norm.bias"), 1e-5);
    return torch::linear(x, c_.tied ? P("embed.tok.weight") : P("head.weight"));
  }

 private:
  const GptReferenceConfig& c_;
  std::map<std::string, torch::Tensor> p_;
};

}  // namespace

GptReferenceResult TrainGptReference(const GptReferenceConfig& c) {
  Gpt gpt(c);
  EXPECT_EQ(c.initial.count("head.weight"), c.tied ? 0u : 1u);
  GptReferenceResult result;
  TrainDecoderOnSyntheticTokens(
      c, gpt.Parameters(), [&](const torch::Tensor& x) { return gpt.Forward(x); },
      /*bf16=*/false, &result.losses, &result.grad_norms);
  for (const auto& [name, p] : gpt.named()) result.params[name] = p.detach().clone();
  return result;
}

namespace {

// The sum of every counted position's cross-entropy in `b`, each document of a row run alone;
// and their count.
std::pair<torch::Tensor, int64_t> DocumentLossSum(Gpt& gpt, int64_t vocab, const DocumentBatch& b) {
  torch::Tensor sum = torch::zeros({});
  for (int64_t r = 0; r < b.inputs.size(0); ++r) {
    for (int64_t k = 0;; ++k) {
      const torch::Tensor at = b.segments[r].eq(k).nonzero().flatten();
      if (at.numel() == 0) break;
      const int64_t from = at[0].item<int64_t>(), to = at[-1].item<int64_t>() + 1;
      const torch::Tensor logits =
          gpt.Forward(b.inputs[r].slice(0, from, to).unsqueeze(0)).reshape({-1, vocab});
      const torch::Tensor y = b.targets[r].slice(0, from, to);
      const torch::Tensor counted = y.ne(kReferenceIgnored);
      const torch::Tensor per_position =
          -torch::log_softmax(logits, -1).gather(1, y.clamp_min(0).unsqueeze(1)).squeeze(1);
      sum = sum + per_position.masked_select(counted).sum();
    }
  }
  return {sum, b.targets.ne(kReferenceIgnored).sum().item<int64_t>()};
}

// The config's model with `params` (by name; with tied, no "head.weight" needed) as its initial
// parameters.
GptReferenceConfig WithParams(const GptReferenceConfig& config,
                              const std::map<std::string, torch::Tensor>& params) {
  GptReferenceConfig c = config;
  c.initial.clear();
  for (const auto& [name, value] : params) {
    if (!(c.tied && name == "head.weight")) c.initial[name] = value;
  }
  return c;
}

}  // namespace

GptReferenceResult TrainGptReferenceOnBatches(const GptReferenceConfig& c,
                                              const std::vector<DocumentBatch>& batches) {
  Gpt gpt(c);
  std::vector<torch::Tensor> params = gpt.Parameters();
  std::unique_ptr<torch::optim::Optimizer> opt;
  if (c.optimizer == "adamw") {
    opt = std::make_unique<torch::optim::AdamW>(
        params, torch::optim::AdamWOptions(c.lr).weight_decay(c.weight_decay));
  } else {
    opt = std::make_unique<torch::optim::SGD>(
        params, torch::optim::SGDOptions(c.lr).momentum(c.momentum).weight_decay(c.weight_decay));
  }
  GptReferenceResult result;
  for (const DocumentBatch& b : batches) {
    opt->zero_grad();
    const auto [sum, count] = DocumentLossSum(gpt, c.vocab, b);
    const torch::Tensor loss = sum / static_cast<float>(count);
    loss.backward();
    if (c.max_norm.has_value()) {
      result.grad_norms.push_back(torch::nn::utils::clip_grad_norm_(params, *c.max_norm));
    }
    opt->step();
    result.losses.push_back(loss.item<double>());
  }
  for (const auto& [name, p] : gpt.named()) result.params[name] = p.detach().clone();
  return result;
}

std::vector<int64_t> GreedyGptReference(const GptReferenceConfig& config,
                                        const std::map<std::string, torch::Tensor>& params,
                                        const std::vector<int64_t>& prompt, int n) {
  const GptReferenceConfig c = WithParams(config, params);
  Gpt gpt(c);
  return GreedyDecode([&](const torch::Tensor& x) { return gpt.Forward(x); }, prompt, n, c.seq);
}

double GptReferenceTokenLoss(const GptReferenceConfig& config,
                             const std::map<std::string, torch::Tensor>& params,
                             const std::vector<DocumentBatch>& batches) {
  torch::NoGradGuard no_grad;
  const GptReferenceConfig c = WithParams(config, params);  // Gpt keeps a reference to it
  Gpt gpt(c);
  double sum = 0;
  int64_t count = 0;
  for (const DocumentBatch& b : batches) {
    const auto [batch_sum, batch_count] = DocumentLossSum(gpt, config.vocab, b);
    sum += batch_sum.item<double>();
    count += batch_count;
  }
  return sum / static_cast<double>(count);
}

}  // namespace stagecoach::testing
